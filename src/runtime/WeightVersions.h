#pragma once
// Private to src/runtime: the runtime's weights. A stage's master, its forward copy (split
// stages) and its weight versions (asynchronous schedules) are replicas; copies come from
// a ShellPool. WeightVersions.cpp holds the actions on them: which version F and B see,
// versions kept across STEP, their offload (OFFW/PREW/DROPW), the prediction and the
// weight syncs (SW/RW). The schedule's side is pipefb/schedules/WeightVersions.h.
//
// Note [Weights, versions and replicas]
// A *replica* is one set of modules for the layers of a stage, with its tensors in one
// memory domain:
//  * the master: the model's own layers, moved to the stage's backward device, with
//    .grad and the stage's optimizer. Every gradient ends up in the master's .grad.
//  * a forward copy (split PipeFB stages): lives on the forward device, refreshed by
//    RecvWeights. RW copies in place when no stash still refers to the copy, and
//    otherwise builds a new copy, so a pending autograd graph keeps the version its
//    forward used (pipefb-async) until its backward released it.
//  * a weight version (asynchronous schedules): when F(s,m) and B(s,m) see different
//    weight versions (a STEP in between), F runs on a snapshot of the current
//    weights (same device) or the backward device keeps a snapshot of the version
//    before STEP (split stage with checkpoint), category weight_versions.
// Backward never accumulates into the replica it ran on: it asks autograd for the
// gradients w.r.t. the replica's parameters (torch::autograd::grad) and adds them to
// the master's .grad on the backward device. That is what lets the backward device's
// thread run a graph that the forward device built (DESIGN.md, "stash policy") with
// the weight gradients landing in, and charged to, the backward device.
// LibTorch modules cannot be cloned generically, so copies come from "shells": a
// throw-away buildModel() whose layers are cut into per-stage shells, their tensors
// freed until a replica fills them (ShellPool).
// Note [Weight prediction]
// pipefb-async's forward devices run iteration k on the weights of k-1 updates, so every
// gradient is one update stale; with Adam on a plain VGG that alone costs 10-40 accuracy
// points (experiments/README.md, async_convergence; experiments/delayed_adam.py shows the
// same in plain PyTorch). pipeline.weight_prediction: linear hands the forwards the
// linear extrapolation W[v] + (W[v] - W[v-1]) instead of W[v] (PipeMare, SpecTrain): the
// backward device computes it right after STEP from the weights before and after the step,
// in one replica (category weight_versions) that SyncWeights sends. Backwards differentiate
// at what their forward ran on (the forward copy's graph, or for checkpoint kinds the
// prediction kept as that version), so the gradients stay exact for the weights used.
// Version 0 (the initial weights) is never predicted.
//
// Note [Weight syncs]
// SyncWeights(s,k) hands the new weights of a split stage to its forward device:
// the prediction (Note [Weight prediction]), else the host master copy under
// optimizer offload, else the device master. Within one process the message carries
// references when the schedule is synchronous: the forward device's RecvWeights(s,k)
// comes before its forwards of iteration k+1, whose backwards come before STEP(s,k+1),
// so the weights cannot change before RW copied them. RW copies them tensor by tensor
// into the forward copy in place (H2D on its copy engine when they come from the host),
// so the forward device never holds a second full copy. Asynchronous schedules may step
// again before RW (async_lag): SYNC then sends a snapshot, charged as comm_buffers to
// the sender (its send buffer: the backward device, or the host pool under optimizer
// offload). When a pending graph still uses the forward copy, RW builds a new copy
// (Note [Weights, versions and replicas]); that is a second version, not a transient.
// Across processes the c10d receive buffer (comm_buffers) is still a full copy.
#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <vector>

#include "pipefb/common/MemoryCategory.h"
#include "pipefb/memory/DomainRegistry.h"
#include "pipefb/memory/MemoryScope.h"
#include "pipefb/model/Model.h"
#include "pipefb/runtime/Partition.h"

namespace pipefb::memory {
class MemoryDomain;
}

namespace pipefb::runtime {

using Tensor = torch::Tensor;

struct Shell {
  int stage = 0;
  std::vector<std::shared_ptr<model::Layer>> layers;
  std::vector<Tensor> params;
  std::vector<Tensor> buffers;
};

struct Replica {
  int stage = 0;
  int version = 0;
  std::vector<std::shared_ptr<model::Layer>> layers;
  std::vector<Tensor> params;
  std::vector<Tensor> buffers;
  std::unique_ptr<Shell> shell;  // null for the master

  Tensor forward(Tensor x) const {
    for (const auto& l : layers) x = model::runLayer(*l, x);  // Note [Dropout streams]
    return x;
  }
};
using ReplicaPtr = std::shared_ptr<Replica>;

void collectTensors(const std::vector<std::shared_ptr<model::Layer>>& layers,
                    std::vector<Tensor>& params, std::vector<Tensor>& buffers);

class ShellPool {
 public:
  ShellPool(model::ModelOptions options, std::vector<StageRange> partition, bool training)
      : options_(std::move(options)),
        partition_(std::move(partition)),
        training_(training),
        free_(partition_.size()) {}

  std::unique_ptr<Shell> acquire(int stage) {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_[stage].empty()) buildAll();
    auto s = std::move(free_[stage].back());
    free_[stage].pop_back();
    return s;
  }
  void release(std::unique_ptr<Shell> shell) {
    for (auto& t : shell->params) t.set_data(torch::empty({0}, t.options()));
    for (auto& t : shell->buffers) t.set_data(torch::empty({0}, t.options()));
    std::lock_guard<std::mutex> lock(mu_);
    free_[shell->stage].push_back(std::move(shell));
  }

 private:
  // Builds one model (outside every device: the unscoped domain), keeping the global RNG
  // as it was, and cuts it into one shell per stage.
  void buildAll() {
    memory::MemoryScope scope(memory::unscopedDomain(), MemoryCategory::Weights);
    auto gen = at::detail::getDefaultCPUGenerator();
    Tensor state;
    {
      std::lock_guard<std::mutex> g(gen.mutex());
      state = gen.get_state();
    }
    auto m = model::buildModel(options_);
    {
      std::lock_guard<std::mutex> g(gen.mutex());
      gen.set_state(state);
    }
    m->train(training_);
    for (size_t s = 0; s < partition_.size(); ++s) {
      auto shell = std::make_unique<Shell>();
      shell->stage = static_cast<int>(s);
      for (int64_t i = partition_[s].first; i < partition_[s].last; ++i)
        shell->layers.push_back(m->layer(static_cast<size_t>(i)));
      collectTensors(shell->layers, shell->params, shell->buffers);
      for (auto& t : shell->params) t.set_data(torch::empty({0}, t.options()));
      for (auto& t : shell->buffers) t.set_data(torch::empty({0}, t.options()));
      free_[s].push_back(std::move(shell));
    }
  }

  model::ModelOptions options_;
  std::vector<StageRange> partition_;
  bool training_;
  std::mutex mu_;
  std::vector<std::vector<std::unique_ptr<Shell>>> free_;
};

// A copy of `params`/`buffers` in `domain` under `category`, as a replica of `stage`.
// shareBuffers: the replica's buffers are `buffers` themselves (Note [Snapshots share
// buffers]).
ReplicaPtr makeReplica(const std::shared_ptr<ShellPool>& pool, int stage, int version,
                       const std::vector<Tensor>& params, const std::vector<Tensor>& buffers,
                       memory::MemoryDomain& domain, MemoryCategory category,
                       bool shareBuffers = false);

}  // namespace pipefb::runtime
