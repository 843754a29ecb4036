// Behaviour of the model zoo at small sizes: shapes, gradients, layer chaining (the
// pipeline cuts between layers), determinism, describe() and option errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "pipefb/common/Error.h"
#include "pipefb/model/Model.h"

namespace pipefb::model {
namespace {

struct Case {
  std::string label;
  ModelOptions options;
  size_t layers;  // layer count, the same at every width
};

ModelOptions image(const std::string& name, double width, int64_t size, int64_t channels,
                   int64_t classes) {
  ModelOptions o;
  o.name = name;
  o.width = width;
  o.input_size = size;
  o.channels = channels;
  o.num_classes = classes;
  return o;
}

ModelOptions gpt2Tiny(int64_t T = 16, int64_t V = 64) {
  ModelOptions o;
  o.name = "gpt2";
  o.size = "tiny";
  o.input_size = T;
  o.num_classes = V;
  return o;
}

std::vector<Case> smallCases() {
  ModelOptions mlp = image("mlp", 0.25, 28, 1, 10);
  mlp.hidden = {64, 32};
  return {
      {"vgg16", image("vgg16", 0.125, 32, 1, 10), 16},
      {"alexnet", image("alexnet", 0.125, 63, 3, 10), 8},
      {"resnet50", image("resnet50", 0.125, 32, 3, 10), 18},
      {"mlp", mlp, 3},
      {"gpt2", gpt2Tiny(), 4},
  };
}

torch::Tensor sampleInput(const Model& m, int64_t batch) {
  std::vector<int64_t> shape = {batch};
  shape.insert(shape.end(), m.sampleShape().begin(), m.sampleShape().end());
  if (m.inputDtype() == torch::kLong) return torch::randint(m.options().num_classes, shape);
  return torch::randn(shape);
}

torch::Tensor sampleTarget(const Model& m, int64_t batch) {
  if (m.inputDtype() == torch::kLong) {
    return torch::randint(m.options().num_classes, {batch, m.options().input_size});
  }
  return torch::randint(m.options().num_classes, {batch});
}

std::vector<int64_t> expectedOutputShape(const Model& m, int64_t batch) {
  if (m.options().name == "gpt2") return {batch, m.options().input_size, m.options().num_classes};
  return {batch, m.options().num_classes};
}

TEST(Zoo, ForwardBackwardEveryModel) {
  for (const auto& c : smallCases()) {
    SCOPED_TRACE(c.label);
    torch::manual_seed(1);
    auto model = buildModel(c.options);
    EXPECT_EQ(model->numLayers(), c.layers);
    const int64_t batch = 4;
    auto x = sampleInput(*model, batch);
    auto out = model->forward(x);
    EXPECT_EQ(out.sizes().vec(), expectedOutputShape(*model, batch));
    auto loss = model->loss(out, sampleTarget(*model, batch));
    ASSERT_EQ(loss.dim(), 0);
    ASSERT_TRUE(std::isfinite(loss.item<double>()));
    loss.backward();
    for (const auto& [key, p] : model->namedParameters()) {
      ASSERT_TRUE(p.grad().defined()) << key << " got no gradient";
      EXPECT_TRUE(torch::isfinite(p.grad()).all().item<bool>()) << key;
      EXPECT_GT(p.grad().abs().sum().item<double>(), 0.0) << key << " has an all-zero gradient";
    }
  }
}

TEST(Zoo, ChainedStagesEqualFullForward) {
  for (const auto& c : smallCases()) {
    SCOPED_TRACE(c.label);
    torch::manual_seed(2);
    auto model = buildModel(c.options);
    torch::NoGradGuard noGrad;
    auto x = sampleInput(*model, 3);
    auto full = model->forward(x);
    const size_t n = model->numLayers();
    for (size_t k : {size_t{1}, n / 2, n - 1}) {
      auto y = model->forward(model->forward(x, 0, k), k, n);
      EXPECT_TRUE(torch::equal(y, full)) << "cut at " << k;
    }
    // Three stages, one layer at a time.
    auto y = x;
    for (size_t i = 0; i < n; ++i) y = model->forward(y, i, i + 1);
    EXPECT_TRUE(torch::equal(y, full)) << "layer by layer";
    // An empty range is the identity.
    EXPECT_TRUE(torch::equal(model->forward(x, 1, 1), x));
  }
}

TEST(Zoo, SameSeedSameWeights) {
  for (const auto& c : smallCases()) {
    SCOPED_TRACE(c.label);
    torch::manual_seed(7);
    auto a = buildModel(c.options);
    torch::manual_seed(7);
    auto b = buildModel(c.options);
    torch::manual_seed(8);
    auto other = buildModel(c.options);
    auto sa = a->stateDict(), sb = b->stateDict(), so = other->stateDict();
    ASSERT_EQ(sa.size(), sb.size());
    bool anyDiffers = false;
    for (size_t i = 0; i < sa.size(); ++i) {
      EXPECT_EQ(sa[i].first, sb[i].first);
      EXPECT_TRUE(torch::equal(sa[i].second, sb[i].second)) << sa[i].first;
      anyDiffers = anyDiffers || !torch::equal(sa[i].second, so[i].second);
    }
    EXPECT_TRUE(anyDiffers) << "a different seed gave identical weights";
  }
}

TEST(Zoo, DescribeMatchesParametersAndForward) {
  for (const auto& c : smallCases()) {
    SCOPED_TRACE(c.label);
    torch::manual_seed(3);
    auto model = buildModel(c.options);
    const auto stateBefore = model->stateDict();
    std::vector<torch::Tensor> before;
    for (const auto& kv : stateBefore) before.push_back(kv.second.clone());

    const int64_t batch = 3;
    const auto infos = model->describe(batch);
    ASSERT_EQ(infos.size(), model->numLayers());

    int64_t paramBytes = 0, infoParamBytes = 0, stateBytes = 0, infoBufferBytes = 0;
    for (const auto& p : model->parameters()) paramBytes += p.nbytes();
    for (const auto& kv : stateBefore) stateBytes += kv.second.nbytes();
    for (const auto& info : infos) {
      infoParamBytes += info.param_bytes;
      infoBufferBytes += info.buffer_bytes;
    }
    EXPECT_EQ(infoParamBytes, paramBytes);
    EXPECT_EQ(infoBufferBytes, stateBytes - paramBytes);
    EXPECT_GT(paramBytes, 0);

    // Output shapes and bytes against a real forward (eval mode, as describe uses).
    model->train(false);
    {
      torch::NoGradGuard noGrad;
      auto x = sampleInput(*model, batch);
      for (size_t i = 0; i < model->numLayers(); ++i) {
        x = model->forward(x, i, i + 1);
        EXPECT_EQ(infos[i].name, model->layer(i)->name());
        EXPECT_EQ(infos[i].output_shape, x.sizes().vec()) << "layer " << i;
        EXPECT_EQ(infos[i].output_bytes, static_cast<int64_t>(x.nbytes())) << "layer " << i;
      }
      EXPECT_EQ(infos.back().output_shape, expectedOutputShape(*model, batch));
    }
    model->train(true);

    // describe() must not touch the state (BatchNorm running stats) or the mode.
    const auto stateAfter = model->stateDict();
    for (size_t i = 0; i < before.size(); ++i) {
      EXPECT_TRUE(torch::equal(before[i], stateAfter[i].second)) << stateAfter[i].first;
    }
    for (const auto& l : model->layers()) EXPECT_TRUE(l->is_training());
  }
}

TEST(Zoo, BnRunningStatsUpdateInTrainingOnly) {
  torch::manual_seed(4);
  auto model = buildModel(image("resnet50", 0.125, 32, 3, 10));
  auto find = [&](const std::string& key) {
    for (const auto& kv : model->stateDict())
      if (kv.first == key) return kv.second;
    ADD_FAILURE() << "no key " << key;
    return torch::Tensor();
  };
  torch::NoGradGuard noGrad;
  model->forward(torch::randn({2, 3, 32, 32}));
  EXPECT_EQ(find("bn1.num_batches_tracked").item<int64_t>(), 1);
  model->train(false);
  model->forward(torch::randn({2, 3, 32, 32}));
  EXPECT_EQ(find("bn1.num_batches_tracked").item<int64_t>(), 1);
}

TEST(Zoo, Gpt2NamesShapesAndCausality) {
  torch::manual_seed(5);
  const int64_t T = 8, V = 50;
  auto model = buildModel(gpt2Tiny(T, V));
  const int64_t D = 128;
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"transformer.wte.weight", {V, D}}, {"transformer.wpe.weight", {T, D}}};
  for (int i = 0; i < 2; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    std::vector<std::pair<std::string, std::vector<int64_t>>> block = {
        {h + "ln_1.weight", {D}},
        {h + "ln_1.bias", {D}},
        {h + "attn.c_attn.weight", {D, 3 * D}},
        {h + "attn.c_attn.bias", {3 * D}},
        {h + "attn.c_proj.weight", {D, D}},
        {h + "attn.c_proj.bias", {D}},
        {h + "ln_2.weight", {D}},
        {h + "ln_2.bias", {D}},
        {h + "mlp.c_fc.weight", {D, 4 * D}},
        {h + "mlp.c_fc.bias", {4 * D}},
        {h + "mlp.c_proj.weight", {4 * D, D}},
        {h + "mlp.c_proj.bias", {D}}};
    expected.insert(expected.end(), block.begin(), block.end());
  }
  expected.push_back({"transformer.ln_f.weight", {D}});
  expected.push_back({"transformer.ln_f.bias", {D}});
  expected.push_back({"lm_head.weight", {V, D}});
  const auto state = model->stateDict();
  ASSERT_EQ(state.size(), expected.size());
  for (size_t i = 0; i < state.size(); ++i) {
    EXPECT_EQ(state[i].first, expected[i].first);
    EXPECT_EQ(state[i].second.sizes().vec(), expected[i].second) << state[i].first;
  }

