#pragma once
// A model is a linear chain of layers, the partitionable units (DESIGN.md,
// "Concepts"). A stage is a contiguous range [first, last) of them.
//
// Note [Parameter names]
// Each Layer carries a key prefix (e.g. "features" or "layer2") and registers its
// submodules under the local names torchvision uses (e.g. "0", "3", "conv1"), so
// that prefix + "." + the LibTorch name is exactly the torchvision state_dict key
// ("features.0.weight", "layer2.0.downsample.1.running_mean"). A checkpoint of
// Model::stateDict() therefore loads into torchvision.models.vgg16() in Python.
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pipefb/model/ModelOptions.h"

namespace pipefb::model {

/// One partitionable unit: x -> layer(x).
class Layer : public torch::nn::Module {
 public:
  Layer(std::string name, std::string keyPrefix)
      : name_(std::move(name)), keyPrefix_(std::move(keyPrefix)) {}
  virtual torch::Tensor forward(torch::Tensor x) = 0;
  /// Short human name: "conv1_1", "block3", "head".
  const std::string& name() const { return name_; }
  /// Prefix of this layer's state_dict keys (may be empty). See Note [Parameter names].
  const std::string& keyPrefix() const { return keyPrefix_; }
  /// Its position in its model (set by Model): its dropout stream's (Note [Dropout streams]).
  int index() const { return index_; }

 private:
  friend class Model;
  std::string name_;
  std::string keyPrefix_;
  int index_ = 0;
};

/// What a model reports about one layer.
struct LayerInfo {
  std::string name;
  int64_t param_bytes = 0;
  int64_t buffer_bytes = 0;
  /// Output shape for the batch size passed to Model::describe (batch first).
  std::vector<int64_t> output_shape;
  int64_t output_bytes = 0;
};

class Model {
 public:
  Model(ModelOptions options, std::vector<std::shared_ptr<Layer>> layers,
        std::vector<int64_t> sampleShape, torch::ScalarType inputDtype);

  const ModelOptions& options() const { return options_; }
  size_t numLayers() const { return layers_.size(); }
  const std::shared_ptr<Layer>& layer(size_t i) const { return layers_.at(i); }
  const std::vector<std::shared_ptr<Layer>>& layers() const { return layers_; }

  /// Shape of one input sample (no batch dim): {C,H,W} for images, {T} for gpt2.
  const std::vector<int64_t>& sampleShape() const { return sampleShape_; }
  /// kFloat for images, kLong (token ids) for gpt2.
  torch::ScalarType inputDtype() const { return inputDtype_; }

  /// Runs layers [first, last) in order.
  torch::Tensor forward(torch::Tensor x, size_t first = 0, size_t last = SIZE_MAX) const;
  /// Mean cross-entropy of the model output against integer targets. For gpt2 the
  /// output is (B,T,V) and targets (B,T); for classifiers (B,C) and (B).
  torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const;

  /// torchvision-named parameters and buffers, in layer order.
  std::vector<std::pair<std::string, torch::Tensor>> stateDict() const;
  /// The same for layers [first, last) only.
  std::vector<std::pair<std::string, torch::Tensor>> stateDict(size_t first, size_t last) const;
  /// torchvision-named parameters only (no buffers).
  std::vector<std::pair<std::string, torch::Tensor>> namedParameters() const;
  std::vector<torch::Tensor> parameters() const;

  /// Per-layer parameter bytes and output shapes for a given batch size. Runs one
  /// forward pass without grad on zeros.
  std::vector<LayerInfo> describe(int64_t batch = 1) const;

  void train(bool on = true);
  void to(torch::Device device);

