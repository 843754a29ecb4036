#pragma once
// The measured profiler (DESIGN.md, "Planner": profile -> costs -> solve). It is the only
// part of the planner that runs the model. Per layer, at the configured microbatch size
// (training.batch / pipeline.microbatches), it measures forward, backward and recompute
// time (medians of `repeats` runs after `warmup` runs) and, from the same at a second
// microbatch size, each pass's fixed time per pass (Note [Microbatch scaling] in
// LayerCost.h), output bytes, saved bytes and the
// working-set peak (through the tracking allocator, Note [Measured saved bytes]),
// parameter and gradient bytes, and optimizer-state bytes and step time (one optimizer
// per layer, built by train::makeOptimizer). The result is a planner::Profile, cached in
// a profile file (ProfileFile.h) whose key names the model, shapes and device.
//
// Note [Measured saved bytes]
// A layer's saved bytes are what its autograd graph keeps alive after F and before B,
// beyond the output it hands on. The profiler makes the layer's input a fresh tensor
// inside a MemoryScope on its own domain (for layers after the first, as a non-leaf:
// input + a zero scalar that requires grad, so no AccumulateGrad node holds the big
// tensor), runs F, drops its own handle on the input, and reads
//   saved = live after F - live before the input existed - output storage bytes.
// The input is therefore counted iff the graph saved it (conv and linear save their
// input; ReLU saves its result, which is the output and is not counted twice; max-pool
// keeps int64 indices). An output that is itself saved (in-place ReLU) is charged to the
// next layer's input, if that layer saves its input (ResNet's head does not: the cost model
// adds the rest, Note [Outputs kept between layers] in CostModel.h). At a stage boundary
// the sender's graph also keeps such an output (the last layer's in-place ReLU result)
// beside the receiver's copy: the profiler records it as savedOutputBytes (the output
// storage that dropping the last handle on the output, with its graph alive, leaves
// allocated), and the cost model charges it to every stash policy's stash that holds
// the graph, offload included (an offloaded vgg16/8 fc6 stash was copied back 32768
// bytes, fc6's output, above the plan's; plan_runs_test seed 1 instance 7). Likewise the
// input storage that dropping the last handle on the input, with the graph alive, leaves
// allocated is savedInputBytes: a checkpointed B recomputes on its stash, which its first
// layer's graph then holds (Note [Backward layer by layer] in CostModel.h).
// Working bytes: the larger of (peak during F - live after F) and (peak during B - live
// before B, with the output gradient allocated). B returns the parameters' gradients as
// fresh tensors, as the runtime's B does (torch::autograd::grad, Note [Gathered weight
// gradients] in CostModel.h), so the layer's own gradient is in its working set; added
// into .grad one tensor at a time instead, only the largest of them was, and the stages'
// B peaked above the plan by up to the rest of it (resnet50/8's last stage, layer4.0:
// measured 4085936 bytes against 4013760 planned; PlanRunsTest).
//
// Note [Analytic times in a measured profile]
// Times are the one part of a measured profile that is noise: two runs of pipefb_profile
// on one machine give other medians, and the planner, which picks the fastest plan that
// fits, then picks another cut, stage count or policy. The bytes are exact and repeat
// (the tracking allocator counts them, and a run holds what the profile measured). With
// `times = "analytic"` (pipefb_profile --times analytic) the profiler measures every
// byte as always and takes every time (F, B and recompute with their fixed parts, step,
// snapshot; B after a step = B) from the analytic roofline of the device spec named
// `device` (configs/devices, analyticProfile in AnalyticProfile.h), so the same config
// plans the same way on every run and machine, and the plan's memory is still what the
// runtime holds. The key's
// device says "times=analytic", so such a profile never stands in for a timed one. For
// tests that check plans against runs (PlanRunsTest, Note [Plans run as planned]).
//
// Threads: by default the profiling thread runs with at::set_num_threads(1), as the
// pipeline workers do (Note [Intra-op threads] in MemoryScope.h), so the times are those
// of one virtual device and the allocator attribution is exact.
#include <cstdint>
#include <string>

#include "pipefb/config/Config.h"
#include "pipefb/planner/LayerCost.h"

namespace pipefb::planner {

struct ProfilerOptions {
  int warmup = 2;              // unmeasured runs per layer before the timed ones
  int repeats = 5;             // timed runs per layer; each time is their median
  int threads = 1;             // intra-op threads while profiling (the pipeline workers use 1)
  std::string device = "cpu";  // the reference device's name in the profile and its key
  /// "measured" (medians) or "analytic" (Note [Analytic times in a measured profile]).
  std::string times = "measured";
  /// Bytes at every other microbatch size the planner may pick too (Note [Bytes at every
  /// microbatch] in LayerCost.h); false: at the profile's microbatch alone, for a plan at
  /// that size only (pipefb_train's fit check before its profile, Note [No fit before the
  /// profile] in src/tools/pipefb_train.cpp).
  bool otherSizes = true;

  /// Throws UserError naming the flag when a value is out of range.
  void validate() const;
};

/// The profile's cache-key parts for this config without running anything: model (the
/// analytic model key plus the optimizer, which sets the state bytes), device (with the
/// thread count when it is not 1), microbatch = training.batch / pipeline.microbatches.
Profile profileHeader(const config::Config& config, const ProfilerOptions& options);

/// Measures every layer. Installs the tracking allocator if needed (before the model is
/// built) and seeds torch from training.seed.
Profile measureProfile(const config::Config& config, const ProfilerOptions& options);

/// "profiles/<model>-mb<n>-<device>-<hash of the key>.yaml": the default cache file.
std::string defaultProfilePath(const Profile& header);

struct ProfileResult {
  Profile profile;
  std::string path;
  bool fromCache = false;  // read from `path` (same key) instead of measured
};

/// Reads `path` (default: defaultProfilePath) when it exists with the same key and
/// `force` is false; otherwise measures and writes it (creating its directory).
ProfileResult loadOrMeasureProfile(const config::Config& config, const ProfilerOptions& options,
                                   std::string path = "", bool force = false);

}  // namespace pipefb::planner