  // Initial loss is close to ln(V): the logits start near zero (std 0.02 init).
  auto idx = torch::randint(V, {2, T});
  auto out = model->forward(idx);
  const double loss = model->loss(out, torch::randint(V, {2, T})).item<double>();
  EXPECT_NEAR(loss, std::log(static_cast<double>(V)), 0.3);

  // Causal: changing the last token leaves every earlier position's logits alone.
  auto idx2 = idx.clone();
  idx2.index_put_({torch::indexing::Slice(), T - 1}, (idx.select(1, T - 1) + 1) % V);
  auto out2 = model->forward(idx2);
  using torch::indexing::Slice;
  EXPECT_TRUE(torch::allclose(out.index({Slice(), Slice(0, T - 1)}),
                              out2.index({Slice(), Slice(0, T - 1)})));
  EXPECT_FALSE(torch::allclose(out.index({Slice(), T - 1}), out2.index({Slice(), T - 1})));

  // Shorter sequences work (positions 0..T'-1); longer ones are a UserError.
  EXPECT_EQ(model->forward(torch::randint(V, {2, 3})).sizes().vec(),
            (std::vector<int64_t>{2, 3, V}));
  try {
    model->forward(torch::randint(V, {2, T + 1}));
    ADD_FAILURE() << "a sequence longer than model.input_size was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model.input_size"), std::string::npos) << e.what();
  }
}

