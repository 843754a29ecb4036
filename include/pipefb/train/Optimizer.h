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

namespace pipefb::train {

/// Per-parameter optimizer state keyed by parameter name (Note [Checkpoint layout] in
/// Checkpoint.h): "<name>/momentum_buffer" for sgd; "<name>/step", "<name>/exp_avg",
/// "<name>/exp_avg_sq" (and "<name>/max_exp_avg_sq") for adam. `names` maps the
/// optimizer's parameters (by identity) to their names; parameters without state yet
/// are left out.
std::vector<std::pair<std::string, torch::Tensor>> optimizerState(
    torch::optim::Optimizer& optimizer,
    const std::vector<std::pair<std::string, torch::Tensor>>& names);

/// Puts state from optimizerState() back into `optimizer`, whose parameters may be any
/// subset of the saved ones (another partition). New state tensors are allocated in the
/// caller's memory scope. Returns the entries used. A shape mismatch is a UserError
/// naming `source`.
int64_t loadOptimizerState(torch::optim::Optimizer& optimizer,
                           const std::vector<std::pair<std::string, torch::Tensor>>& names,
                           const std::vector<std::pair<std::string, torch::Tensor>>& state,
                           const std::string& source);

}  // namespace pipefb::train
