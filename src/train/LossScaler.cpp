// Note [Loss scaling] (pipefb/train/LossScaler.h).
#include "pipefb/train/LossScaler.h"

#include <spdlog/spdlog.h>

#include <cmath>

namespace pipefb::train {

LossScale afterStep(LossScale s, bool overflow, int64_t window) {
  if (overflow) {
    s.scale *= 0.5;
    s.goodSteps = 0;
    ++s.skipped;
  } else if (++s.goodSteps >= window) {
    s.scale *= 2.0;
    s.goodSteps = 0;
  }
  return s;
}

LossScale afterVerdict(LossScale s, int badStage, int64_t window, int64_t step) {
  const LossScale next = afterStep(s, badStage >= 0, window);
  if (badStage >= 0)
    spdlog::warn(
        "step {}: fp16 gradients of stage {} are not finite; every stage skips the step, loss "
        "scale {} -> {}",
        step, badStage, s.scale, next.scale);
  return next;
}

bool gradsFinite(const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard noGrad;
  for (const auto& p : params)
    if (p.grad().defined() && !std::isfinite(p.grad().sum().item<double>())) return false;
  return true;
}

void unscaleGrads(const std::vector<torch::Tensor>& params, double scale) {
  torch::NoGradGuard noGrad;
  const double inverse = 1.0 / scale;
  for (const auto& p : params)
    if (p.grad().defined()) p.grad().mul_(inverse);
}

}  // namespace pipefb::train
