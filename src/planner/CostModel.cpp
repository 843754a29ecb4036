// The planner's cost model (Note [Planner cost model] in CostModel.h): the profile's prefix
// sums, a stage's working sets and waiting messages, and a plan's load.
#include "pipefb/planner/CostModel.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include "CostModelDetail.h"
#include "pipefb/common/Error.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/Messages.h"

namespace pipefb::planner {

using detail::forwardBesideBackward;
using detail::scaled;
using detail::waitingFor;

std::int64_t total(const CategoryBytes& b) {
  std::int64_t t = 0;
  for (auto x : b) t += x;
  return t;
}

const char* toString(Resource r) {
  switch (r) {
    case Resource::ForwardCompute:
      return "forward compute";
    case Resource::BackwardCompute:
      return "backward compute";
    case Resource::Compute:
      return "compute";
    case Resource::ForwardCopy:
      return "offload copies";
    case Resource::BackwardCopy:
      return "prefetch copies";
    case Resource::Copy:
      return "offload+prefetch copies";
    case Resource::LinkIn:
      return "link from the previous stage";
    case Resource::LinkOut:
      return "forward-to-backward link";
  }
  return "?";
}

std::int64_t StageEstimate::peakMemory() const {
  return std::max(total(forwardMemory), total(backwardMemory));
}

void Cluster::validate() const {
  const int n = numDevices();
  if (n < 1) throw UserError("cluster '" + name + "': no devices");
  if (static_cast<int>(links.size()) != n)
    throw UserError("cluster '" + name + "': the link matrix has " + std::to_string(links.size()) +
                    " rows for " + std::to_string(n) + " devices");
  for (int a = 0; a < n; ++a) {
    if (static_cast<int>(links[a].size()) != n)
      throw UserError("cluster '" + name + "': link matrix row " + std::to_string(a) + " has " +
                      std::to_string(links[a].size()) + " entries, expected " + std::to_string(n));
    if (!(devices[a].speed > 0))
      throw UserError("cluster '" + name + "': device " + std::to_string(a) + " has speed <= 0");
  }
}

Cluster Cluster::uniform(int n, double speed, std::int64_t capacity, Link link, Link host,
                         std::int64_t hostPool) {
  Cluster c;
  c.name = std::to_string(n) + "x-uniform";
  for (int i = 0; i < n; ++i)
    c.devices.push_back({"dev:" + std::to_string(i), speed, capacity, host});
  c.links.assign(n, std::vector<Link>(n, link));
  c.hostPool = hostPool;
  return c;
}

CostModel::CostModel(Profile profile, Cluster cluster)
    : profile_(std::move(profile)), cluster_(std::move(cluster)) {
  cluster_.validate();
  views_ = std::make_shared<ViewCache>();
  if (!profile_.bytesAt.empty()) views_->base = profile_;
  if (profile_.layers.empty()) throw UserError("profile '" + profile_.model + "' has no layers");
  if (profile_.microbatch < 1) throw UserError("profile microbatch must be >= 1");
  const size_t L = profile_.layers.size();
  F_.assign(L + 1, 0);
  B_ = R_ = Ffixed_ = Bfixed_ = Rfixed_ = step_ = afterStep_ = snapshot_ = F_;
  saved_.assign(L + 1, 0);
  param_ = buffer_ = grad_ = opt_ = states_ = kept_ = keptGrad_ = saved_;
  fwdParam_ = hostedGrad_ = hostOpt_ = saved_;
  // Note [Outputs kept between layers]: 0 means not measured unless some layer's is not.
  const bool inputsMeasured = std::any_of(profile_.layers.begin(), profile_.layers.end(),
                                          [](const LayerCost& c) { return c.savedInputBytes > 0; });
  std::vector<std::int64_t> stepWs(L), fws(L), fpeak(L), noGrad(L);
  for (size_t l = 0; l < L; ++l) {
    const LayerCost& c = profile_.layers[l];
    F_[l + 1] = F_[l] + c.forward;
    B_[l + 1] = B_[l] + c.backward;
    R_[l + 1] = R_[l] + c.recompute;
    Ffixed_[l + 1] = Ffixed_[l] + c.forwardFixed;
    Bfixed_[l + 1] = Bfixed_[l] + c.backwardFixed;
    Rfixed_[l + 1] = Rfixed_[l] + c.recomputeFixed;
    step_[l + 1] = step_[l] + c.step;
    // Note [Backward after a step]: B after a step (B when not measured). The excess is
    // taken over a whole stage, so that the noise of small layers cancels.
    afterStep_[l + 1] =
        afterStep_[l] + (c.backwardAfterStep > 0 ? c.backwardAfterStep : c.backward);
    snapshot_[l + 1] = snapshot_[l] + c.snapshot;
    saved_[l + 1] = saved_[l] + c.savedBytes;
    // Note [Outputs kept between layers]: layer l-1's output its graph keeps and l's does not.
    const std::int64_t kept =
        inputsMeasured && l > 0
            ? std::max<std::int64_t>(0, profile_.layers[l - 1].savedOutputBytes - c.savedInputBytes)
            : 0;
    kept_[l + 1] = kept_[l] + kept;
    keptGrad_[l + 1] =
        keptGrad_[l] + (c.keptGradBytes >= 0 ? c.keptGradBytes : c.savedBytes + c.outputBytes);
    param_[l + 1] = param_[l] + c.paramBytes;
    // Note [Half-precision weights on a device]
    fwdParam_[l + 1] = fwdParam_[l] + forwardParamBytes(c);
    hostedGrad_[l + 1] = hostedGrad_[l] + hostedGradBytes(c);
    hostOpt_[l + 1] = hostOpt_[l] + hostOptimizerBytes(c);
    buffer_[l + 1] = buffer_[l] + c.bufferBytes;
    grad_[l + 1] = grad_[l] + c.gradBytes;
    opt_[l + 1] = opt_[l] + c.optimizerBytes;
    states_[l + 1] = states_[l] + c.paramBytes + c.gradBytes + c.optimizerBytes;
    stepWs[l] = c.stepWorkingBytes;
    fws[l] = c.forwardWorkingBytes >= 0 ? c.forwardWorkingBytes : c.workingBytes;
    // Note [Outputs kept between layers]: beside those of the layers before l (kept_[l]).
    fpeak[l] = saved_[l + 1] + kept_[l] + c.outputBytes + fws[l];
    noGrad[l] = c.noGradForwardBytes >= 0
                    ? c.noGradForwardBytes
                    : inputBytes(static_cast<int>(l)) + c.outputBytes + fws[l];
  }
  stepWorkingMax_ = buildMax(std::move(stepWs));
  forwardWorkingMax_ = buildMax(std::move(fws));
  forwardPeakMax_ = buildMax(std::move(fpeak));
  noGradForwardMax_ = buildMax(std::move(noGrad));
}

const CostModel& CostModel::at(std::int64_t microbatchSize) const {
  if (microbatchSize == profile_.microbatch) return *this;
  std::lock_guard<std::mutex> lock(views_->mu);
  const Profile& base = views_->base;
  if (base.bytesAt.empty()) return *this;  // nothing measured at other sizes: scale
  auto it = views_->models.find(microbatchSize);
  if (it == views_->models.end()) {
    // Not measured at that size: the base profile, scaled (Note [Microbatch scaling]).
    const std::optional<Profile> there = profileAt(base, microbatchSize);
    if (!there && !isView_) return *this;
    auto model = std::make_shared<CostModel>(there ? *there : base, cluster_);
    model->views_ = views_;
    model->isView_ = true;
    it = views_->models.emplace(microbatchSize, std::move(model)).first;
  }
  return *it->second;
}

std::int64_t CostModel::forwardPeak(int k, int first, int last, bool graph) const {
  if (graph) {
    // Layer `first` holds none of the outputs kept inside the range (Note [Outputs kept
    // between layers]); a later layer l those of layers first+1 .. l-1.
    const LayerCost& c = profile_.layers[first];
    std::int64_t peak =
        c.savedBytes + c.outputBytes + rangeMax(forwardWorkingMax_, first, first + 1);
    if (last > first + 1)
      peak = std::max(
          peak, rangeMax(forwardPeakMax_, first + 1, last) - saved_[first] - kept_[first + 1]);
    return peak;
  }
  // Note [Forward without autograd]: layer `first` reads the stage input; the later ones
  // run beside it (execForward holds it until F returns). Stage 0's input is one of the
  // microbatch inputs charged as comm buffers.
  const std::int64_t in = inputBytes(first);
  std::int64_t peak = rangeMax(noGradForwardMax_, first, first + 1);
  if (last > first + 1) peak = std::max(peak, rangeMax(noGradForwardMax_, first + 1, last) + in);
  return peak - (k == 0 ? in : 0);
}

CostModel::SparseMax CostModel::buildMax(std::vector<std::int64_t> values) {
  const size_t L = values.size();
  SparseMax t;
  t.push_back(std::move(values));
  for (size_t p = 1; (size_t(1) << p) <= L; ++p) {
    t.emplace_back(L - (size_t(1) << p) + 1);
    for (size_t l = 0; l + (size_t(1) << p) <= L; ++l)
      t[p][l] = std::max(t[p - 1][l], t[p - 1][l + (size_t(1) << (p - 1))]);
  }
  return t;
}

std::int64_t CostModel::rangeMax(const SparseMax& t, int first, int last) {
  // p = floor(log2(last - first))
  const int p = 31 - __builtin_clz(static_cast<unsigned>(last - first));
  return std::max(t[p][first], t[p][last - (1 << p)]);
}

std::int64_t CostModel::inputBytes(int layer) const {
  return layer == 0 ? profile_.inputBytes : profile_.layers[layer - 1].outputBytes;
}

double CostModel::scale(const PipelineShape& shape) const {
  return static_cast<double>(shape.microbatchSize) / static_cast<double>(profile_.microbatch);
}

const CostModel::GatherTables& CostModel::gatherTables(const PipelineShape& shape) const {
  const double f = scale(shape);
  std::lock_guard<std::mutex> lock(gather_->mu);
  auto it = gather_->tables.find(shape.microbatchSize);
  if (it == gather_->tables.end()) {
    // key(l) = scaled ws(l) - G(0 .. l+1): max over [first, last) plus G(0 .. last) is
    // max over l of ws(l) + G(l+1 .. last); layered adds the saved prefix S(0 .. l+1),
    // less S(0 .. first) after the range maximum; ws the gathered one. In place: the
    // in-place ws, without G.
    const size_t L = profile_.layers.size();
    std::vector<std::int64_t> key(L), layered(L), own(L), ownLayered(L);
    for (size_t l = 0; l < L; ++l) {
      const LayerCost& c = profile_.layers[l];
      // Note [Parameter-sized working sets] in LayerCost.h: affine in the microbatch.
      own[l] = scaledBytes(c.workingBytes, c.workingFixedBytes, f);
      // Note [Outputs kept between layers]: the graph of layers .. l holds those kept
      // inside it too (less those before `first`, after the range maximum).
      ownLayered[l] = own[l] + scaled(saved_[l + 1] + kept_[l + 1], f);
      key[l] = (c.gatheredWorkingBytes >= 0
                    ? scaledBytes(c.gatheredWorkingBytes, c.gatheredWorkingFixedBytes, f)
                    : own[l]) -
               grad_[l + 1];
      layered[l] = key[l] + scaled(saved_[l + 1] + kept_[l + 1], f);
    }
    GatherTables t{buildMax(std::move(key)), buildMax(std::move(layered)), buildMax(std::move(own)),
                   buildMax(std::move(ownLayered))};
    it = gather_->tables.emplace(shape.microbatchSize, std::move(t)).first;
  }
  return it->second;  // std::map nodes are stable
}

bool CostModel::gradientsInPlace(const PipelineShape& shape, int k, StashPolicy policy) {
  if (shape.replicas > 1 || splitsBackward(shape.kind)) return false;
  const bool split = shape.splits(k);
  if (split)
    return shape.kind == ScheduleKind::PipeFbSync &&
           schedules::isCheckpoint(schedules::effectivePolicy(policy, split));
  const bool unsplitPipeFb = isSplit(shape.kind);
  return unsplitPipeFb ||
         weightCopies(shape.kind, shape.stages, k, shape.microbatches, shape.asyncLag) == 0;
}

bool CostModel::weightGradientsInPlace(const PipelineShape& shape, int k) {
  return splitsBackward(shape.kind) && !shape.splits(k) &&
         weightCopies(shape.kind, shape.stages, k, shape.microbatches, shape.asyncLag) == 0;
}

std::int64_t CostModel::backwardWorking(const PipelineShape& shape, int k, int first, int last,
                                        bool inPlace) const {
  const double f = scale(shape);
  const GatherTables& t = gatherTables(shape);
  const std::int64_t during =
      inPlace ? rangeMax(t.inPlace, first, last) : grad_[last] + rangeMax(t.gathered, first, last);
  const std::int64_t atEnd =
      (inPlace ? 0 : range(grad_, first, last)) + (k > 0 ? scaled(inputBytes(first), f) : 0);
  return std::max(during, atEnd);
}

std::int64_t CostModel::backwardLayered(const PipelineShape& shape, int k, int first, int last,
                                        bool inPlace, std::int64_t onStash) const {
  const double f = scale(shape);
  const GatherTables& t = gatherTables(shape);
  const std::int64_t during = (inPlace ? rangeMax(t.inPlaceLayered, first, last)
                                       : grad_[last] + rangeMax(t.layered, first, last)) -
                              scaled(saved_[first] + kept_[first + 1], f) - onStash;
  const std::int64_t atEnd =
      (inPlace ? 0 : range(grad_, first, last)) + (k > 0 ? scaled(inputBytes(first), f) : 0);
  return std::max(during, atEnd);
}

std::int64_t CostModel::limit(int device, std::int64_t budget) const {
  std::int64_t cap = cluster_.devices.at(device).capacity;
  if (budget < 0) return cap;
  if (cap < 0) return budget;
  return std::min(cap, budget);
}

double CostModel::linkTime(const PipelineShape& shape, int k, int first) const {
  if (k == 0) return 0;
  const std::int64_t bytes = scaled(inputBytes(first), scale(shape));
  const double act = cluster_.link(shape.forwardDevice(k - 1), shape.forwardDevice(k)).time(bytes);
  const double grad =
      cluster_.link(shape.backwardDevice(k), shape.backwardDevice(k - 1)).time(bytes);
  return std::max(act, grad);
}

double CostModel::computeLowerBound(const PipelineShape& shape, int k, int first, int last) const {
  const double f = scale(shape);
  const double fw = forwardTime(first, last, f), bw = backwardTime(first, last, f);
  const double step =
      range(step_, first, last) * stepsPerMicrobatch(shape.kind, shape.microbatches);
  const double sf = speed(shape, shape.forwardDevice(k));
  const double sb = speed(shape, shape.backwardDevice(k));
  if (shape.splits(k)) return std::max(fw / sf, (bw + step) / sb);
  return (fw + bw + step) / sf;
}

std::int64_t CostModel::memoryLowerBound(const PipelineShape& shape, int k, int first, int last,
                                         std::int64_t maxWorking) const {
  // Weights, grads and optimizer state on the backward device, and the working set: all
  // grow with the stage; the stash (which may shrink under a checkpoint) is left out.
  if (shape.optimizerOnHost)  // Note [Half-precision weights on a device]
    return range(fwdParam_, first, last) + range(hostedGrad_, first, last) + maxWorking;
  return range(param_, first, last) + range(grad_, first, last) + range(opt_, first, last) +
         maxWorking;
}

CostModel::WaitingBytes CostModel::waitingBytes(const PipelineShape& shape, int k, int first,
                                                int last, bool outputTravels) const {
  WaitingBytes out;
  if (shape.decoupled()) return out;  // Note [Decoupled devices]
  const double f = scale(shape);
  const std::int64_t input = scaled(inputBytes(first), f);
  const std::int64_t output = scaled(profile_.layers[last - 1].outputBytes, f);
  const schedules::WaitingMessages& wm =
      waitingFor(shape.kind, shape.stages, shape.microbatches, shape.folded, shape.lag());
  // Note [Outputs at the loss]: those of the next iteration come after B's loss. A folded
  // device also runs forwards, beside which they may wait as well: charged whole there.
  const int atLoss = shape.folded ? wm.outputs : wm.outputsAtLoss;
  const std::int64_t outputs = outputTravels ? atLoss * output : 0;
  out.outputsAfterLoss = outputTravels ? (wm.outputs - atLoss) * output : 0;
  if (forwardBesideBackward(shape)) {  // Note [Forward beside backward]
    out.activations = wm.activationsAtBackward.at(k) * input;
    out.gradients = wm.gradientsAtBackward.at(k) * output + outputs;
    out.activationsAtForward = wm.activations.at(k) * input;
    out.atForward = out.activationsAtForward + wm.gradients.at(k) * output + outputs;
    return out;
  }
  out.activations = out.activationsAtForward = wm.activations.at(k) * input;
  out.gradients = wm.gradients.at(k) * output + outputs;
  if (shape.folded && shape.splits(k) && isFlushing(shape.kind)) {  // Note [Folded pace]
    out.activationsOnlyAtForward = (wm.activations.at(k) - wm.activationsAtBackward.at(k)) * input;
    out.gradientsOnlyAtForward = (wm.gradients.at(k) - wm.gradientsAtBackward.at(k)) * output;
  }
  return out;
}

std::int64_t plannedReserve(std::int64_t bytes, int perMille) {
  if (bytes <= 0 || perMille <= 0) return 0;
  // ceil(bytes x perMille / 1000) without overflow for any byte count.
  return bytes / 1000 * perMille + (bytes % 1000 * perMille + 999) / 1000;
}

std::int64_t roomUnder(std::int64_t limit, int perMille) {
  if (limit < 0) return limit;
  // limit x 1000 / (1000 + perMille) without overflow: within a byte or two of the answer,
  // which the two steps below make exact (bytes + plannedReserve(bytes) only grows).
  const std::int64_t d = 1000 + perMille;
  std::int64_t room = limit / d * 1000 + limit % d * 1000 / d;
  while (room > 0 && room + plannedReserve(room, perMille) > limit) --room;
  while (room < limit && room + 1 + plannedReserve(room + 1, perMille) <= limit) ++room;
  return room;
}

std::vector<std::int64_t> roomForEstimates(std::vector<std::int64_t> limits, int perMille) {
  for (auto& l : limits) l = roomUnder(l, perMille);
  return limits;
}

namespace {
PlanLoad estimatedLoad(const CostModel& modelIn, const PipelineShape& shape,
                       const std::vector<StageEstimate>& stages, const std::vector<int>& cuts) {
  // Note [Bytes at every microbatch] (LayerCost.h): the model at this microbatch size.
  const CostModel& model = modelIn.at(shape.microbatchSize);
  const int S = static_cast<int>(stages.size());
  PlanLoad out;
  out.deviceMemory.assign(model.cluster().numDevices(), 0);
  if (shape.sharesDevices()) {  // Note [Shared devices]
    std::vector<std::vector<HostedStage>> byPosition(shape.chainLength());
    std::vector<std::pair<int, int>> boundaries;
    for (int k = 0; k < S; ++k) {
      out.tau = std::max(out.tau, stages[k].time);
      out.hostBytes += stages[k].hostBytes;
      byPosition.at(shape.position(k)).push_back({k, &stages[k]});
      if (k > 0) boundaries.push_back({k, cuts[k]});
    }
    for (int p = 0; p < shape.chainLength(); ++p) {
      out.tau = std::max(out.tau, sharedDeviceTime(byPosition[p]));
      out.deviceMemory[shape.chain.at(p)] += sharedDeviceMemory(shape, p, byPosition[p]);
    }
    out.tau = std::max(out.tau, model.linksTime(shape, boundaries));
    return out;
  }
  if (shape.decoupled()) {  // Note [Decoupled devices]
    for (const StageEstimate& e : stages) out.hostBytes += e.hostBytes;
    for (const DecoupledRange& r : decoupledRanges(model, shape, stages, cuts)) {
      out.tau = std::max(out.tau, r.boundary.busy(r.load.time()));
      out.deviceMemory[r.device] += r.load.memory() + r.boundary.bytes;
    }
    return out;
  }
  for (int k = 0; k < S; ++k) {
    const StageEstimate& e = stages[k];
    out.tau = std::max(out.tau, e.time);
    out.hostBytes += e.hostBytes;
    if (shape.folded && e.same == false) continue;  // below, per device
    if (e.same) {
      out.deviceMemory[shape.forwardDevice(k)] += total(e.backwardMemory);
    } else {
      out.deviceMemory[shape.forwardDevice(k)] += total(e.forwardMemory);
      out.deviceMemory[shape.backwardDevice(k)] += total(e.backwardMemory);
    }
  }
  if (!shape.folded) return out;
  // Note [Folded pace]: device chain[d] runs F(d) and B(S-1-d).
  for (int d = 0; d < S; ++d) {
    if (!shape.splits(d)) continue;
    out.tau = std::max(out.tau, foldedDeviceTime(stages[d], stages[S - 1 - d]));
    out.deviceMemory[shape.chain[d]] += foldedDeviceMemory(stages[d], stages[S - 1 - d]);
  }
  for (int a = 0; a + 1 < S; ++a)
    out.tau = std::max(out.tau, model.foldedLinkTime(shape, a, cuts[a + 1], cuts[S - 1 - a]));
  return out;
}
}  // namespace

PlanLoad planLoad(const CostModel& model, const PipelineShape& shape,
                  const std::vector<StageEstimate>& stages, const std::vector<int>& cuts) {
  PlanLoad out = estimatedLoad(model, shape, stages, cuts);
  out.deviceReserve.assign(out.deviceMemory.size(), 0);
  for (size_t d = 0; d < out.deviceMemory.size(); ++d) {  // Note [Planned reserve]
    out.deviceReserve[d] = plannedReserve(out.deviceMemory[d], model.cluster().reservePerMille);
    out.deviceMemory[d] += out.deviceReserve[d];
  }
  return out;
}

bool inputStashOnly(const Cluster& cluster, const PipelineShape& shape, int k) {
  const int fd = shape.forwardDevice(k), bd = shape.backwardDevice(k);
  return fd != bd && (shape.replicas > 1 || !cluster.sameProcess(fd, bd));
}

}  // namespace pipefb::planner
