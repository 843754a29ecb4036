#include "pipefb/train/Optimizer.h"

#include <cmath>
#include <map>

#include "pipefb/common/Error.h"

namespace pipefb::train {

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const config::TrainingOptions& o,
                                                       std::vector<torch::Tensor> params) {
  if (o.optimizer == "adam") {
    auto opts =
        torch::optim::AdamOptions(o.lr).betas({o.beta1, o.beta2}).weight_decay(o.weight_decay);
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
    return o.lr *
           std::pow(o.step_gamma, static_cast<double>((step - o.warmup_steps) / o.step_every));
  return o.lr;
}

void setLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    auto& options = group.options();
    if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options))
      sgd->lr(lr);
    else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options))
      adam->lr(lr);
  }
}

}  // namespace pipefb::train

namespace pipefb::train {

namespace {
// LibTorch's optimizers key their per-parameter state by the parameter's TensorImpl.
void* keyOf(const torch::Tensor& p) { return p.unsafeGetTensorImpl(); }

const std::string* nameOf(const torch::Tensor& p,
                          const std::vector<std::pair<std::string, torch::Tensor>>& names) {
  for (const auto& [n, t] : names)
    if (t.unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) return &n;
  return nullptr;
}
}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> optimizerState(
    torch::optim::Optimizer& optimizer,
    const std::vector<std::pair<std::string, torch::Tensor>>& names) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  auto& state = optimizer.state();
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params()) {
      auto it = state.find(keyOf(p));
      if (it == state.end()) continue;
      const std::string* name = nameOf(p, names);
      PIPEFB_ASSERT(name != nullptr, "optimizer parameter without a name");
      if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
        if (sgd->momentum_buffer().defined())
          out.emplace_back(*name + "/momentum_buffer", sgd->momentum_buffer());
      } else if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
        out.emplace_back(*name + "/step", torch::tensor(adam->step(), torch::kLong));
        out.emplace_back(*name + "/exp_avg", adam->exp_avg());
        out.emplace_back(*name + "/exp_avg_sq", adam->exp_avg_sq());
        if (adam->max_exp_avg_sq().defined())
          out.emplace_back(*name + "/max_exp_avg_sq", adam->max_exp_avg_sq());
      }
    }
  return out;
}

int64_t loadOptimizerState(torch::optim::Optimizer& optimizer,
                           const std::vector<std::pair<std::string, torch::Tensor>>& names,
                           const std::vector<std::pair<std::string, torch::Tensor>>& saved,
                           const std::string& source) {
  std::map<std::string, torch::Tensor> byKey(saved.begin(), saved.end());
  auto& state = optimizer.state();
  int64_t used = 0;
  torch::NoGradGuard noGrad;
  auto take = [&](const std::string& key, const torch::Tensor& like) -> torch::Tensor {
    auto it = byKey.find(key);
    if (it == byKey.end()) return {};
    if (like.defined() && !it->second.sizes().equals(like.sizes()))
      throw UserError(source + ": optimizer state '" + key + "' has shape " +
                      c10::str(it->second.sizes()) + " but the parameter has " +
                      c10::str(like.sizes()) + "; resume with the model the run was made with");
    ++used;
    return it->second.clone();
  };
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params()) {
      const std::string* name = nameOf(p, names);
      PIPEFB_ASSERT(name != nullptr, "optimizer parameter without a name");
      if (dynamic_cast<torch::optim::SGD*>(&optimizer)) {
        torch::Tensor buf = take(*name + "/momentum_buffer", p);
        if (!buf.defined()) continue;
        auto st = std::make_unique<torch::optim::SGDParamState>();
        st->momentum_buffer(buf);
        state[keyOf(p)] = std::move(st);
      } else if (dynamic_cast<torch::optim::Adam*>(&optimizer)) {
        torch::Tensor step = take(*name + "/step", {});
        if (!step.defined()) continue;
        auto st = std::make_unique<torch::optim::AdamParamState>();
        st->step(step.item<int64_t>());
        st->exp_avg(take(*name + "/exp_avg", p));
        st->exp_avg_sq(take(*name + "/exp_avg_sq", p));
        if (!st->exp_avg().defined() || !st->exp_avg_sq().defined())
          throw UserError(source + ": optimizer state of '" + *name +
                          "' is incomplete (adam needs exp_avg and exp_avg_sq)");
        torch::Tensor mx = take(*name + "/max_exp_avg_sq", p);
        if (mx.defined()) st->max_exp_avg_sq(mx);
        state[keyOf(p)] = std::move(st);
      }
    }
  return used;
}

}  // namespace pipefb::train
