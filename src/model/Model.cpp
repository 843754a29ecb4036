#include "pipefb/model/Model.h"

#include <ATen/autocast_mode.h>

#include <algorithm>

#include "Zoo.h"
#include "pipefb/common/Error.h"
#include "pipefb/model/ChunkedLoss.h"

namespace pipefb::model {

namespace {
thread_local at::Generator* tlsDropoutGen = nullptr;
// Note [Dropout streams]: the open DropoutKey.
thread_local bool tlsKeyOn = false;
thread_local uint64_t tlsKeySeed = 0;
thread_local int64_t tlsKeyMicrobatch = 0;
thread_local bool tlsWeightGradientsIntoGrad = false;

// Note [Weight gradients into .grad] in Model.h.
struct LinearFunction : torch::autograd::Function<LinearFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               bool inByOut) {
    ctx->save_for_backward({x, weight});
    // The parameter itself, for its .grad: a saved variable unpacks as another tensor
    // when saved-tensor hooks are open (an offloaded stash's, offload/SavedTensorHooks.h).
    ctx->saved_data["param"] = weight;
    const bool hasBias = bias.numel() > 0;  // see linear()
    ctx->saved_data["in_by_out"] = inByOut;
    ctx->saved_data["has_bias"] = hasBias;
    if (!inByOut) return torch::nn::functional::linear(x, weight, hasBias ? bias : torch::Tensor());
    auto sizes = x.sizes().vec();
    sizes.back() = weight.size(1);
    const auto rows = x.reshape({-1, weight.size(0)});
    return (hasBias ? torch::addmm(bias, rows, weight) : rows.mm(weight)).view(sizes);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1];
    const bool inByOut = ctx->saved_data["in_by_out"].toBool();
    const int64_t in = x.size(-1);
    const torch::Tensor g = grads[0].reshape({-1, grads[0].size(-1)});  // (rows, out)
    // Note [Autocast]: under bf16 the forward's product ran on bf16 casts of x and the
    // weight (autocast's linear); the backward's products do too, and autograd casts the
    // weight's and the bias's gradients to fp32 as it adds them into .grad.
    const auto dt = g.scalar_type();
    const bool cast = weight.scalar_type() != dt;
    const torch::Tensor w = cast ? weight.to(dt) : weight;
    torch::Tensor gx, gw, gb;
    if (ctx->needs_input_grad(0)) gx = (inByOut ? g.mm(w.t()) : g.mm(w)).view(x.sizes());
    if (ctx->needs_input_grad(1)) {
      const torch::Tensor rows = cast ? x.reshape({-1, in}).to(dt) : x.reshape({-1, in});
      // W (out, in): g^T x; W (in, out): x^T g, as addmm's backward makes them.
      const torch::Tensor param = ctx->saved_data["param"].toTensor();
      if (tlsWeightGradientsIntoGrad && param.grad().defined()) {
        torch::NoGradGuard noGrad;
        torch::Tensor into = param.grad();
        if (cast)  // a bf16 product into the fp32 .grad: no mixed-dtype addmm_
          into.add_(inByOut ? rows.t().mm(g) : g.t().mm(rows));
        else if (inByOut)
          into.addmm_(rows.t(), g);
        else
          into.t().addmm_(rows.t(), g);  // the same (in, out) product autograd makes
      } else {
        // g^T x, not (x^T g)^T: the transposed product is 2.7x slower on the CPU and leaves a
        // transposed gradient (vgg16/8's fc6 B, folded pipefb-sync: its device's busy time
        // rose 40% with it); addmm's own backward makes this one.
        gw = inByOut ? rows.t().mm(g) : g.t().mm(rows);
      }
    }
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) gb = g.sum(0);
    return {gx, gw, gb, torch::Tensor()};
  }
};
}  // namespace

WeightGradientsIntoGrad::WeightGradientsIntoGrad() : previous_(tlsWeightGradientsIntoGrad) {
  tlsWeightGradientsIntoGrad = true;
}

WeightGradientsIntoGrad::~WeightGradientsIntoGrad() { tlsWeightGradientsIntoGrad = previous_; }

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                     bool weightIsInByOut) {
  // A custom Function's tensor arguments must be defined (LibTorch 1.13 records each one's
  // device): no bias is an empty one.
  return LinearFunction::apply(x, weight, bias.defined() ? bias : weight.new_empty({0}),
                               weightIsInByOut);
}

DropoutStream::DropoutStream(uint64_t seed)
    : gen_(at::detail::createCPUGenerator(seed)), previous_(tlsDropoutGen) {
  tlsDropoutGen = &gen_;
}

DropoutStream::~DropoutStream() { tlsDropoutGen = previous_; }

DropoutKey::DropoutKey(uint64_t seed, int64_t microbatch)
    : previousOn_(tlsKeyOn), previousSeed_(tlsKeySeed), previousMicrobatch_(tlsKeyMicrobatch) {
  tlsKeyOn = true;
  tlsKeySeed = seed;
  tlsKeyMicrobatch = microbatch;
}

