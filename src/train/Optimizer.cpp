#include "pipefb/train/Optimizer.h"

#include <cmath>

namespace pipefb::train {

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const config::TrainingOptions& o,
                                                       std::vector<torch::Tensor> params) {
  if (o.optimizer == "adam") {
    auto opts = torch::optim::AdamOptions(o.lr).betas({o.beta1, o.beta2}).weight_decay(
        o.weight_decay);
    return std::make_unique<torch::optim::Adam>(std::move(params), opts);
  }
  auto opts = torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay);
  return std::make_unique<torch::optim::SGD>(std::move(params), opts);
}

double learningRate(const config::TrainingOptions& o, int64_t step, int64_t totalSteps) {
  if (o.warmup_steps > 0 && step < o.warmup_steps)
    return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  if (o.lr_schedule == "cosine") {
    int64_t span = std::max<int64_t>(1, totalSteps - o.warmup_steps);
    double t = std::min(1.0, static_cast<double>(step - o.warmup_steps) / span);
    double floor = o.lr * o.min_lr_ratio;
    return floor + (o.lr - floor) * 0.5 * (1.0 + std::cos(M_PI * t));
  }
  if (o.lr_schedule == "step")
    return o.lr * std::pow(o.step_gamma, static_cast<double>((step - o.warmup_steps) / o.step_every));
  return o.lr;
}

void setLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    auto& options = group.options();
    if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options)) sgd->lr(lr);
    else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options)) adam->lr(lr);
  }
}

}  // namespace pipefb::train