 private:
  ModelOptions options_;
  std::vector<std::shared_ptr<Layer>> layers_;
  std::vector<int64_t> sampleShape_;
  torch::ScalarType inputDtype_;
};

// Note [Dropout streams]
// Every dropout in the zoo goes through model::dropout. By default it draws from torch's
// global generator, as torch::dropout does. A pipeline runs stages on several threads and
// recomputes forwards (stash checkpoint): the global generator would give a recompute a
// different mask from its forward (wrong gradients) and make masks depend on thread
// timing. So whoever runs a microbatch opens a DropoutKey (run seed, microbatch): the
// runtime around F(s,m) and around its recompute, the one-device trainer around each
// microbatch. Each layer then runs inside a DropoutStream seeded from (seed, layer,
// microbatch) (runLayer): the same masks every time, on any thread, and under any
// partition, so a pipeline draws the masks of one-device training. (Seeded per stage
// before, the masks changed with the partition, and a pipeline could not be compared with
// one device under dropout.)
class DropoutStream {
 public:
  /// Dropout on this thread draws from a generator seeded with `seed` until destruction.
  explicit DropoutStream(uint64_t seed);
  ~DropoutStream();
  DropoutStream(const DropoutStream&) = delete;
  DropoutStream& operator=(const DropoutStream&) = delete;

 private:
  at::Generator gen_;
  at::Generator* previous_;
};

/// The seed of the dropout stream of (run seed, layer, microbatch).
uint64_t dropoutSeed(uint64_t seed, int layer, int64_t microbatch);

/// Note [Dropout streams]: while one is open on this thread, runLayer runs each layer in the
/// stream of (seed, the layer's index, microbatch).
class DropoutKey {
 public:
  DropoutKey(uint64_t seed, int64_t microbatch);
  ~DropoutKey();
  DropoutKey(const DropoutKey&) = delete;
  DropoutKey& operator=(const DropoutKey&) = delete;