TEST(Zoo, Gpt2SizesAndWidth) {
  // OpenAI sizes (layers, dim, heads), and the width rounding that keeps dim % heads == 0.
  struct Row {
    std::string size;
    int64_t layers, dim, heads;
  };
  for (const auto& r : std::vector<Row>{{"tiny", 2, 128, 4},
                                        {"small", 12, 768, 12},
                                        {"medium", 24, 1024, 16},
                                        {"large", 36, 1280, 20},
                                        {"xl", 48, 1600, 25}}) {
    ModelOptions o = gpt2Tiny();
    o.size = r.size;
    auto c = gpt2Config(o);
    EXPECT_EQ(c.n_layer, r.layers) << r.size;
    EXPECT_EQ(c.n_embd, r.dim) << r.size;
    EXPECT_EQ(c.n_head, r.heads) << r.size;
    o.width = 0.3;
    c = gpt2Config(o);
    EXPECT_EQ(c.n_embd % c.n_head, 0) << r.size;
    EXPECT_NEAR(static_cast<double>(c.n_embd), 0.3 * r.dim, c.n_head) << r.size;
  }
  ModelOptions o = gpt2Tiny();
  o.width = 0.001;  // still one dim per head
  EXPECT_EQ(gpt2Config(o).n_embd, 4);
  torch::manual_seed(6);
  auto model = buildModel(o);
  EXPECT_EQ(model->forward(torch::randint(64, {1, 16})).sizes().vec(),
            (std::vector<int64_t>{1, 16, 64}));
}

