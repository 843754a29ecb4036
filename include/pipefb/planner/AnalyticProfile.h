#pragma once
// Analytic profiles: per-layer FLOPs and bytes of the zoo models computed from their
// options alone (no LibTorch, nothing allocated, so GPT-2 XL plans on a laptop), turned
// into a Profile with a device spec (Note [Analytic timing]).
//
// Note [Analytic timing]
// Per layer and sample, FP32: forward time = max(FLOPs / (peak x eff),
// bytes moved / (HBM x eff)) + the spec's per-layer overhead; backward = 2 x forward
// FLOPs (input and weight gradients); recompute = forward. The optimizer step reads and
// writes parameters, gradients and states: (2 + 2 x states-per-param) x param bytes... per
// step at HBM speed. Saved bytes count what autograd keeps (inputs of convs and linears,
// ReLU outputs, pooling indices, attention probabilities); working bytes are the
// largest transient (an output and its gradient). The numbers are estimates; a measured
// profile (pipefb_profile) replaces them where the hardware is at hand.
#include <cstdint>
#include <string>
#include <vector>

#include "pipefb/model/ModelOptions.h"
#include "pipefb/planner/DeviceSpec.h"
#include "pipefb/planner/LayerCost.h"

namespace pipefb::planner {

/// One layer's work per sample.
struct LayerWork {
  std::string name;
  double flops = 0;         // forward
  double bytesMoved = 0;    // forward, for the memory-bound roofline
  std::int64_t params = 0;  // parameter count (fp32)
  std::int64_t largestParam =
      0;  // elements of the largest parameter tensor (Note [Analytic step transient])
  /// Elements of the parameter gradients one autograd node makes at once, the most of any
  /// node of the layer (Note [Fresh gradients in the analytic profile]).
  std::int64_t freshGradient = 0;
  std::int64_t outputBytes = 0;
  std::int64_t savedBytes = 0;
  /// Per sample: what a split backward's I keeps for W (LayerCost::keptGradBytes). 0 for
  /// the model's first layer, which has no input gradient (stage 0's W runs from the
  /// output).
  std::int64_t keptGradBytes = 0;
  std::int64_t workingBytes = 0;  // per sample, beside the fresh gradients
  /// Per sample: F's peak without autograd, its input included (Note [Forward without
  /// autograd] in CostModel.h); < 0: input + output + workingBytes.
  std::int64_t noGradForwardBytes = -1;
  /// Elements of the largest convolution weight: the copy of it in the kernel library's
  /// layout that lives while the convolution runs, in F and in B (Note [Convolution
  /// weight layout]). Not per sample.
  std::int64_t weightLayout = 0;
  /// Bytes of the layer's buffers (BatchNorm's running statistics and its batch counter),
  /// resident beside the weights. Not per sample.
  std::int64_t bufferBytes = 0;
  /// Per sample: the parts of savedBytes, workingBytes and noGradForwardBytes that keep
  /// their width at bf16 and fp16 (Note [Half-precision training] in common/Precision.h):
  /// int64 indices and ids, the loss's fp32 log-softmax, the causal mask's bytes.
  std::int64_t savedWideBytes = 0, workingWideBytes = 0, noGradWideBytes = 0;
  /// Note [Chunked loss] (model/ChunkedLoss.h): the loss's fp32 softmax and its temporary
  /// over lossChunk rows of lossWidth classes, beside B's working set whatever the
  /// microbatch (0: no chunked loss).
  std::int64_t lossChunk = 0, lossWidth = 0;
};

struct ModelWork {
  std::string model;             // a key naming the model and the options that change its shapes
  std::int64_t inputBytes = 0;   // per sample
  std::int64_t targetBytes = 8;  // per sample: Model::loss's class id (gpt2: T token ids)
  std::vector<LayerWork> layers;
};

/// The zoo's layer chain for these options (same layers as model::buildModel).
ModelWork modelWork(const model::ModelOptions& options);

/// Note [Convolution weight layout]
/// LibTorch's CPU convolution (oneDNN) reorders its weight into the library's own layout
/// before it runs, in F and again in B, and holds that copy while it runs; B's fresh weight
/// gradient is beside it. So a layer with convolutions charges one copy of its largest
/// convolution weight in B's fixed part, beside the fresh gradients (Note [Fresh gradients
/// in the analytic profile]). Not in F yet: F's working set has no fixed part in a profile
/// (it scales with the microbatch, Note [Microbatch scaling]), and the copy charged there
/// at the analytic profile's microbatch of 1 grew 16-fold at 16 (the plans of issue 33
/// then doubled their budgets). A forward-only device of a convolution may so be
/// under-charged by one weight; no measured run has shown it. Measured (pipefb_profile,
/// LibTorch 2.11 CPU, microbatch 16): vgg16/8's conv5_1 (147712 parameter bytes) B fixed
/// 295424 bytes, F 163840 of which its activations 16384; resnet50/4's layer4.1 (its
/// 3x3 convolution 589824 bytes) B fixed 1174528, F 519168. Without it the analytic plans
/// of issue 33 went out of memory in B on a 576 KiB allocation (resnet50/4 on 4 devices:
/// 1f1b's last device 4.9% above its plan; decoupled pipefb-sync's device 1 5.7% above
/// the budget). On a GPU, cuDNN's workspace takes its place; the copy is a bound there.
///
/// Note [Fresh gradients in the analytic profile]
/// The runtime's B makes a parameter's gradient as a fresh tensor, whether it then adds it
/// into a defined .grad (in place, Note [In-place weight gradients] in
/// src/runtime/StageCompute.cpp: .grad is always defined there, zeroStaleGrads zeroes it
/// rather than dropping it) or gathers it (Note [Gathered weight gradients] in
/// CostModel.h); a linear layer's weight in place is the exception: model::linear adds it
/// straight into .grad (Note [Weight gradients into .grad] in model/Model.h). An autograd
/// node returns all its outputs at once (convolution_backward: the input's, the weight's
/// and the bias's gradients), and the engine runs each AccumulateGrad as soon as its
/// gradient is ready, so in place one node's fresh parameter gradients are live at a time,
/// beside the activations' gradients; gathering, all the layer's are by the time its B
/// ends. So B's working set in place is
///   workingBytes x microbatch + the largest node's fresh parameter gradients  (fixed),
/// and gathering  workingBytes x microbatch + all the layer's parameter gradients.
/// Both fixed parts do not scale with the microbatch (Note [Parameter-sized working sets]
/// in LayerCost.h). Measured with pipefb_profile (LibTorch 1.13 CPU, fitted from two
/// microbatch sizes): in place, a linear layer's is its bias (mlp 3072-512-256-4: 2048,
/// 1024 and 16 bytes; before model::linear, its weight too: 6293504, 525312, 4112); GPT-2's
/// embedding's is wte's and wpe's together ((V + T) x E, the largest left); its head's
/// 4E (ln_f's weight and bias and as much again of partial sums: gpt2-tiny 2048 bytes),
/// charged on a block too (measured E there: c_proj's bias, where the activations peak).
/// Gathering, every layer's is its parameters'.
/// The CPU convolution's backward keeps more than its weight's gradient (VGG16/16's
/// conv4_2: 73984 bytes fitted, weight and bias 36992), a column buffer of the CPU path
/// that a GPU's does not have; a measured profile has it. Uncharged, fresh gradients such
/// as VGG16's fc6 at 224 px (411 MB before model::linear) were missing from GPU plans.
///
/// Note [Analytic step transient]
/// What LibTorch 1.13's optimizers hold per parameter tensor p: `statesPerParam` state
/// tensors of p's size for good, and while p's update runs `stepTransients` temporaries of
/// p's size (Adam: exp_avg_sq.sqrt() and its quotient by sqrt(bias_correction2) before
/// the sqrt is freed; weight decay adds grad + wd * p to either optimizer). The step walks
/// the parameters one by one, so a layer's step transient is stepTransients x its largest
/// parameter tensor (LayerCost::stepWorkingBytes, Note [Step working set] in CostModel.h),
/// plus the 12 bytes of 0-dim scalar tensors an optimizer with state or temporaries makes.
/// Measured with pipefb_profile on VGG16 width 1/4, fc6 (weight 25,690,112 bytes):
/// Adam 51,380,236 (2 x), Adam with weight decay 77,070,348 (3 x), SGD with momentum 12,
/// SGD with momentum and weight decay 25,690,124 (1 x), SGD without momentum 0.
struct OptimizerMemory {
  int statesPerParam = 0;
  int stepTransients = 0;
};
/// "sgd": momentum -> 1 state, weight decay -> 1 transient; "adam": 2 states, 2 transients
/// (+1 with weight decay).
OptimizerMemory optimizerMemory(const std::string& optimizer, double momentum, double weightDecay);

/// At bf16 or fp16 (Note [Half-precision training] in common/Precision.h): activations at
/// 2 bytes an element but for the wide parts, weights at 6 bytes a parameter (fp32 master
/// and half copy), .grad and optimizer states fp32, FLOPs at the spec's half rate.
Profile analyticProfile(const ModelWork& work, std::int64_t microbatch, const DeviceSpec& device,
                        OptimizerMemory optimizer, Precision precision = Precision::FP32);

/// Compute speed of each device relative to the first, from the analytic time of the
/// whole model (forward + backward) on each spec.
std::vector<double> analyticSpeeds(const ModelWork& work, std::int64_t microbatch,
                                   const std::vector<DeviceSpec>& devices,
                                   Precision precision = Precision::FP32);

}  // namespace pipefb::planner
