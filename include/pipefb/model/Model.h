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

 private:
  std::string name_;
  std::string keyPrefix_;
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
// timing. So the runtime opens a DropoutStream around F(s,m) and around its recompute,
// seeded from (seed, stage, microbatch): the same masks every time, on any thread.
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

/// The seed of the dropout stream of (run seed, stage, microbatch).
uint64_t dropoutSeed(uint64_t seed, int stage, int64_t microbatch);

/// Inverted dropout (as torch::dropout) drawing from this thread's DropoutStream if one is
/// open, else from torch's global generator.
torch::Tensor dropout(const torch::Tensor& x, double p, bool training);

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
