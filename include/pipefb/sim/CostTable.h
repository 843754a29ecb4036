#pragma once
// What the simulator charges: compute seconds per stage, bytes per transfer and per
// resident buffer, and link speeds. Loaded from JSON (docs/pipefb_sim.md, "Cost file").
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace pipefb::sim {

/// Per stage. Times in seconds, sizes in bytes.
struct StageCosts {
  double forward = 1e-3;   // F(s,m)
  double backward = 2e-3;  // B(s,m), without recompute
  /// I(s,m) and W(s,m) (Note [Split backward] in schedules/Action.h); < 0: unset, see
  /// splitBackward(). Keys input_grad / weight_grad.
  double inputGrad = -1;
  double weightGrad = -1;
  double recompute = 1e-3;  // extra time of BR(s,m): re-running F from the checkpoint
  double step = 0;          // STEP (optimizer)
  double allReduce = 0;     // AR
  std::int64_t activationBytes = 1 << 20;  // SA/RA: the stage's output
  std::int64_t gradientBytes = 1 << 20;    // SG/RG: the gradient of the stage's input
  std::int64_t stashBytes = 4 << 20;       // graph stash (keep/offload)
  /// What the stash keeps between I and W (the inputs of the weight layers and their
  /// output gradients); < 0: unset, the whole stash (key deferred_bytes).
  std::int64_t deferredBytes = -1;
  std::int64_t checkpointBytes = 1 << 20;     // checkpoint stash (checkpoint kinds)
  std::int64_t weightVersionBytes = 8 << 20;  // one weight version: SW/RW, OFFW/PREW, stashes
  std::int64_t weightsBytes = 8 << 20;        // resident weights on F(s) and B(s)
  /// A split stage's forward device's weights (the half copy of an analytic half profile,
  /// Note [Half-precision weights on a device] in planner/CostModel.h); -1 = weightsBytes.
  std::int64_t forwardWeightsBytes = -1;
  std::int64_t gradsBytes = 8 << 20;            // resident grads on B(s)
  std::int64_t optimizerStateBytes = 16 << 20;  // resident optimizer state on B(s)
  std::int64_t workingSetBytes = 2 << 20;       // transient, while F/B runs
  /// Transient while F runs, on any device (a split stage's forward device holds only the
  /// forward working set, Note [Forward device memory] in planner/CostModel.h; the planner
  /// gives F's whole peak, the stash it builds included, Note [Forward peak]);
  /// -1 = workingSetBytes.
  std::int64_t forwardWorkingSetBytes = -1;
  std::int64_t stepWorkingBytes = 0;  // transient of STEP (optimizer_state), while it runs
  /// Transient while W runs, beside its own deferred stash (Note [What waits for W] in
  /// planner/CostModel.h); -1 = workingSetBytes.
  std::int64_t weightWorkingSetBytes = -1;

  double inputGradTime() const;
  double weightGradTime() const;
  std::int64_t deferredStashBytes() const {
    return deferredBytes >= 0 ? deferredBytes : stashBytes;
  }
};

/// Note [I and W costs]: the time of I and W from what a cost file or profile gives. Both
/// given: as given. One given: the other is backward minus it (at least 0). Neither: half of
/// backward each. The simulator's cost files and the planner's profiles both read it.
struct SplitBackward {
  double input = 0;
  double weight = 0;
};
SplitBackward splitBackward(double backward, double inputGrad, double weightGrad);

/// A one-way link. time(bytes) = latency + bytes / bandwidth; bandwidth 0 = unlimited.
struct LinkCost {
  double bandwidth = 0;  // bytes per second
  double latency = 0;    // seconds
  double transferTime(std::int64_t bytes) const {
    return bandwidth > 0 ? static_cast<double>(bytes) / bandwidth : 0.0;
  }
};

struct CostTable {
  std::vector<StageCosts> stages;
  LinkCost defaultLink;                           // device -> device
  std::map<std::pair<int, int>, LinkCost> links;  // (src, dst) overrides
  LinkCost defaultHostLink;                       // device <-> host pool (copy engine)
  std::map<int, LinkCost> hostLinks;              // per device overrides

  const LinkCost& link(int src, int dst) const;
  const LinkCost& hostLink(int device) const;
  int numStages() const { return static_cast<int>(stages.size()); }

  /// F = 1 ms, B = 2 ms, recompute = 1 ms, free communication, the byte defaults above.
  static CostTable uniform(int numStages);
  /// Parses the JSON cost file for `numStages` stages. Errors are pipefb::UserError naming
  /// `source` and the key.
  static CostTable fromJson(const std::string& text, int numStages,
                            const std::string& source = "<costs>");
  static CostTable load(const std::string& path, int numStages);
};

}  // namespace pipefb::sim
