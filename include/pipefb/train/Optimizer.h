#pragma once
// Optimizers and the learning-rate schedule, built from TrainingOptions.
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "pipefb/config/Config.h"

namespace pipefb::train {

/// SGD with momentum (and weight decay) or Adam over `params`, at the base lr.
std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const config::TrainingOptions& options,
                                                       std::vector<torch::Tensor> params);

/// The learning rate at optimizer step `step` (0-based) of `totalSteps`: linear
/// warm-up over warmup_steps, then constant, cosine (to lr * min_lr_ratio) or step decay.
double learningRate(const config::TrainingOptions& options, int64_t step, int64_t totalSteps);

/// Sets the lr of every parameter group.
void setLearningRate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace pipefb::train