TEST(Zoo, Gpt2SmallParameterCount) {
  // HF GPT-2 small has 124,439,808 parameters with n_ctx 1024 and the head tied to
  // wte. Ours has an untied head (one more 50257 x 768 matrix).
  ModelOptions o;
  o.name = "gpt2";
  o.size = "small";
  o.input_size = 1024;
  o.num_classes = 50257;
  auto model = buildModel(o);
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  EXPECT_EQ(n, 124439808 + 50257 * 768);
  EXPECT_EQ(model->numLayers(), 14u);
}

TEST(Zoo, SmallInputsAndWidths) {
  // vgg16 / resnet50 keep torchvision's adaptive average pool, so 32 px works; alexnet
  // needs 63 px. Odd widths round and never reach 0 channels.
  for (const auto& o : {image("vgg16", 0.01, 32, 3, 7), image("resnet50", 0.01, 28, 1, 7),
                        image("resnet50", 0.05, 1, 1, 7), image("alexnet", 0.01, 63, 1, 7),
                        image("alexnet", 0.01, 100, 2, 7), image("mlp", 3.0, 5, 2, 7)}) {
    SCOPED_TRACE(o.name + " width " + std::to_string(o.width) + " size " +
                 std::to_string(o.input_size));
    torch::manual_seed(9);
    auto model = buildModel(o);
    model->train(false);
    torch::NoGradGuard noGrad;
    auto y = model->forward(torch::randn({2, o.channels, o.input_size, o.input_size}));
    EXPECT_EQ(y.sizes().vec(), (std::vector<int64_t>{2, 7}));
  }
}

TEST(Zoo, DropoutOnlyWhereAskedAndOnlyInTraining) {
  torch::manual_seed(10);
  ModelOptions o = image("vgg16", 0.125, 32, 1, 10);
  o.dropout = 0.5;
  auto model = buildModel(o);
  torch::NoGradGuard noGrad;
  auto x = torch::randn({2, 1, 32, 32});
  EXPECT_FALSE(torch::equal(model->forward(x), model->forward(x))) << "dropout 0.5 had no effect";
  model->train(false);
  EXPECT_TRUE(torch::equal(model->forward(x), model->forward(x)));
}

