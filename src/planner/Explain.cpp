// Plans in words (Explain.h).
#include "pipefb/planner/Explain.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "pipefb/common/Size.h"

namespace pipefb::planner {

std::string formatSeconds(double s) {
  char buf[64];
  if (s >= 1)
    std::snprintf(buf, sizeof buf, "%.3f s", s);
  else if (s >= 1e-3)
    std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  return buf;
}

std::string layerRange(const Profile& p, int first, int last) {
  std::string out = "layers " + std::to_string(first) + "-" + std::to_string(last - 1);
  if (!p.layers[first].name.empty()) {
    out += " (" + p.layers[first].name;
    if (last - 1 > first) out += ".." + p.layers[last - 1].name;
    out += ")";
  }
  return out;
}

namespace {

std::string pad(std::string s, size_t w) {
  if (s.size() < w) s.append(w - s.size(), ' ');
  return s;
}
std::string lpad(std::string s, size_t w) {
  if (s.size() < w) s.insert(0, w - s.size(), ' ');
  return s;
}
std::string mem(std::int64_t b) { return b == 0 ? "-" : formatBytes(b); }
std::int64_t cat(const CategoryBytes& b, MemoryCategory c) { return b[index(c)]; }

std::string devices(const StagePlan& s) {
  if (s.forwardDevice == s.backwardDevice) return std::to_string(s.forwardDevice);
  return std::to_string(s.forwardDevice) + "/" + std::to_string(s.backwardDevice);
}

std::string breakdown(const CategoryBytes& b) {
  std::ostringstream o;
  bool first = true;
  for (MemoryCategory c : kAllMemoryCategories) {
    if (b[index(c)] == 0) continue;
    o << (first ? "" : ", ") << toString(c) << " " << formatBytes(b[index(c)]);
    first = false;
  }
  return o.str();
}

// Note [Decoupled search]: each range in words, which ranges of the other pass it meets,
// and what its device holds (Note [Decoupled devices]).
std::string decoupledRangesInWords(const CostModel& modelIn, const Plan& plan) {
  // Note [Bytes at every microbatch] (LayerCost.h): the model at this microbatch size.
  const CostModel& model = modelIn.at(plan.shape.microbatchSize);
  std::vector<StageEstimate> est;
  std::vector<int> cuts{0};
  for (const StagePlan& s : plan.stages) est.push_back(s.estimate), cuts.push_back(s.last);
  const std::vector<DecoupledRange> ranges = decoupledRanges(model, plan.shape, est, cuts);
  std::ostringstream o;
  const PipelineShape& sh = plan.shape;
  o << "decoupled: " << sh.forwardDevices << " forward device(s) feed " << sh.backwardDevices
    << " backward device(s); every segment's stash goes through the host pool\n";
  for (const DecoupledRange& r : ranges) {
    const char* pass = r.backward ? "backward" : "forward";
    o << "  " << pass << " range " << r.index << ": "
      << layerRange(model.profile(), r.firstLayer, r.lastLayer) << " on device " << r.device << ", "
      << (r.backward ? "B" : "F") << " " << formatSeconds(r.load.compute)
      << " per microbatch, holds " << formatBytes(r.load.memory() + r.boundary.bytes) << " ("
      << formatBytes(r.load.resident) << " of states and buffers, ";
    const DecoupledDevice::Held h = r.load.peak();
    if (r.backward)
      o << formatBytes(h.stashes) << " of stashes, " << formatBytes(h.working) << " of working set"
        << (h.versions > 0 ? " and " + formatBytes(h.versions) + " of kept weight versions" : "")
        << " at its fullest segment's B or STEP";
    else
      o << formatBytes(h.stashes) << " of stashes (built, and going out) and "
        << formatBytes(h.working) << " of working set at its fullest segment's F";
    if (r.boundary.bytes > 0)
      o << ", " << formatBytes(r.boundary.bytes)
        << (r.backward ? " of gradients or outputs that can wait"
                       : " of activations that can wait");
    o << "); " << (r.backward ? "fed by forward range" : "feeds backward range");
    bool first = true;
    for (const DecoupledRange& q : ranges) {
      if (q.backward == r.backward || q.lastLayer <= r.firstLayer || q.firstLayer >= r.lastLayer)
        continue;
      o << (first ? " " : ", ") << q.index << " (device " << q.device << ")";
      first = false;
    }
    o << "\n";
  }
  return o.str();
}

}  // namespace

std::string stageTable(const CostModel& modelIn, const Plan& plan, std::int64_t budget) {
  // Note [Bytes at every microbatch] (LayerCost.h): the model at this microbatch size.
  const CostModel& model = modelIn.at(plan.shape.microbatchSize);
  std::ostringstream o;
  const std::vector<std::pair<std::string, size_t>> cols = {
      {"stage", 5},  {"layers", 34}, {"dev F/B", 7},   {"policy", 18},  {"F/mb", 10},
      {"B/mb", 10},  {"pace", 10},   {"bound by", 24}, {"weights", 11}, {"grads+opt", 11},
      {"stash", 16}, {"work", 11},   {"total", 11}};
  for (auto& [n, w] : cols) o << pad(n, w) << " ";
  o << "\n";
  for (size_t k = 0; k < plan.stages.size(); ++k) {
    const StagePlan& s = plan.stages[k];
    const StageEstimate& e = s.estimate;
    const CategoryBytes& m = e.backwardMemory;  // the device with the states
    std::string stash = mem(cat(m, MemoryCategory::Stash));
    if (e.stashBytes > 0) {
      // (Stashes that wait for their W are larger, Note [What waits for W].)
      const int resident = splitsBackward(plan.shape.kind)
                               ? e.residentStashes
                               : static_cast<int>(cat(m, MemoryCategory::Stash) / e.stashBytes);
      stash += " (" + std::to_string(resident) + "/" + std::to_string(e.inFlight) + ")";
    }
    std::string pol = schedules::toString(s.policy);
    if (e.effective != s.policy) pol += "->" + std::string(schedules::toString(e.effective));
    if (s.optimizerOnHost) pol += " +opt@host";  // Note [Optimizer placement search]
    o << pad(std::to_string(k), 5) << " " << pad(layerRange(model.profile(), s.first, s.last), 34)
      << " " << pad(devices(s), 7) << " " << pad(pol, 18) << " "
      << pad(formatSeconds(e.forwardTime), 10) << " " << pad(formatSeconds(e.backwardTime), 10)
      << " " << pad(formatSeconds(e.time), 10) << " " << pad(toString(e.binding), 24) << " "
      << pad(mem(cat(m, MemoryCategory::Weights) + cat(m, MemoryCategory::WeightVersions)), 11)
      << " " << pad(mem(cat(m, MemoryCategory::Grads) + cat(m, MemoryCategory::OptimizerState)), 11)
      << " " << pad(stash, 16) << " " << pad(mem(cat(m, MemoryCategory::WorkingSet)), 11) << " "
      << pad(formatBytes(pipefb::planner::total(m)), 11) << "\n";
    if (!e.same && !plan.shape.decoupled())
      o << pad("", 5) << " " << pad("  forward device " + std::to_string(s.forwardDevice), 34)
        << " " << pad("", 7 + 18 + 10 + 10 + 10 + 24 + 6) << " "
        << pad(mem(cat(e.forwardMemory, MemoryCategory::Weights)), 11) << " " << pad("-", 11) << " "
        << pad(mem(cat(e.forwardMemory, MemoryCategory::Stash)), 16) << " "
        << pad(mem(cat(e.forwardMemory, MemoryCategory::WorkingSet)), 11) << " "
        << pad(formatBytes(pipefb::planner::total(e.forwardMemory)), 11) << "\n";
  }
  const PipelineShape& sh = plan.shape;
  if (sh.decoupled()) o << decoupledRangesInWords(model, plan);
  o << "\n"
    << toString(sh.kind) << " (" << plan.family << "), " << sh.stages << " stages on "
    << sh.chainLength() << " devices"
    << (sh.folded ? " (folded: device d runs F of stage d and B of stage S-1-d)" : "")
    << (sh.decoupled() ? " (decoupled: " + std::to_string(sh.forwardDevices) + " forward, " +
                             std::to_string(sh.backwardDevices) + " backward)"
                       : "")
    << ", " << sh.microbatches << " microbatches of " << sh.microbatchSize
    << ": predicted iteration " << formatSeconds(plan.iterationTime) << ", "
    << lpad(
           [&] {
             char b[32];
             std::snprintf(b, sizeof b, "%.2f", plan.throughput);
             return std::string(b);
           }(),
           0)
    << " samples/s";
  if (plan.simulated) o << "; simulated " << formatSeconds(plan.simIterationTime);
  o << "\npeak per device (cost model";
  if (plan.simulated) o << " / simulator";
  o << "):";
  for (size_t d = 0; d < plan.deviceMemory.size(); ++d) {
    if (plan.deviceMemory[d] == 0) continue;
    o << " [" << d << "] " << formatBytes(plan.deviceMemory[d]);
    if (plan.simulated && d < plan.simPeak.size()) o << " / " << formatBytes(plan.simPeak[d]);
  }
  o << "\nlimit per device: ";
  std::int64_t lim = model.limit(plan.shape.chain.front(), budget);
  o << (lim < 0 ? std::string("unlimited") : formatBytes(lim));
  o << "; host pool " << formatBytes(plan.hostBytes);
  if (plan.simulated) o << " / " << formatBytes(plan.simHostPeak);
  o << "\n";
  return o.str();
}

std::string explainPlan(const CostModel& modelIn, const Plan& plan, std::int64_t budget,
                        const std::optional<Plan>& unconstrained) {
  // Note [Bytes at every microbatch] (LayerCost.h): the model at this microbatch size.
  const CostModel& model = modelIn.at(plan.shape.microbatchSize);
  std::ostringstream o;
  const PipelineShape& sh = plan.shape;
  const Profile& prof = model.profile();
  // Pace.
  const int bs = plan.bindingStage();
  const StageEstimate& be = plan.stages[bs].estimate;
  double lo = be.time;
  for (const auto& s : plan.stages) lo = std::min(lo, s.estimate.time);
  int dev = be.binding == Resource::BackwardCompute || be.binding == Resource::BackwardCopy
                ? plan.stages[bs].backwardDevice
                : plan.stages[bs].forwardDevice;
  if (sh.decoupled()) {  // Note [Decoupled devices]: the busiest range, not a segment
    std::vector<StageEstimate> est;
    std::vector<int> cuts{0};
    for (const StagePlan& s : plan.stages) est.push_back(s.estimate), cuts.push_back(s.last);
    const auto ranges = decoupledRanges(model, sh, est, cuts);
    auto busy = [](const DecoupledRange& r) { return r.boundary.busy(r.load.time()); };
    const DecoupledRange& b = *std::max_element(
        ranges.begin(), ranges.end(),
        [&](const DecoupledRange& x, const DecoupledRange& y) { return busy(x) < busy(y); });
    double least = busy(b);
    for (const auto& r : ranges) least = std::min(least, busy(r));
    o << "What sets the time: " << (b.backward ? "backward" : "forward") << " range " << b.index
      << " (" << layerRange(prof, b.firstLayer, b.lastLayer) << ") on device " << b.device << ": "
      << (b.boundary.time >= b.load.time() ? "its boundary's message"
          : b.load.copy > b.load.compute   ? "its copies"
                                           : "its compute")
      << " take(s) " << formatSeconds(busy(b)) << " per microbatch; the least busy range takes "
      << formatSeconds(least) << " (balance " << static_cast<int>(100 * least / busy(b) + 0.5)
      << "%)";
  } else {
    o << "What sets the time: stage " << bs << " ("
      << layerRange(prof, plan.stages[bs].first, plan.stages[bs].last) << ") on device " << dev
      << ": its " << toString(be.binding) << " take(s) " << formatSeconds(be.time)
      << " per microbatch";
  }
  if (plan.stages.size() > 1 && !sh.decoupled())
    o << "; the fastest stage takes " << formatSeconds(lo) << " (balance "
      << static_cast<int>(100 * lo / be.time + 0.5) << "%)";
  o << ".\n";
  if (sh.corePace > plan.tau)  // Note [Shared cores]
    o << "  The " << sh.chainLength() << " device threads share " << model.cluster().cores
      << " cores, which need " << formatSeconds(sh.corePace)
      << " per microbatch for the whole pipeline's work: that, not a stage, sets the pace.\n";
  if (splitsBackward(sh.kind) || sh.fill != 1) {  // Note [Zero-bubble fill], [Simulated fill]
    const int D = sh.chainLength();
    o << "  " << toString(sh.kind)
      << (splitsBackward(sh.kind) ? " splits B into I and W: ("
                                  : " fills and drains by fewer paces than 1f1b: (")
      << sh.microbatches << " + (" << D << " - 1) x " << sh.fill << ") x "
      << formatSeconds(std::max(plan.tau, sh.corePace)) << " = "
      << formatSeconds(plan.iterationTime) << ", a bubble of "
      << static_cast<int>(100.0 * (D - 1) * sh.fill / sh.slots() + 0.5) << "%.\n";
  } else if (isFlushing(sh.kind)) {
    const int D = sh.chainLength();  // fill = 1
    o << "  " << toString(sh.kind) << " flushes every iteration: (" << sh.microbatches << " + " << D
      << " - 1) x " << formatSeconds(std::max(plan.tau, sh.corePace)) << " = "
      << formatSeconds(plan.iterationTime) << ", a bubble of "
      << static_cast<int>(100.0 * (D - 1) / (sh.microbatches + D - 1) + 0.5) << "%.\n";
  } else {
    o << "  " << toString(sh.kind) << " does not flush: " << sh.microbatches << " x "
      << formatSeconds(std::max(plan.tau, sh.corePace)) << " = "
      << formatSeconds(plan.iterationTime) << " per iteration in steady state.\n";
  }
  // Memory.
  const int bd = plan.bindingDevice(model, budget);
  if (bd >= 0) {
    const std::int64_t lim = model.limit(bd, budget);
    o << "What binds memory: device " << bd << " holds " << formatBytes(plan.deviceMemory[bd]);
    if (lim >= 0)
      o << " of its " << formatBytes(lim) << " limit ("
        << static_cast<int>(100.0 * plan.deviceMemory[bd] / lim + 0.5) << "%)";
    o << ":";
    if (sh.decoupled()) o << " its range, above.";
    for (const auto& s : plan.stages) {
      if (sh.decoupled()) break;  // Note [Decoupled devices]: per range, not per segment
      if (s.backwardDevice == bd)
        o << " stage " << (&s - &plan.stages[0]) << " " << breakdown(s.estimate.backwardMemory)
          << " (" << s.estimate.inFlight << " stashes in flight under " << toString(sh.kind)
          << ").";
      else if (s.forwardDevice == bd)
        o << " stage " << (&s - &plan.stages[0]) << " forward pass "
          << breakdown(s.estimate.forwardMemory) << ".";
    }
    o << "\n";
  }
  // Policies.
  if (sh.decoupled()) {  // Note [Decoupled search]: one policy and placement for all
    const StagePlan& s = plan.stages.front();
    o << "Every segment uses " << schedules::toString(s.estimate.effective)
      << (s.optimizerOnHost ? ", with its optimizer state and master weights in the host pool" : "")
      << " (a decoupled plan takes one policy and one optimizer placement for all).\n";
    if (sh.lookahead == 0 && schedules::isOffloaded(s.estimate.effective))
      o << "Lookahead 0: each B's stash is prefetched right before it, so a backward device "
           "holds one and B waits for its copy (Note [Prefetch distance zero]).\n";
  }
  for (size_t k = 0; k < plan.stages.size() && !sh.decoupled(); ++k) {
    const StagePlan& s = plan.stages[k];
    if (s.estimate.effective == StashPolicy::Keep) continue;
    const int d = s.backwardDevice;
    const std::int64_t lim = model.limit(d, budget);
    o << "Stage " << k << " uses " << schedules::toString(s.estimate.effective) << ": ";
    if (!s.estimate.same && s.policy == StashPolicy::Keep) {
      o << "its forward and backward run on different devices, so the stash goes through "
           "the host pool";
    } else {
      StageEstimate keep = model.stage(stageShape(sh, s.optimizerOnHost), static_cast<int>(k),
                                       s.first, s.last, StashPolicy::Keep);
      // Note [Planned reserve]: the estimate fits what the limit leaves beside the reserve.
      if (lim >= 0 && keep.peakMemory() > roomUnder(lim, model.cluster().reservePerMille))
        o << "keep would need " << formatBytes(keep.peakMemory()) << " on device " << d
          << " (limit " << formatBytes(lim) << ")";
      else
        o << "keep would fit (" << formatBytes(keep.peakMemory()) << ") but this stage is "
          << "faster or frees memory elsewhere this way";
    }
    if (schedules::isOffloaded(s.estimate.effective)) {
      const double copy = std::max(s.estimate.forwardCopy, s.estimate.backwardCopy);
      const double comp = std::max(s.estimate.forwardCompute, s.estimate.backwardCompute);
      o << "; its copies take " << formatSeconds(copy) << " per microbatch "
        << (copy <= comp ? "and hide under " : "and do NOT hide under ") << formatSeconds(comp)
        << " of compute";
    }
    if (schedules::isCheckpoint(s.estimate.effective))
      o << "; recomputing the forward adds to the backward, which takes "
        << formatSeconds(s.estimate.backwardTime);
    o << ".\n";
  }
  // Note [Optimizer placement search]
  for (size_t k = 0; k < plan.stages.size() && !sh.decoupled(); ++k) {
    const StagePlan& s = plan.stages[k];
    if (!s.optimizerOnHost) continue;
    const std::int64_t opt = model.staticSum(s.first, s.last) - model.paramSum(s.first, s.last) -
                             s.estimate.backwardMemory[index(MemoryCategory::Grads)];
    o << "Stage " << k
      << " keeps its optimizer state and master weights in the host pool: " << formatBytes(opt)
      << " of optimizer state off device " << s.backwardDevice
      << "; its step waits for the copies, " << formatSeconds(s.estimate.stepTime)
      << " per step.\n";
  }
  // Note [Bytes at every microbatch] in LayerCost.h: a measured profile without bytes at
  // the plan's microbatch (an older one, or a size that could not run) scales them.
  auto samples = [](std::int64_t n) {
    return std::to_string(n) + (n == 1 ? " sample" : " samples");
  };
  if (prof.source == "measured" && sh.microbatchSize != prof.microbatch)
    o << "This plan runs microbatches of " << samples(sh.microbatchSize) << "; the profile "
      << "measured its bytes at " << samples(prof.microbatch) << " only, so they are scaled "
      << "(Note [Microbatch scaling]), and some transients are not affine in the microbatch "
      << "(a convolution of one sample on the CPU). pipefb_profile measures the bytes at every "
      << "divisor of the batch: profile again (-f) for memory exactly as the run will hold "
      << "it.\n";
  // The budget's cost.
  if (unconstrained) {
    if (unconstrained->iterationTime >= plan.iterationTime * (1 - 1e-9)) {
      o << "The budget does not cost time: the best plan without it is as fast.\n";
    } else {
      o << "Without the budget the best plan would be " << unconstrained->family << " with "
        << unconstrained->shape.stages << " stages x " << unconstrained->shape.microbatches
        << " microbatches at " << formatSeconds(unconstrained->iterationTime) << " (peak "
        << formatBytes(unconstrained->peakMemory) << "); the budget costs "
        << static_cast<int>(100 * (plan.iterationTime / unconstrained->iterationTime - 1) + 0.5)
        << "% more time.\n";
    }
  }
  return o.str();
}

}  // namespace pipefb::planner
