// Note [Autocast] (model/Model.h): training.precision bf16 and fp16 in the runtime. Every sync
// schedule and stash policy gives one device's weights at that precision; bf16 is really on
// (the weights differ from fp32's), and messages and stashes move at their real dtype. fp16
// scales its loss as one device does, and an overflow skips the step on every stage.
#include "Equivalence.h"

using namespace pipefb;
using namespace pipefb::test::equivalence;

namespace {

// The case at a precision.
Case at(const std::string& precision, Case c) {
  c.precision = precision;
  c.name += " " + precision;
  return c;
}
Case bf16(Case c) { return at("bf16", std::move(c)); }
Case fp16(Case c) { return at("fp16", std::move(c)); }

// Every sync layout: one stage per device, folded, interleaved.
std::vector<Layout> syncLayouts() {
  std::vector<Layout> layouts = kOneStagePerDevice;
  layouts.insert(layouts.end(), kFolded.begin(), kFolded.end());
  layouts.insert(layouts.end(), kInterleaved.begin(), kInterleaved.end());
  return layouts;
}

}  // namespace

TEST(PrecisionBf16, PipelinesGiveOneDevicesWeightsForEveryStashPolicy) {
  checkEquivalence(bf16({"mlp", mlpOptions(), 8}), {2, 4}, {2, 4}, kAllStashes, syncLayouts());
}

TEST(PrecisionBf16, VisionAndGpt2PipelinesGiveOneDevicesWeights) {
  checkEquivalence(bf16({"vgg16", visionOptions("vgg16"), 4}), {2}, {2}, kAllStashes);
  checkEquivalence(bf16({"resnet50", visionOptions("resnet50"), 4}), {2}, {2},
                   {"keep", "checkpoint"});
  checkEquivalence(bf16({"gpt2", gpt2Options(), 4}), {2, 3}, {2}, kAllStashes);
}

// bf16 is on: the same steps at fp32 give other weights (by far more than the 1e-5 the
// equivalence allows), and a stage's message is bf16 after a linear layer.
TEST(PrecisionBf16, ChangesTheNumbersAndSendsBf16Activations) {
  auto cfg = makeConfig(mlpOptions(), "1f1b", 2, 2, "keep", 8);
  Reference f32(cfg);
  cfg.training.precision = "bf16";
  Reference b16(cfg);
  for (int k = 0; k < 3; ++k) {
    auto b = makeBatch(*f32.model, 8, cfg.model.num_classes, 100 + k);
    f32.step(b, 3);
    b16.step(b, 3);
  }
  std::string worst;
  EXPECT_GT(maxRelErr(*b16.model, *f32.model, /*grads=*/false, &worst), 1e-4);
  // fp32 master weights and .grad.
  for (const auto& p : b16.model->parameters()) {
    EXPECT_EQ(p.scalar_type(), torch::kFloat32);
    EXPECT_EQ(p.grad().scalar_type(), torch::kFloat32);
  }
  // The first stage's output (what 1f1b sends on) is bf16 under autocast.
  auto x = makeBatch(*b16.model, 4, cfg.model.num_classes, 7).input;
  model::Autocast autocast("bf16", x.device().type());
  EXPECT_EQ(b16.model->forward(x, 0, 1).scalar_type(), torch::kBFloat16);
  model::Autocast half("fp16", x.device().type());
  EXPECT_EQ(b16.model->forward(x, 0, 1).scalar_type(), torch::kHalf);
}

// Note [Loss scaling] (train/LossScaler.h): fp16 under autocast with dynamic loss scaling.
namespace {

// Every stage's weights, in order, as copies.
std::vector<torch::Tensor> weightsOf(model::Model& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

// How many of the tensors a step changed.
int changed(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  int n = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) n += !torch::equal(a[i], b[i]);
  return n;
}

}  // namespace

// The decoupled layouts put several stages' backwards on one device, whose STEPs then wait
// for the verdict of stages it has yet to run without Note [Steps after the device's
// backwards].
TEST(PrecisionFp16, PipelinesGiveOneDevicesWeightsForEveryStashPolicy) {
  checkEquivalence(fp16({"mlp", mlpOptions(), 8}), {2, 4}, {2, 4}, kAllStashes, syncLayouts());
  checkEquivalence(fp16({"mlp", mlpOptions(), 8}), {3, 4}, {2, 4}, kAllStashes, kDecoupled);
  checkEquivalence(fp16({"gpt2", gpt2Options(), 4}), {2, 3}, {2}, {"keep", "offload"},
                   {"1f1b", {"pipefb-sync", true}, "zb-h1"});
}