void expectUserError(const ModelOptions& o, const std::vector<std::string>& mentions) {
  try {
    buildModel(o);
    ADD_FAILURE() << "no UserError; expected one naming " << mentions.front();
  } catch (const UserError& e) {
    const std::string msg = e.what();
    for (const auto& m : mentions) EXPECT_NE(msg.find(m), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
  }
}

TEST(Zoo, BadOptionsNameTheKey) {
  ModelOptions o;
  o.name = "vgg17";
  expectUserError(o, {"model.name", "vgg17", "vgg16", "alexnet", "resnet50", "gpt2", "mlp"});

  o = image("vgg16", 0.0, 32, 1, 10);
  expectUserError(o, {"model.width", "> 0"});
  o.width = -1;
  expectUserError(o, {"model.width"});
  o.width = std::nan("");
  expectUserError(o, {"model.width"});

  o = gpt2Tiny();
  o.size = "huge";
  expectUserError(o, {"model.size", "huge", "tiny", "xl"});
  o = gpt2Tiny(0);
  expectUserError(o, {"model.input_size"});
  o = gpt2Tiny(16, 0);
  expectUserError(o, {"model.num_classes"});

  expectUserError(image("alexnet", 0.125, 62, 3, 10), {"model.input_size", "62", "63"});
  expectUserError(image("alexnet", 0.125, 28, 1, 10), {"model.input_size", "63"});
  expectUserError(image("vgg16", 0.125, 31, 1, 10), {"model.input_size", "32"});
  expectUserError(image("resnet50", 0.125, 0, 1, 10), {"model.input_size"});
  expectUserError(image("resnet50", 0.125, 32, 0, 10), {"model.channels"});
  expectUserError(image("mlp", 1, 28, 1, 0), {"model.num_classes"});

  o = image("vgg16", 0.125, 32, 1, 10);
  o.dropout = 1.0;
  expectUserError(o, {"model.dropout"});
  o.dropout = -0.1;
  expectUserError(o, {"model.dropout"});

  o = image("mlp", 1, 28, 1, 10);
  o.hidden = {32, 0};
  expectUserError(o, {"model.hidden", "entry 1"});

  // validate() is the same check, usable without building.
  o.hidden = {32};
  EXPECT_NO_THROW(validate(o));
  EXPECT_EQ(minInputSize("alexnet"), 63);
  EXPECT_EQ(minInputSize("vgg16"), 32);
}

}  // namespace
}  // namespace pipefb::model