 private:
  bool previousOn_;
  uint64_t previousSeed_;
  int64_t previousMicrobatch_;
};

/// Note [Autocast]
/// training.precision bf16 (and fp16, the same way with Note [Loss scaling] in
/// train/LossScaler.h) runs each forward and the loss under LibTorch's autocast on the
/// tensors' device type, as torch.autocast does: matmuls and convolutions in bf16, the
/// loss in fp32, the weights fp32 and cast per op, .grad fp32 (the cast's backward). So a
/// message, stash or offload holds whatever dtype its op gave: bf16 after a linear or a
/// convolution, fp32 after an op autocast keeps in fp32 or one that promotes (a residual
/// add of an fp32 stream). Every forward and loss of a step opens one: the trainer's, the
/// pipeline's F, B's recompute and the last stage's loss, so a pipeline computes what one
/// device does. fp32 opens nothing. Autocast's cache of weight casts is off: each op casts
/// what it uses and frees the cast unless autograd saves it, so a forward's bytes do not
/// depend on what ran before it in the scope (pipefb_profile measures each layer so). pipefb's
/// linear (model::linear) saves its input and its fp32 weight as they came and casts both again in
/// B, so it keeps no bf16 copy; aten's convolutions and matmuls save autocast's bf16 casts, so a
/// microbatch in flight holds a bf16 copy of its convolutions' weights. The analytic planner's
/// half-copy model (Note [Half-precision training] in common/Precision.h) charges neither exactly,
/// which is why pipefb_train refuses a bf16 plan so far; runs without a plan are not refused.
class Autocast {
 public:
  Autocast(const std::string& precision, c10::DeviceType device);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool on_ = false;
  c10::DeviceType device_;
  bool previousEnabled_ = false, previousCache_ = true;
  c10::ScalarType previousDtype_ = c10::ScalarType::BFloat16;
};

/// layer(x), in its dropout stream when a DropoutKey is open (Note [Dropout streams]).
torch::Tensor runLayer(Layer& layer, torch::Tensor x);

/// Inverted dropout (as torch::dropout) drawing from this thread's DropoutStream if one is
/// open, else from torch's global generator.
torch::Tensor dropout(const torch::Tensor& x, double p, bool training);
/// The same for channel dropout (nn.Dropout1d/2d/3d): one draw per sample and channel.
torch::Tensor featureDropout(const torch::Tensor& x, double p, bool training);

// Note [TorchScript models]
// model.name: torchscript loads model.path, a module torch.jit.save wrote (torch 2.11;
// python/pipefb_export.py writes one). Its layers are its top-level children in order (an
// nn.Sequential, or a module whose forward runs its children one after another: checked
// once at load against its own forward); a layer runs its child's scripted forward. Each
// layer registers its child's own parameters and buffers (the same tensors), under the
// child's name as key prefix, so Model::stateDict() has the keys of the Python module's
// state_dict; a module may instead carry `pipefb_key_prefixes`, a list of one prefix per
// child (the helper's torchvision exports: stem "" and "layer1.0", so that model.pt loads
// into torchvision's own class). The input is model.sample_shape of model.input_dtype; the
// loss is Model::loss. At load: every function of the module's compilation unit has its
// aten::dropout and aten::feature_dropout replaced by pipefb::dropout and
// pipefb::feature_dropout (Note [Dropout streams]: the thread's stream, so a recompute
// draws the masks of its forward), and any other random op is refused; each child must run
// on the previous child's output; no tensor may be in two children. The graph executor's
// optimisations are off: the interpreter runs each op as eager LibTorch, so autograd, the
// saved-tensor hooks of an offloaded stash and the memory domains see what they see for the
// zoo (no fused kernels, no graph-level autograd). Every parameter is trained.

// Note [Weight gradients into .grad]
// Autograd makes a linear layer's weight gradient as a fresh tensor (addmm's backward:
// input^T x output gradient) and AccumulateGrad then adds it into the defined .grad, so a
// B that accumulates in place (Note [In-place weight gradients] in
// src/runtime/StageCompute.cpp) held a weight-sized transient beside .grad: VGG16's fc6 at
// 224 px, 392 MiB (Note [Fresh gradients in the analytic profile] in
// planner/AnalyticProfile.h). Every linear layer of the zoo goes through model::linear,
// whose backward, while a WeightGradientsIntoGrad is open on the thread that runs it and
// the parameter's .grad is defined, adds the product straight into .grad (addmm_ with beta
// 1) and returns no weight gradient, so no transient exists (measured: VGG16 width 1/4,
// 1f1b on 2 devices, SGD, the classifier's device peaked at 115938232 bytes, now at
// 90248120, fc6's weight less). The sum is the same up to
// rounding: BLAS adds into .grad block by block over the rows (torch 1.13's CPU sgemm
// differs from mm then add_ in the last bits from about 1024 rows on; the pipeline
// equivalence tests' 1e-5 against one device hold). The context keeps the parameter
// itself for its .grad: under an offloaded stash's saved-tensor hooks a saved variable
// unpacks as another tensor. Otherwise (a B that gathers its gradients with autograd::grad,
// on a copy or into buckets, or plain loss.backward()) it returns the fresh gradient as
// autograd would. The bias's gradient (one row of sums) is returned fresh either way. The
// runtime opens one around B on the master's weights, the profiler around the B it
// measures so. LibTorch 1.13 runs a CPU graph's backward on the thread that calls it; a
// CUDA graph's runs on the device's own thread, where this flag would have to travel with
// the graph (a set of the parameters instead of a thread-local flag).
class WeightGradientsIntoGrad {
 public:
  WeightGradientsIntoGrad();
  ~WeightGradientsIntoGrad();
  WeightGradientsIntoGrad(const WeightGradientsIntoGrad&) = delete;
  WeightGradientsIntoGrad& operator=(const WeightGradientsIntoGrad&) = delete;

 private:
  bool previous_;
};

/// y = x W^T + b (weightIsInByOut = false: torch::nn::Linear's (out, in) weight, as
/// torch::nn::functional::linear) or y = x W + b (true: GPT-2's Conv1D, (in, out), as
/// torch::addmm on x's rows); x (..., in) -> y (..., out); bias may be undefined.
/// Note [Weight gradients into .grad].
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                     bool weightIsInByOut = false);

/// Builds a model from the zoo. Throws pipefb::UserError for an unknown name or a
/// bad option (naming the key and what is allowed). The weights are initialised
/// as torchvision / GPT-2 do, from torch's global RNG (seed it first).
std::shared_ptr<Model> buildModel(const ModelOptions& options);

}  // namespace pipefb::model