DropoutKey::~DropoutKey() {
  tlsKeyOn = previousOn_;
  tlsKeySeed = previousSeed_;
  tlsKeyMicrobatch = previousMicrobatch_;
}

// Note [Autocast]
Autocast::Autocast(const std::string& precision, c10::DeviceType device) : device_(device) {
  if (precision == "fp32") return;
  PIPEFB_ASSERT(precision == "bf16" || precision == "fp16", "Autocast at " << precision);
  on_ = true;
  previousEnabled_ = at::autocast::is_autocast_enabled(device);
  previousDtype_ = at::autocast::get_autocast_dtype(device);
  previousCache_ = at::autocast::is_autocast_cache_enabled();
  at::autocast::set_autocast_cache_enabled(false);
  at::autocast::set_autocast_enabled(device, true);
  at::autocast::set_autocast_dtype(device, precision == "bf16" ? at::kBFloat16 : at::kHalf);
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  if (!on_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, previousEnabled_);
  at::autocast::set_autocast_dtype(device_, previousDtype_);
  at::autocast::set_autocast_cache_enabled(previousCache_);
}

torch::Tensor runLayer(Layer& layer, torch::Tensor x) {
  if (!tlsKeyOn) return layer.forward(std::move(x));
  DropoutStream stream(dropoutSeed(tlsKeySeed, layer.index(), tlsKeyMicrobatch));
  return layer.forward(std::move(x));
}