// A scale so large that fp16 gradients overflow: the first steps are skipped by every stage
// and the scale halves each time, until it fits; then it doubles after each window of good
// steps. The pipeline follows the one-device scaler step for step.
TEST(PrecisionFp16, OverflowingScaleBacksOffAsOneDeviceDoes) {
  for (const Layout& layout : {Layout("1f1b"), Layout::placed("pipefb-sync", "0/2 0/2 1/2 1/3")}) {
    SCOPED_TRACE(layout.name());
    const int S = layout.placement.empty() ? 3 : 4;
    auto cfg = makeConfig(mlpOptions(), layout.schedule, S, 2, "keep", 8);
    layout.apply(cfg);
    cfg.training.precision = "fp16";
    cfg.training.loss_scale = std::ldexp(1.0, 40);
    cfg.training.loss_scale_window = 2;
    constexpr int kIters = 40;
    Reference ref(cfg);
    auto model = buildSeeded(cfg.model);
    runtime::PipelineEngine engine(*model, cfg, quietOptions(kIters));
    for (int k = 0; k < kIters; ++k) {
      auto b = makeBatch(*model, 8, cfg.model.num_classes, 300 + k);
      ref.step(b, kIters);
      engine.step(b);
      EXPECT_EQ(engine.lossScale().scale, ref.scale.scale) << "iteration " << k;
      EXPECT_EQ(engine.lossScale().skipped, ref.scale.skipped) << "iteration " << k;
    }
    engine.finish();
    EXPECT_GE(ref.scale.skipped, 10);  // 2^40 does overflow
    EXPECT_LT(ref.scale.skipped, kIters);
    std::string worst;
    EXPECT_LE(maxRelErr(*model, *ref.model, /*grads=*/false, &worst), 1e-5) << worst;
  }
}

// The test: an inf forced into one stage's gradient (the stage on the device that
// checks last, and the first stage) makes every stage skip that step, and halves the scale;
// the next step is taken by all.
TEST(PrecisionFp16, ForcedOverflowOnOneStageSkipsTheStepOnEveryStage) {
  for (int poisoned : {0, 2}) {
    SCOPED_TRACE("stage " + std::to_string(poisoned));
    auto cfg = makeConfig(mlpOptions(), "pipefb-sync", 4, 2, "keep", 8);
    test::place(cfg, "0/2 0/2 1/2 1/3");  // stages 0..2 step on device 2
    cfg.training.precision = "fp16";
    auto model = buildSeeded(cfg.model);
    auto options = quietOptions(3);
    std::atomic<runtime::PipelineEngine*> self{nullptr};
    std::atomic<int> poisonedAt{0};
    options.beforeAction = [&](int d, int i) {
      if (!self) return;
      const auto& a = self.load()->schedule().devices[d][i];
      if (a.type != schedules::ActionType::Step || a.index != 1) return;
      if (d != self.load()->backwardDevice(poisoned)) return;
      // The stage's first parameter of its first layer: its .grad is the master's.
      const auto range = self.load()->partition()[poisoned];
      auto p = model->layer(static_cast<size_t>(range.first))->parameters().front();
      p.grad().view(-1)[0].fill_(std::numeric_limits<float>::infinity());
      ++poisonedAt;
    };
    runtime::PipelineEngine engine(*model, cfg, options);
    self = &engine;
    const double scale0 = engine.lossScale().scale;
    std::vector<std::vector<torch::Tensor>> after;
    after.push_back(weightsOf(*model));
    for (int k = 0; k < 3; ++k) {
      engine.step(makeBatch(*model, 8, cfg.model.num_classes, 400 + k));
      after.push_back(weightsOf(*model));
    }
    engine.finish();
    EXPECT_GT(poisonedAt.load(), 0);
    const int n = static_cast<int>(after[0].size());
    EXPECT_EQ(changed(after[0], after[1]), n);  // step 1: every stage steps
    EXPECT_EQ(changed(after[1], after[2]), 0);  // step 2: every stage skips
    EXPECT_EQ(changed(after[2], after[3]), n);  // step 3: every stage steps
    EXPECT_EQ(engine.lossScale().scale, scale0 / 2);
    EXPECT_EQ(engine.lossScale().skipped, 1);
    // A skipped step still counts (the lr schedule, the version).
    for (int s = 0; s < 4; ++s) EXPECT_EQ(engine.weightVersion(s), 3);
  }
}
