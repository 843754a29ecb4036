#pragma once
// Dynamic loss scaling for training.precision: fp16 (issue 36), shared by the one-device
// trainer and the pipeline runtime.
//
// Note [Loss scaling]
// fp16 keeps 5 exponent bits: a gradient below 2^-24 flushes to zero. As torch.amp.GradScaler
// does, the backward is seeded with `scale` instead of 1 (the last stage's B; the one-device
// trainer's loss.backward), so every gradient between stages and every half-precision
// gradient inside a stage is `scale` times its value; .grad stays fp32 and holds the scaled
// sum. Before a step the fp32 .grad of every stage is checked:
//  - all finite: each stage multiplies its .grad by 1/scale (unscale) and steps; after
//    training.loss_scale_window such steps in a row the scale doubles;
//  - any inf or nan, on any stage: every stage skips the step, and the scale halves.
// Skipped or not, a step counts: the learning-rate schedule, the weight version and the
// checkpoint's step advance, as with GradScaler beside an lr scheduler.
// In the pipeline every stage must hear the verdict before any stage steps. A device checks
// its own stages at its first STEP of the iteration, once its backwards of the iteration
// have run (Note [Steps after the device's backwards] in schedules/Generators.cpp), and
// every STEP then waits until all stages were checked (PipelineEngine's execStep). The
// verdict of iteration k sets the scale iteration k+1's last stage seeds with; no backward
// of k+1 can start before it, since its forwards ran on weights stepped after it.
// Under pipefb_launch each rank that steps a stage checks its own and all-reduces a flag per
// stage with the others (PipelineEngine's stepGroup); a rank that only runs forwards takes
// no part. With pipeline.replicas, every replica's stepping ranks take part, and a device's
// ARs all run before its first STEP (Note [All-reduces before the steps] in schedules/
// DataParallel.h), so each checks the gradients every replica will step with: an overflow in
// any replica skips the step in all of them. Asynchronous schedules (pipedream,
// pipefb-async) are refused: each stage steps once per microbatch on a weight version of its
// own, so a verdict of every stage on one step would serialize the pipeline it exists to
// overlap.
// The state is in the checkpoint (manifest.json, "loss_scale"), so a resumed run scales as
// an uninterrupted one.
#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace pipefb::train {

struct LossScale {
  double scale = 65536.0;  // training.loss_scale: GradScaler's init_scale
  int64_t goodSteps = 0;   // steps in a row without an overflow, since the last change
  int64_t skipped = 0;     // steps skipped for an overflow, over the run
};

/// The state after a step whose gradients did (overflow) or did not overflow; `window` is
/// training.loss_scale_window (GradScaler's growth_interval). Growth 2, backoff 1/2.
LossScale afterStep(LossScale s, bool overflow, int64_t window);

/// afterStep for the verdict of optimizer step `step` (1-based, run-wide): `badStage` is the
/// first stage with a non-finite gradient (-1: none), named in the warning a skip logs.
LossScale afterVerdict(LossScale s, int badStage, int64_t window, int64_t step);

/// Whether every defined .grad of `params` is finite. Each is summed, which allocates no
/// gradient-sized mask (a plan does not charge one): a sum is inf or nan when an element is,
/// and a finite sum overflows only for gradients near fp32's largest, which skipping treats
/// as the overflow it nearly is.
bool gradsFinite(const std::vector<torch::Tensor>& params);

/// Multiplies every defined .grad of `params` by 1/scale, in place (GradScaler's unscale_).
void unscaleGrads(const std::vector<torch::Tensor>& params, double scale);

}  // namespace pipefb::train