uint64_t dropoutSeed(uint64_t seed, int layer, int64_t microbatch) {
  // splitmix64 over the three inputs: distinct streams for distinct (layer, microbatch).
  uint64_t z = seed ^ (0x9E3779B97F4A7C15ULL * (static_cast<uint64_t>(layer) + 1)) ^
               (0xBF58476D1CE4E5B9ULL * (static_cast<uint64_t>(microbatch) + 1));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

torch::Tensor dropout(const torch::Tensor& x, double p, bool training) {
  if (!training || p <= 0) return x;
  if (tlsDropoutGen == nullptr) return torch::dropout(x, p, training);
  if (p >= 1) return x * 0;
  torch::Tensor keep;
  {
    torch::NoGradGuard noGrad;
    keep = torch::empty_like(x).bernoulli_(1 - p, *tlsDropoutGen).div_(1 - p);
  }
  return x * keep;
}

torch::Tensor featureDropout(const torch::Tensor& x, double p, bool training) {
  if (!training || p <= 0) return x;
  if (tlsDropoutGen == nullptr) return torch::feature_dropout(x, p, training);
  if (p >= 1) return x * 0;
  // One draw per (sample, channel), as torch's feature dropout: (N, C, 1, ...).
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[0] = x.size(0);
  if (x.dim() > 1) shape[1] = x.size(1);
  torch::Tensor keep;
  {
    torch::NoGradGuard noGrad;
    keep = torch::empty(shape, x.options()).bernoulli_(1 - p, *tlsDropoutGen).div_(1 - p);
  }
  return x * keep;
}

Model::Model(ModelOptions options, std::vector<std::shared_ptr<Layer>> layers,
             std::vector<int64_t> sampleShape, torch::ScalarType inputDtype)
    : options_(std::move(options)),
      layers_(std::move(layers)),
      sampleShape_(std::move(sampleShape)),
      inputDtype_(inputDtype) {
  PIPEFB_ASSERT(!layers_.empty(), "a model needs at least one layer");
  for (size_t i = 0; i < layers_.size(); ++i) {
    PIPEFB_ASSERT(layers_[i] != nullptr, "null layer in " << options_.name);
    layers_[i]->index_ = static_cast<int>(i);
  }
}

torch::Tensor Model::forward(torch::Tensor x, size_t first, size_t last) const {
  last = std::min(last, layers_.size());
  PIPEFB_ASSERT(first <= last, "bad layer range [" << first << ", " << last << ")");
  for (size_t i = first; i < last; ++i) x = runLayer(*layers_[i], std::move(x));
  return x;
}

torch::Tensor Model::loss(const torch::Tensor& output, const torch::Tensor& target) const {
  // Classifier: (B,C) vs (B). gpt2: (B,T,V) vs (B,T), flattened to (B*T,V) vs (B*T).
  if (output.dim() > 2) {
    const auto flat = output.reshape({-1, output.size(-1)});
    if (options_.loss_chunk > 0)  // Note [Chunked loss]
      return chunkedCrossEntropy(flat, target.reshape({-1}), options_.loss_chunk);
    return torch::nn::functional::cross_entropy(flat, target.reshape({-1}));
  }
  return torch::nn::functional::cross_entropy(output, target);
}

namespace {

// Pre-order walk of each layer's modules: a module's own parameters, then its own
// buffers, then its children. That is the order of PyTorch's Module.state_dict().
template <typename Fn>
void walkState(const std::vector<std::shared_ptr<Layer>>& layers, bool withBuffers, Fn&& fn) {
  for (const auto& layer : layers) {
    for (const auto& m : layer->named_modules("", /*include_self=*/true)) {
      const std::string base = detail::joinKey(layer->keyPrefix(), m.key());
      for (const auto& p : m.value()->named_parameters(/*recurse=*/false)) {
        if (p.value().defined()) fn(detail::joinKey(base, p.key()), p.value());
      }
      if (!withBuffers) continue;
      for (const auto& b : m.value()->named_buffers(/*recurse=*/false)) {
        if (b.value().defined()) fn(detail::joinKey(base, b.key()), b.value());
      }
    }
  }
}

int64_t sumBytes(const std::vector<torch::Tensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts) {
    if (t.defined()) n += static_cast<int64_t>(t.nbytes());
  }
  return n;
}

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> Model::stateDict() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  walkState(layers_, true, [&](std::string k, const torch::Tensor& t) { out.emplace_back(k, t); });
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> Model::stateDict(size_t first,
                                                                    size_t last) const {
  last = std::min(last, layers_.size());
  PIPEFB_ASSERT(first <= last, "bad layer range [" << first << ", " << last << ")");
  const std::vector<std::shared_ptr<Layer>> some(layers_.begin() + first, layers_.begin() + last);
  std::vector<std::pair<std::string, torch::Tensor>> out;
  walkState(some, true, [&](std::string k, const torch::Tensor& t) { out.emplace_back(k, t); });
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> Model::namedParameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  walkState(layers_, false, [&](std::string k, const torch::Tensor& t) { out.emplace_back(k, t); });
  return out;
}

std::vector<torch::Tensor> Model::parameters() const {
  std::vector<torch::Tensor> out;
  walkState(layers_, false, [&](const std::string&, const torch::Tensor& t) { out.push_back(t); });
  return out;
}

std::vector<LayerInfo> Model::describe(int64_t batch) const {
  PIPEFB_ASSERT(batch >= 1, "describe needs batch >= 1, got " << batch);
  // Eval mode for the probe: BatchNorm must not update its running stats (and would
  // refuse a batch of 1 at 1x1 spatial size in training mode). Restored below.
  std::vector<bool> wasTraining;
  for (const auto& l : layers_) {
    wasTraining.push_back(l->is_training());
    l->eval();
  }
  torch::Device device = torch::kCPU;
  for (const auto& l : layers_) {
    auto ps = l->parameters();
    if (!ps.empty()) {
      device = ps.front().device();
      break;
    }
  }
  std::vector<int64_t> shape = {batch};
  shape.insert(shape.end(), sampleShape_.begin(), sampleShape_.end());

  std::vector<LayerInfo> infos;
  try {
    torch::NoGradGuard noGrad;
    torch::Tensor x = torch::zeros(shape, torch::TensorOptions().dtype(inputDtype_).device(device));
    for (const auto& l : layers_) {
      x = l->forward(x);
      LayerInfo info;
      info.name = l->name();
      info.param_bytes = sumBytes(l->parameters());
      info.buffer_bytes = sumBytes(l->buffers());
      info.output_shape = x.sizes().vec();
      info.output_bytes = static_cast<int64_t>(x.nbytes());
      infos.push_back(std::move(info));
    }
  } catch (...) {
    for (size_t i = 0; i < layers_.size(); ++i) layers_[i]->train(wasTraining[i]);
    throw;
  }
  for (size_t i = 0; i < layers_.size(); ++i) layers_[i]->train(wasTraining[i]);
  return infos;
}

void Model::train(bool on) {
  for (const auto& l : layers_) l->train(on);
}

void Model::to(torch::Device device) {
  for (const auto& l : layers_) l->to(device);
}

std::shared_ptr<Model> buildModel(const ModelOptions& options) {
  validate(options);
  const auto& n = options.name;
  if (n == "torchscript") return detail::buildTorchScript(options);
  if (n == "gpt2") {
    return std::make_shared<Model>(options, detail::buildGpt2(options),
                                   std::vector<int64_t>{options.input_size}, torch::kLong);
  }
  std::vector<int64_t> sample = {options.channels, options.input_size, options.input_size};
  detail::Layers layers;
  if (n == "vgg16") {
    layers = detail::buildVgg16(options);
  } else if (n == "alexnet") {
    layers = detail::buildAlexNet(options);
  } else if (n == "resnet50") {
    layers = detail::buildResNet50(options);
  } else if (n == "mlp") {
    layers = detail::buildMlp(options);
  } else {
    PIPEFB_ASSERT(false, "validate() let through model.name '" << n << "'");
  }
  return std::make_shared<Model>(options, std::move(layers), std::move(sample), torch::kFloat);
}

}  // namespace pipefb::model
