// Decoupled devices: the forward and backward ranges of a decoupled shape, each on a
// device of its own (Note [Decoupled devices] in CostModel.h).
#include <algorithm>
#include <array>

#include "CostModelDetail.h"
#include "pipefb/common/Error.h"
#include "pipefb/planner/CostModel.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/Messages.h"

namespace pipefb::planner {

using detail::scaled;
using detail::waitingFor;

namespace {
// Note [Decoupled devices]: a boundary between two devices of one pass waits as many
// messages as the 2S-device form's (the forward devices never wait for a backward within
// an iteration, and a backward device only for its stashes and the next range's gradients).
const schedules::WaitingMessages& decoupledWaiting(const PipelineShape& shape) {
  return waitingFor(shape.kind, 2, shape.microbatches, false, shape.lag());
}
}  // namespace

RangeBoundary CostModel::forwardRangeInput(const PipelineShape& shape, int a, int first) const {
  RangeBoundary out;
  if (a == 0) return out;
  const std::int64_t bytes = scaled(inputBytes(first), scale(shape));
  out.time =
      cluster_.link(shape.forwardRangeDevice(a - 1), shape.forwardRangeDevice(a)).time(bytes);
  out.bytes = decoupledWaiting(shape).activations.at(1) * bytes;
  return out;
}

RangeBoundary CostModel::backwardRangeOutput(const PipelineShape& shape, int r, int last,
                                             StashPolicy lastPolicy) const {
  RangeBoundary out;
  const schedules::WaitingMessages& wm = decoupledWaiting(shape);
  const std::int64_t bytes = scaled(profile_.layers[last - 1].outputBytes, scale(shape));
  const int to = shape.backwardRangeDevice(r);
  if (r + 1 < shape.backwardDevices) {
    out.time = cluster_.link(shape.backwardRangeDevice(r + 1), to).time(bytes);
    out.bytes = wm.gradients.at(0) * bytes;
  } else if (schedules::lastOutputTravels(true, schedules::isCheckpoint(lastPolicy))) {
    // Note [Recomputed last output]: only a B that does not recompute is sent the output.
    // A decoupled placement's devices run one pass each: it is sent at its receive (Note
    // [Output at its receive in the cost model]).
    out.time = cluster_.link(shape.forwardRangeDevice(shape.forwardDevices - 1), to).time(bytes);
    out.bytes = wm.outputs * bytes;
    out.atReceive = true;
  }
  return out;
}

void DecoupledDevice::addForward(const StageEstimate& e) {
  const int st = index(MemoryCategory::Stash), ws = index(MemoryCategory::WorkingSet);
  const CategoryBytes& m = e.forwardMemory;
  compute += e.forwardCompute;
  copy += e.forwardCopy;
  resident += total(m) - m[st] - m[ws];
  // Note [Decoupled devices]: F of a segment beside the stash of the device's OFF before
  // it, the previous segment's (one copy: the pairing below assumes kOffloadsInFlight 1).
  static_assert(schedules::kOffloadsInFlight == 1, "pair each F with as many OFFs before it");
  // What of this segment's stashes stays beside the next microbatch's F of the range's
  // first segment when it is the range's last (a one-segment range's own bound); an
  // unsplit segment keeps its other stashes beside every F.
  const std::int64_t kept = m[st] - e.stashBytes;
  if (e.same) resident += kept;
  const Held here{e.stashBytes, m[ws]};
  if (forwardSegments_ == 0) {
    wrap_ = e.same ? 0 : kept;
  } else {  // the old first segment's F now follows this one's OFF
    const Held h{firstF_.stashes + e.copyingOutBytes, firstF_.working};
    if (h.total() > inside_.total()) inside_ = h;
  }
  firstF_ = here;
  firstInput_ = e.firstInputBytes;
  firstInputBesideCopy_ = e.firstInputBesideCopy;
  ++forwardSegments_;
}

std::int64_t DecoupledDevice::memoryFloor() const {
  if (forwardSegments_ > 0) return resident + std::max(inside_.total(), firstF_.total());
  return resident + inside_.total();
}

void DecoupledDevice::addBackward(const StageEstimate& e, const PipelineShape& shape) {
  const int st = index(MemoryCategory::Stash), ws = index(MemoryCategory::WorkingSet);
  const CategoryBytes& m = e.backwardMemory;
  compute += e.backwardCompute;
  copy += e.backwardCopy;
  resident += total(m) - m[st] - m[ws];
  lookahead_ = shape.lookahead;
  microbatches_ = shape.microbatches;
  stashes_.push_back(e.stashBytes);
  working_.push_back(m[ws]);
  steps_.push_back(e.stepWorkingBytes);
  versionSum_.push_back(versionSum_.back() + e.windowedVersionBytes);
  windowed_ = windowed_ || e.windowedVersionBytes > 0;
  // Note [Decoupled devices]: B order is the order added, so segment q's lookahead + 1
  // B's stay within one microbatch once q + lookahead segments follow it; adding one
  // more segment settles the window of the segment `lookahead` places before it.
  const int q = static_cast<int>(stashes_.size()) - 1 - lookahead_;
  if (q >= 0) {
    const Held h = window(q);
    if (h.total() > inside_.total()) inside_ = h;
  }
}

DecoupledDevice::Held DecoupledDevice::window(int q) const {
  const int n = static_cast<int>(stashes_.size());
  // The B's from B(q,0) on: n - q of microbatch 0, n of each later one.
  const std::int64_t left = static_cast<std::int64_t>(n) * microbatches_ - q;
  const int count = static_cast<int>(std::min<std::int64_t>(lookahead_ + 1, left));
  Held h;
  for (int t = 0; t < count; ++t) h.stashes += stashes_[(q + t) % n];
  h.working = working_[q];
  return h;
}

// The windowed versions of the segments in the union of the ranges [first, last] (clipped
// to the segments; an empty range has first > last).
std::int64_t DecoupledDevice::versionsIn(std::initializer_list<std::pair<int, int>> list) const {
  const int n = static_cast<int>(stashes_.size());
  std::array<std::pair<int, int>, 5> ranges{};
  PIPEFB_ASSERT(list.size() <= ranges.size(), "versionsIn: at most 5 ranges");
  std::copy(list.begin(), list.end(), ranges.begin());
  std::fill(ranges.begin() + list.size(), ranges.end(), std::pair<int, int>{1, 0});
  std::sort(ranges.begin(), ranges.end());
  std::int64_t sum = 0;
  int next = 0;  // the segments below it are counted
  for (auto [a, b] : ranges) {
    a = std::max(a, next);
    b = std::min(b, n - 1);
    if (a > b) continue;
    sum += versionSum_[b + 1] - versionSum_[a];
    next = b + 1;
  }
  return sum;
}

// Note [Planned async lag]: B(q, 0), B(q, M-1) and STEP(q) with the versions there then.
DecoupledDevice::Held DecoupledDevice::windowedPeak() const {
  const int n = static_cast<int>(stashes_.size()), a = lookahead_, b = std::max(a, 1);
  constexpr std::pair<int, int> none{1, 0};
  Held best;
  for (int q = 0; q < n; ++q) {
    const Held h = window(q);
    const std::pair<int, int> prefetched{q, q + a}, goingOut{n + q - a, n - 1},
        held = q == 0 ? std::pair<int, int>{n - 1, n - 1} : none, stepped{q - b, q - 1},
        early{0, q - n + a};
    const std::int64_t first = versionsIn({prefetched, goingOut, held});
    const std::int64_t last = versionsIn({stepped, early});
    // With M = 1, B(q, 0) is B(q, M-1).
    const std::int64_t atB = microbatches_ == 1
                                 ? versionsIn({prefetched, goingOut, held, stepped, early})
                                 : std::max(first, last);
    const std::int64_t atStep = versionsIn({{q - b, q}, {0, q - n + a + 1}});
    const Held atBackward{h.stashes, h.working, atB}, step{h.stashes, steps_[q], atStep};
    if (atBackward.total() > best.total()) best = atBackward;
    if (step.total() > best.total()) best = step;
  }
  return best;
}

DecoupledDevice::Held DecoupledDevice::peak() const {
  Held best = inside_;
  if (windowed_) {
    const Held h = windowedPeak();
    if (h.total() > best.total()) best = h;
  }
  if (forwardSegments_ > 0) {  // the range's first F beside its last segment's copies
    const std::int64_t before =
        firstInputBesideCopy_ ? wrap_ + firstInput_ : std::max(wrap_, firstInput_);
    const Held h{firstF_.stashes + before, firstF_.working};
    return h.total() > best.total() ? h : best;
  }
  const int n = static_cast<int>(stashes_.size());
  for (int q = std::max(0, n - lookahead_); q < n; ++q) {  // windows into microbatch m + 1
    const Held h = window(q);
    if (h.total() > best.total()) best = h;
  }
  return best;
}

std::vector<DecoupledRange> decoupledRanges(const CostModel& modelIn, const PipelineShape& shape,
                                            const std::vector<StageEstimate>& stages,
                                            const std::vector<int>& cuts) {
  // Note [Bytes at every microbatch] (LayerCost.h): the model at this microbatch size.
  const CostModel& model = modelIn.at(shape.microbatchSize);
  const int S = static_cast<int>(stages.size());
  std::vector<DecoupledRange> out;
  for (bool backward : {false, true}) {
    const std::vector<int>& range = backward ? shape.backwardRange : shape.forwardRange;
    for (int k = 0; k < S; ++k) {
      if (k == 0 || range[k] != range[k - 1]) {
        DecoupledRange r;
        r.backward = backward;
        r.index = range[k];
        r.first = k;
        r.device = backward ? shape.backwardDevice(k) : shape.forwardDevice(k);
        out.push_back(r);
      }
      DecoupledRange& r = out.back();
      r.last = k + 1;
      r.firstLayer = cuts[r.first];
      r.lastLayer = cuts[k + 1];
    }
  }
  // A range's segments from its last to its first (Note [Decoupled devices]).
  for (DecoupledRange& r : out)
    for (int k = r.last - 1; k >= r.first; --k)
      r.backward ? r.load.addBackward(stages[k], shape) : r.load.addForward(stages[k]);
  for (DecoupledRange& r : out)
    r.boundary = r.backward ? model.backwardRangeOutput(shape, r.index, r.lastLayer,
                                                        stages[r.last - 1].policy)
                            : model.forwardRangeInput(shape, r.index, r.firstLayer);
  return out;
}

}  // namespace pipefb::planner