namespace pipefb::model {
namespace {

double stdOf(const Model& m, const std::string& key) {
  for (const auto& kv : m.stateDict())
    if (kv.first == key) return kv.second.std().item<double>();
  ADD_FAILURE() << "no key " << key;
  return 0;
}

TEST(Zoo, InitFollowsTorchvisionAndGpt2) {
  torch::manual_seed(11);
  // vgg16: conv kaiming_normal(fan_out, relu) -> std sqrt(2 / (out * 3 * 3)); linear N(0, 0.01).
  auto vgg = buildModel(image("vgg16", 0.5, 32, 3, 10));
  EXPECT_NEAR(stdOf(*vgg, "features.2.weight"), std::sqrt(2.0 / (32 * 9)),
              0.05 * std::sqrt(2.0 / (32 * 9)));
  EXPECT_NEAR(stdOf(*vgg, "classifier.3.weight"), 0.01, 0.0005);
  for (const auto& kv : vgg->stateDict()) {
    if (kv.first.size() > 5 && kv.first.substr(kv.first.size() - 5) == ".bias") {
      EXPECT_EQ(kv.second.abs().max().item<double>(), 0.0) << kv.first;
    }
  }
  // resnet50: BatchNorm weight 1, bias 0; conv kaiming fan_out.
  auto resnet = buildModel(image("resnet50", 0.5, 32, 3, 10));
  for (const auto& kv : resnet->stateDict()) {
    if (kv.first.find("bn") == std::string::npos &&
        kv.first.find("downsample.1") == std::string::npos)
      continue;
    if (kv.first.find(".weight") != std::string::npos) {
      EXPECT_TRUE(torch::equal(kv.second, torch::ones_like(kv.second))) << kv.first;
    } else if (kv.first.find(".bias") != std::string::npos) {
      EXPECT_TRUE(torch::equal(kv.second, torch::zeros_like(kv.second))) << kv.first;
    }
  }
  EXPECT_NEAR(stdOf(*resnet, "layer1.0.conv2.weight"), std::sqrt(2.0 / (32 * 9)),
              0.05 * std::sqrt(2.0 / (32 * 9)));
  // gpt2: N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 * n_layer)).
  auto gpt = buildModel(gpt2Tiny(64, 512));
  EXPECT_NEAR(stdOf(*gpt, "transformer.wte.weight"), 0.02, 0.001);
  EXPECT_NEAR(stdOf(*gpt, "transformer.h.0.attn.c_attn.weight"), 0.02, 0.001);
  EXPECT_NEAR(stdOf(*gpt, "transformer.h.1.mlp.c_proj.weight"), 0.01, 0.0005);
  EXPECT_NEAR(stdOf(*gpt, "lm_head.weight"), 0.02, 0.001);
}

// Note [Weight gradients into .grad]: model::linear's gradients are autograd's own, of
// torch::nn::functional::linear (W (out, in)) and of addmm on the rows (W (in, out),
// GPT-2's Conv1D), on a 3-d input; with a WeightGradientsIntoGrad open the weight's is
// added into its defined .grad (the bias's still accumulates), without it gathered.
TEST(Zoo, LinearGradientsIntoGradAreAutogradsOwn) {
  torch::manual_seed(3);
  for (const bool inByOut : {false, true}) {
    const torch::Tensor x0 = torch::randn({2, 5, 7}), gy = torch::randn({2, 5, 3});
    const torch::Tensor w0 = inByOut ? torch::randn({7, 3}) : torch::randn({3, 7});
    const torch::Tensor b0 = torch::randn({3});
    // The reference, through autograd's own nodes.
    auto rx = x0.clone().requires_grad_(true), rw = w0.clone().requires_grad_(true),
         rb = b0.clone().requires_grad_(true);
    auto ry = inByOut ? torch::addmm(rb, rx.reshape({-1, 7}), rw).view({2, 5, 3})
                      : torch::nn::functional::linear(rx, rw, rb);
    const auto ref = torch::autograd::grad({ry}, {rx, rw, rb}, {gy});
    // Gathered: fresh gradients, as autograd's.
    auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true),
         b = b0.clone().requires_grad_(true);
    const auto got = torch::autograd::grad({linear(x, w, b, inByOut)}, {x, w, b}, {gy});
    EXPECT_TRUE(torch::allclose(linear(x0, w0, b0, inByOut), ry.detach())) << inByOut;
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(torch::allclose(got[i], ref[i], 1e-5, 1e-6)) << i;
    // Into .grad: twice, on a defined .grad, the sum of both.
    w.mutable_grad() = torch::ones_like(w0);
    b.mutable_grad() = torch::ones_like(b0);
    for (int r = 0; r < 2; ++r) {
      WeightGradientsIntoGrad into;
      torch::autograd::backward({linear(x, w, b, inByOut)}, {gy}, false, false, {w, b, x});
    }
    const torch::Tensor grad = w.grad();
    EXPECT_TRUE(torch::allclose(grad, 1 + 2 * ref[1], 1e-5, 1e-5)) << inByOut;
    EXPECT_TRUE(torch::allclose(b.grad(), 1 + 2 * ref[2], 1e-5, 1e-5)) << inByOut;
    EXPECT_TRUE(torch::allclose(x.grad(), 2 * ref[0], 1e-5, 1e-5)) << inByOut;
    EXPECT_TRUE(grad.is_contiguous());
    // The guard is closed again: a gathered gradient, not an addition into .grad.
    const auto again = torch::autograd::grad({linear(x, w, b, inByOut)}, {w}, {gy});
    EXPECT_TRUE(torch::allclose(again[0], ref[1], 1e-5, 1e-6)) << inByOut;
    EXPECT_TRUE(torch::equal(w.grad(), grad)) << inByOut;
  }
}

}  // namespace
}  // namespace pipefb::model
