// Devices that hold two stages: folded pairs (Note [Folded pace]) and shared devices (Note
// [Shared devices] in CostModel.h).
#include "pipefb/schedules/SharedDevices.h"

#include <algorithm>

#include "CostModelDetail.h"
#include "pipefb/planner/CostModel.h"

namespace pipefb::planner {

using detail::heldTogether;
using detail::residentStashBytes;
using detail::scaled;

double CostModel::foldedLinkTime(const PipelineShape& shape, int a, int actLayer,
                                 int gradLayer) const {
  const double f = scale(shape);
  const Link& l = cluster_.link(shape.chain.at(a), shape.chain.at(a + 1));
  return l.time(scaled(inputBytes(actLayer), f)) + l.time(scaled(inputBytes(gradLayer), f));
}

double foldedDeviceTime(const StageEstimate& forwardPart, const StageEstimate& backwardPart) {
  return std::max(forwardPart.forwardCompute + backwardPart.backwardCompute,
                  forwardPart.forwardCopy + backwardPart.backwardCopy);
}

namespace {
// Note [Messages held together]: the most bytes of any one combination of messages that
// can wait together on the device of forwardPart's F and backwardPart's B.
std::int64_t messagesTogether(const std::vector<std::array<int, 3>>& combinations,
                              const StageEstimate& forwardPart, const StageEstimate& backwardPart) {
  std::int64_t most = 0;
  for (const auto& [activations, gradients, outputs] : combinations)
    most = std::max(most, activations * forwardPart.messages.activation +
                              gradients * backwardPart.messages.gradient +
                              outputs * backwardPart.messages.output);
  return most;
}
}  // namespace

std::int64_t foldedDeviceMemory(const StageEstimate& forwardPart,
                                const StageEstimate& backwardPart) {
  const int ws = index(MemoryCategory::WorkingSet), st = index(MemoryCategory::Stash);
  const CategoryBytes& f = forwardPart.forwardMemory;
  const CategoryBytes& b = backwardPart.backwardMemory;
  if (forwardPart.messages.together != nullptr && backwardPart.messages.together != nullptr) {
    // Note [Messages held together]: the messages charged at each phase are the most that
    // wait together at the device's compute starts (any; B's alone beside B), not the two
    // stages' counts summed. The rest as below.
    const std::int64_t inputsBesideF = forwardPart.inputsOnlyAtForward;
    const std::int64_t rest = total(f) - f[ws] - f[st] - forwardPart.messages.forward + total(b) -
                              b[ws] - backwardPart.messages.backward - inputsBesideF;
    const std::int64_t whileF =
        f[st] + f[ws] + inputsBesideF +
        messagesTogether(*forwardPart.messages.together, forwardPart, backwardPart);
    const std::int64_t whileB =
        std::max<std::int64_t>(0, f[st] - forwardPart.stashBytes) + b[ws] +
        messagesTogether(*forwardPart.messages.togetherAtBackward, forwardPart, backwardPart);
    return rest + std::max(whileF, whileB);
  }
  // Note [Folded pace]: the messages that wait at F starts only wait beside the forwards.
  const std::int64_t besideF =
      forwardPart.forwardCommOnlyAtForward + backwardPart.backwardCommOnlyAtForward;
  const std::int64_t both = total(f) - f[ws] - f[st] + total(b) - b[ws] - besideF;
  // Note [Folded pace]: while B runs, F is not building a stash; only the copies still
  // going out (Note [Offloads in flight]) stay beside B's working set.
  const std::int64_t whileF = f[st] + f[ws] + besideF;
  const std::int64_t whileB = std::max<std::int64_t>(0, f[st] - forwardPart.stashBytes) + b[ws];
  return both + std::max(whileF, whileB);
}

double CostModel::linksTime(const PipelineShape& shape,
                            const std::vector<std::pair<int, int>>& boundaries) const {
  const double f = scale(shape);
  struct Load {
    int from, to;
    double time;
  };
  std::vector<Load> load;  // a few links: a flat list
  auto add = [&](int from, int to, double t) {
    for (Load& l : load)
      if (l.from == from && l.to == to) return void(l.time += t);
    load.push_back({from, to, t});
  };
  for (const auto& [k, first] : boundaries) {
    const int a = shape.forwardDevice(k - 1), b = shape.forwardDevice(k);
    if (a == b) continue;  // the V's turn, or D = 1: handed over locally
    const std::int64_t bytes = scaled(inputBytes(first), f);
    add(a, b, cluster_.link(a, b).time(bytes));
    add(b, a, cluster_.link(b, a).time(bytes));
  }
  double out = 0;
  for (const Load& l : load) out = std::max(out, l.time);
  return out;
}

double sharedDeviceTime(const std::vector<HostedStage>& stages) {
  return sharedDeviceTime(stages.data(), stages.data() + stages.size());
}

double sharedDeviceTime(const HostedStage* first, const HostedStage* last) {
  double compute = 0, copy = 0, largest = 0;
  for (const HostedStage* h = first; h != last; ++h) {
    compute += h->estimate->forwardCompute;
    copy += h->estimate->forwardCopy;
    largest = std::max(largest, h->estimate->forwardCompute);
  }
  // Note [Balanced chunks]
  return std::max({compute, copy, static_cast<double>(last - first) * largest});
}

const std::vector<schedules::HeldAtStart>& stashesHeldTogether(const PipelineShape& shape,
                                                               int position) {
  return heldTogether(shape.kind, shape.stages, shape.microbatches, shape.lag()).at(position);
}

std::int64_t sharedDeviceMemory(const PipelineShape& shape, int position,
                                const std::vector<HostedStage>& stages) {
  return sharedDeviceMemory(stashesHeldTogether(shape, position), stages.data(),
                            stages.data() + stages.size());
}

std::int64_t sharedDeviceMemory(const std::vector<schedules::HeldAtStart>& held,
                                const HostedStage* first, const HostedStage* last) {
  const int st = index(MemoryCategory::Stash), ws = index(MemoryCategory::WorkingSet);
  std::int64_t states = 0;
  for (const HostedStage* h = first; h != last; ++h) {
    const CategoryBytes& m = h->estimate->backwardMemory;
    states += total(m) - m[st] - m[ws];
  }
  // Note [Stashes held together]: the stashes alive at a compute start, beside the working
  // set of the stage that starts (B's, I's or W's, without the step's excess).
  // Note [Step working set]: the shared kinds flush, and a device's STEPs come after its
  // last B or W, so a step's transient is charged beside the states alone. (Charged as
  // the stage's working set instead, beside the other stage's stashes, it had zbv's
  // device 0 (VGG16/4, conv1_1..conv4_3 and fc7..fc8) measure 11.1% below the plan: fc7's
  // Adam transient, 8.4 MB, charged beside conv1_1..conv4_3's three stashes.)
  std::int64_t peak = 0;
  for (const HostedStage* h = first; h != last; ++h)
    peak = std::max(peak, h->estimate->stepWorkingBytes);
  for (const schedules::HeldAtStart& n : held) {
    std::int64_t together = 0;
    for (const HostedStage* h = first; h != last; ++h) {
      const StageEstimate& e = *h->estimate;
      // Note [What waits for W]: a W's own stash is in its working set.
      const int own = h->stage == n.starting && n.weight ? 1 : 0;
      const int alive = std::min(n.alive[h->stage], e.residentStashes) - own;
      together += residentStashBytes(e, alive, std::min(alive, n.deferred[h->stage] - own));
      if (h->stage == n.starting)
        together += n.forward  ? e.forwardPeakBytes
                    : n.weight ? e.weightWorkingBytes
                               : e.backwardWorkingBytes;
    }
    peak = std::max(peak, together);
  }
  return states + peak;
}

}  // namespace pipefb::planner
