#pragma once
// What the solver knows about one layer, and a model's profile: the output of the
// profiler (measured) or of an analytic profile (FLOPs and bytes with a device spec).
// Torch-free (Note [Build layout]).
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pipefb/common/Precision.h"

namespace pipefb::planner {

/// One layer at the profile's microbatch size, on the profile's reference device.
/// Times are seconds per microbatch, bytes are per microbatch unless they are states.
struct LayerCost {
  std::string name;
  double forward = 0;    // F
  double backward = 0;   // B without recompute
  double recompute = 0;  // extra time of re-running F inside a checkpointed B
  /// Of forward, backward and recompute, the seconds per pass that do not scale with the
  /// microbatch (Note [Microbatch scaling]); 0 = not measured: all of it scales.
  double forwardFixed = 0;
  double backwardFixed = 0;
  double recomputeFixed = 0;
  double step = 0;  // optimizer step of this layer's parameters, per iteration
  /// B of the first microbatch after an optimizer step, the way the runtime's B on the
  /// master runs it: zero the stale gradients, then accumulate into .grad in place.
  /// Note [Backward after a step] in CostModel.h. 0 = not measured: use `backward`.
  double backwardAfterStep = 0;
  /// Copying the layer's parameters into fresh tensors (a PipeDream weight snapshot,
  /// Note [Weight snapshots] in CostModel.h).
  double snapshot = 0;
  std::int64_t outputBytes = 0;  // the activation this layer hands to the next
  std::int64_t savedBytes = 0;   // what autograd keeps for B (the graph stash)
  /// Of outputBytes, what the layer's own graph keeps too (an in-place ReLU's result: all
  /// of it); not in savedBytes. A stage's stash holds it with its last layer's graph
  /// whether or not the output itself is kept (Note [Measured saved bytes] in Profiler.h).
  std::int64_t savedOutputBytes = 0;
  /// Of savedBytes, the layer's input itself (a linear or conv layer saves it for its
  /// weight gradient): a checkpointed stage recomputes on its stashed input, so this much
  /// of its first layer's graph is the stash (Note [Backward layer by layer] in
  /// CostModel.h; measured as in Note [Measured saved bytes] in Profiler.h). 0 = not
  /// measured: the recomputed graph is charged whole beside the stash.
  std::int64_t savedInputBytes = 0;
  std::int64_t workingBytes = 0;  // transient peak while F or B runs, beyond the stash
  /// The same with B gathering the parameters' gradients (torch::autograd::grad: held as
  /// fresh tensors until B ends, Note [Gathered weight gradients] in CostModel.h) instead
  /// of adding each into .grad in place (workingBytes); -1 = not measured: use workingBytes.
  std::int64_t gatheredWorkingBytes = -1;
  /// Of workingBytes and gatheredWorkingBytes, the bytes that do not scale with the
  /// microbatch: the parameters' fresh gradients B makes (Note [Parameter-sized working
  /// sets]); 0 = not measured: all of it scales.
  std::int64_t workingFixedBytes = 0;
  std::int64_t gatheredWorkingFixedBytes = 0;
  /// Transient peak while F alone runs (a split stage's forward device runs no B); -1 = not
  /// measured: use workingBytes.
  std::int64_t forwardWorkingBytes = -1;
  /// Peak of F without autograd (a checkpointed stage's forward, Note [Forward without
  /// autograd] in CostModel.h) above what was live before: its input, its output and its
  /// temporaries. -1 = not measured: use the input, the output and forwardWorkingBytes.
  std::int64_t noGradForwardBytes = -1;
  /// What a split backward's I keeps of this layer for its W (Note [Split backward in the
  /// runtime] in model/SplitBackward.h): the gradients flowing into the layer's weight
  /// nodes (a linear or convolution layer: its output's; a GPT-2 block: eleven of its
  /// width per token), measured with the same I on an input that requires grad. -1 = not
  /// measured: the saved bytes and the output (Note [What waits for W] in CostModel.h).
  std::int64_t keptGradBytes = -1;
  /// Transient peak of this layer's optimizer step beyond its state (Adam's temporaries,
  /// e.g. exp_avg_sq.sqrt() / c, about 2x the largest parameter tensor); per iteration,
  /// not scaled by the microbatch. Note [Step working set] in CostModel.h.
  std::int64_t stepWorkingBytes = 0;
  std::int64_t paramBytes = 0;
  /// Buffers (BatchNorm's running statistics): resident beside the weights on every
  /// device that holds a copy of the layer, with no gradient and no optimizer state.
  std::int64_t bufferBytes = 0;
  std::int64_t gradBytes = 0;
  std::int64_t optimizerBytes = 0;
  /// Note [Half-precision weights on a device] (CostModel.h): of paramBytes, the half copy
  /// F and B run on, in an analytic profile at bf16 or fp16; 0 otherwise (fp32, and
  /// measured profiles, whose autocast keeps no such copy).
  std::int64_t halfCopyBytes = 0;
};

/// Note [Half-precision weights on a device]: the weights a split stage's forward device
/// holds, and the weights and gradients a backward device holds when the optimizer is in
/// the host pool; the host pool's share then (master copy, gradient buffer, states).
inline std::int64_t forwardParamBytes(const LayerCost& c) {
  return c.halfCopyBytes > 0 ? c.halfCopyBytes : c.paramBytes;
}
inline std::int64_t hostedGradBytes(const LayerCost& c) {
  return c.halfCopyBytes > 0 ? c.halfCopyBytes : c.gradBytes;
}
inline std::int64_t hostOptimizerBytes(const LayerCost& c) {
  return c.paramBytes - c.halfCopyBytes + c.gradBytes + c.optimizerBytes;
}

/// Note [Microbatch scaling]
/// A profile is taken at one microbatch size; the solver scales it to others. Activation
/// byte counts (output, saved, F's working set, input) scale linearly; parameter, gradient,
/// optimizer and step costs do not scale; B's working sets are affine, below (Note
/// [Parameter-sized working sets]). A pass's time is affine in the microbatch,
///   t(f x mb) = fixed + (t(mb) - fixed) x f,
/// where `fixed` is its per-pass cost that no sample adds to: kernel launches, dispatch,
/// and reading the weights once (a linear layer at one sample is a matrix-vector product
/// bound by the weight read). Scaling the whole time linearly under-estimated small
/// microbatches several-fold: vgg16/8 on one CPU thread measured F + B = 6.14 ms for the
/// whole model at microbatch 1 against 22.44 / 16 = 1.40 ms scaled down from microbatch
/// 16 (fc6: 3.28 ms against 0.79 ms), so the planner chose 64 microbatches of 1, predicted
/// 1048 samples/s and ran at 198. The measured profiler times every layer at a second
/// microbatch size too (2, or the batch when the profile's is 1 or 2; not 1: BatchNorm on
/// a 1x1 map needs two samples in training) and fits `fixed` from the two (fitFixedTime);
/// the analytic profile's fixed part is its device's layerOverhead. The fit is exact at
/// both sizes; between them it over-estimates a little (time is concave in the
/// microbatch: at microbatch 4, B 6.70 ms from a fit through 1 and 16 against 5.74 ms
/// measured), which errs toward fewer, larger microbatches rather than toward an
/// under-estimate.
/// Seconds of a pass that takes `time` at the profile's microbatch, `fixed` of it per
/// pass, at f x that microbatch.
inline double scaledTime(double time, double fixed, double f) { return fixed + (time - fixed) * f; }

/// Bytes of an activation (output, saved, working, input) that take `bytes` at the
/// profile's microbatch, at f x that microbatch, to the nearest byte (halves away from
/// zero): exactly std::llround(bytes x f), inline. The cost model rounds millions of these
/// per solve, and llround is a library call (Note [Planner speed] in CostModel.h). Exact:
/// for |x| < 2^63, t = trunc(x) converts back to double exactly and x - t is exact (x is
/// an integer above 2^52; below, |t| >= |x| / 2 or t = 0), so x - t is x's fraction.
inline std::int64_t scaledBytes(std::int64_t bytes, double f) {
  const double x = static_cast<double>(bytes) * f;
  const auto t = static_cast<std::int64_t>(x);
  const double fraction = x - static_cast<double>(t);
  return t + (fraction >= 0.5 ? 1 : 0) - (fraction <= -0.5 ? 1 : 0);
}

/// The fixed part of an affine fit through (mb, time) and (mb2, time2), mb != mb2, kept
/// in [0, time] (a noisy pair that implies a negative slope or intercept scales as a
/// whole, or not at all).
inline double fitFixedTime(double time, double mb, double time2, double mb2) {
  const double slope = (time - time2) / (mb - mb2);
  const double fixed = time - slope * mb;
  return fixed < 0 ? 0 : fixed > time ? time : fixed;
}

/// Note [Parameter-sized working sets]
/// B's working set holds the parameters' fresh gradients (added into .grad in place as
/// autograd makes each, or gathered until B ends: Note [Gathered weight gradients] in
/// CostModel.h), and those do not scale with the microbatch. Scaled whole, vgg16/8's fc6
/// (a 6.13 MiB weight) was charged 1/16 of its gradient at microbatch 1 from a profile at
/// 16: the planner's smallest budget for pipefb-sync and 1f1b with SGD, 64 microbatches,
/// was 18.79 MiB, and both runs went out of memory in fc6's B allocating 6.12 MiB (the
/// runtime asked for 24.54 MiB); at microbatch 64 it was charged 4 gradients, and a
/// decoupled pipefb-async plan's backward device peaked 22.6% below its plan. So the two
/// B working sets are affine in the microbatch too, like times, with the fixed part fitted
/// from the profiler's second microbatch size (fitFixedBytes); a profile of an older method
/// scales them whole. F's working sets, the saved bytes and the outputs are activations
/// and scale whole. The analytic profile's fixed parts are the fresh gradients autograd
/// makes (Note [Fresh gradients in the analytic profile] in AnalyticProfile.h).
/// Not every transient is affine: LibTorch's CPU convolution of one sample takes another
/// path with a column buffer (vgg16/8's conv1_2: B's working set 313632 bytes measured at
/// 1 sample, 15844 fitted from 16 and 2; conv1_1 to conv3_3 alike), so at microbatch 1 a
/// device of convolutions held 15.2% more than planned from a profile at 16 (1f1b, SGD,
/// 64 microbatches, cpu:0): the profiler measures every size, below (Note [Bytes at every
/// microbatch]), and the fit serves a size it could not run and older profiles.
/// Bytes that are `bytes` at the profile's microbatch, `fixed` of them per pass, at f x it.
inline std::int64_t scaledBytes(std::int64_t bytes, std::int64_t fixed, double f) {
  return fixed + scaledBytes(bytes - fixed, f);
}
/// The fixed part of an affine fit through (mb, bytes) and (mb2, bytes2), mb != mb2, kept
/// in [0, bytes].
inline std::int64_t fitFixedBytes(std::int64_t bytes, double mb, std::int64_t bytes2, double mb2) {
  const double fixed =
      fitFixedTime(static_cast<double>(bytes), mb, static_cast<double>(bytes2), mb2);
  return static_cast<std::int64_t>(std::llround(fixed));
}

/// Note [Bytes at every microbatch]
/// Scaling a profile's bytes to another microbatch size is exact only where they are
/// affine in it, and some transients are not (Note [Parameter-sized working sets]: a
/// one-sample convolution on the CPU takes a path with a column buffer). So the measured
/// profiler also runs every layer's memory passes at each other microbatch size the
/// planner may pick (each divisor of training.batch up to its largest microbatch count),
/// and keeps what they measured here. CostModel::at(size) plans such a size on the
/// profile measured there (profileAt: those bytes; the times scaled as ever), so a plan's
/// bytes are what the run holds whichever microbatch the planner chose. A size that could
/// not run (BatchNorm on a 1x1 map takes two samples) or an older profile scales.
struct LayerBytes {
  std::int64_t outputBytes = 0, savedBytes = 0, savedOutputBytes = 0, savedInputBytes = 0;
  std::int64_t workingBytes = 0, gatheredWorkingBytes = 0, forwardWorkingBytes = 0;
  std::int64_t noGradForwardBytes = 0;
  std::int64_t keptGradBytes = -1;
};
/// A profile's bytes at one microbatch size (Note [Bytes at every microbatch]).
struct MeasuredBytes {
  std::int64_t microbatch = 0;
  std::int64_t inputBytes = 0, targetBytes = 0, lossWorkingBytes = 0, recomputedLossBytes = 0;
  std::vector<LayerBytes> layers;
};

struct Profile {
  std::string model;                // cache key part: model name and options
  std::string device;               // the reference device the times were taken (or computed) for
  std::string source = "analytic";  // "analytic" | "measured"
  /// What the numbers are for: an analytic profile's Note [Half-precision training]
  /// (common/Precision.h), a measured one's Note [Autocast] (model/Model.h).
  Precision precision = Precision::FP32;
  std::int64_t microbatch = 1;   // samples per microbatch the numbers are for
  std::int64_t inputBytes = 0;   // the model input per microbatch (stage 0's checkpoint)
  std::int64_t targetBytes = 0;  // the loss targets per microbatch (on the last stage)
  /// The loss and the gradient of the model's output from it, as the last stage's B
  /// starts (Note [Backward layer by layer] in CostModel.h): the peak above the output and
  /// the targets, the gradient included. 0 = not measured (the analytic profile).
  std::int64_t lossWorkingBytes = 0;
  /// The loss as a recomputing last stage's B runs it (Note [Loss in the recomputed graph]
  /// in schedules/Lowering.h): taken on the output inside its graph, the output let go
  /// once the loss is computed, then autograd from the loss down to the output's gradient.
  /// The peak above what was live before the output was made: the output (until it is let
  /// go) and the output's gradient included. 0 = not measured (the analytic profile, whose
  /// head layer counts log_softmax's result in its saved bytes instead).
  std::int64_t recomputedLossBytes = 0;
  std::vector<LayerCost> layers;
  /// The bytes measured at other microbatch sizes (Note [Bytes at every microbatch]).
  std::vector<MeasuredBytes> bytesAt;

  int numLayers() const { return static_cast<int>(layers.size()); }
};

/// The layer's bytes as measured (Note [Bytes at every microbatch]).
LayerBytes bytesOf(const LayerCost& c);
/// `p` at `microbatch` samples (Note [Bytes at every microbatch]): its bytes measured there
/// and its times scaled there, or nullopt when nothing was measured at that size.
std::optional<Profile> profileAt(const Profile& p, std::int64_t microbatch);

}  // namespace pipefb::planner
