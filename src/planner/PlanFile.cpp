// Plan files (docs/planner.md, "Plan files").
#include "pipefb/planner/PlanFile.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>

#include "pipefb/common/Error.h"
#include "pipefb/common/Size.h"
#include "pipefb/planner/Explain.h"

namespace pipefb::planner {

namespace {

std::string quote(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o + "\"";
}

std::string sizeOrCapacity(std::int64_t b) { return b < 0 ? "capacity" : formatBytes(b); }

void categories(std::ostream& o, const CategoryBytes& b, const char* indent) {
  o << indent << "{";
  bool first = true;
  for (MemoryCategory c : kAllMemoryCategories) {
    if (b[index(c)] == 0) continue;
    o << (first ? "" : ", ") << toString(c) << ": " << b[index(c)];
    first = false;
  }
  o << "}";
}

}  // namespace

std::string planToYaml(const CostModel& modelIn, const Plan& plan, const PlanContext& ctx) {
  // Note [Bytes at every microbatch] (LayerCost.h): the model at this microbatch size.
  const CostModel& model = modelIn.at(plan.shape.microbatchSize);
  std::ostringstream o;
  o << std::setprecision(6);
  const PipelineShape& sh = plan.shape;
  o << "# pipefb plan, written by pipefb_plan. `pipefb_train --config <config> --plan <this>`\n"
       "# runs it. Layers are [first, last); devices are cluster device indices; bytes are\n"
       "# per device. Format: docs/planner.md.\n";
  o << "version: 1\n";
  o << "config: " << quote(ctx.config) << "\n";
  o << "model: " << quote(ctx.model) << "\n";
  o << "profile: " << quote(ctx.profile) << "\n";
  o << "cluster: " << quote(ctx.cluster) << "\n";
  o << "budget: " << sizeOrCapacity(ctx.budget) << "          # per device\n";
  o << "host_budget: "
    << (ctx.hostBudget < 0 ? std::string("cluster") : formatBytes(ctx.hostBudget)) << "\n";
  o << "layers: " << model.numLayers() << "\n";
  // Note [Half-precision training] (common/Precision.h); absent: fp32.
  if (model.profile().precision != Precision::FP32)
    o << "precision: " << toString(model.profile().precision) << "\n";
  o << "schedule: " << toString(sh.kind) << "\n";
  o << "family: " << plan.family << "\n";
  o << "microbatches: " << sh.microbatches << "\n";
  o << "microbatch_size: " << sh.microbatchSize << "\n";
  o << "batch: " << sh.replicas * sh.microbatches * sh.microbatchSize << "\n";
  o << "lookahead: " << sh.lookahead << "\n";
  if (sh.kind == ScheduleKind::PipeFbAsync)  // Note [Planned async lag]
    o << "async_lag: " << sh.lag()
      << "   # forwards of an iteration before the previous one's weights arrive\n";
  if (sh.replicas > 1)  // Note [Replicated pipelines]
    o << "replicas: " << sh.replicas
      << "   # copies of the pipeline, each on batch / replicas samples; devices are replica 0's\n";
  o << "stages:\n";
  for (size_t k = 0; k < plan.stages.size(); ++k) {
    const StagePlan& s = plan.stages[k];
    const StageEstimate& e = s.estimate;
    o << "  - layers: [" << s.first << ", " << s.last << "]   # "
      << layerRange(model.profile(), s.first, s.last) << "\n";
    o << "    forward_device: " << s.forwardDevice << "\n";
    o << "    backward_device: " << s.backwardDevice << "\n";
    o << "    policy: " << schedules::toString(s.policy) << "\n";
    o << "    optimizer: " << (s.optimizerOnHost ? "host" : "device")
      << "   # its state and master weights (host: pipeline.optimizer_offload)\n";
    o << "    predicted:\n";
    o << "      forward_time: " << e.forwardTime << "      # s per microbatch\n";
    o << "      backward_time: " << e.backwardTime << "\n";
    o << "      step_time: " << e.stepShare
      << "      # the optimizer step's share per microbatch, on the backward device\n";
    o << "      pace: " << e.time << "              # set by " << toString(e.binding) << "\n";
    o << "      stash_bytes: " << e.stashBytes << "       # one stash; " << e.inFlight
      << " in flight\n";
    if (e.same) {
      o << "      memory: ";
      categories(o, e.backwardMemory, "");
      o << "\n";
    } else {
      o << "      forward_memory: ";
      categories(o, e.forwardMemory, "");
      o << "\n      backward_memory: ";
      categories(o, e.backwardMemory, "");
      o << "\n";
    }
  }
  o << "predicted:\n";
  o << "  iteration_time: " << plan.iterationTime << "    # s, cost model\n";
  if (plan.simulated)
    o << "  simulated_iteration_time: " << plan.simIterationTime << "    # s, event simulator\n";
  o << "  throughput: " << plan.throughput << "    # samples/s\n";
  // Note [Planned reserve]: each peak below holds its device's reserve.
  o << "  reserve_per_mille: " << model.cluster().reservePerMille
    << "    # of each device's charged bytes, for scratch and rounding no profile shows\n";
  o << "  reserve_bytes: [";
  for (size_t d = 0; d < plan.deviceReserve.size(); ++d)
    o << (d ? ", " : "") << plan.deviceReserve[d];
  o << "]    # in peak_memory\n";
  o << "  peak_memory: [";
  for (size_t d = 0; d < plan.deviceMemory.size(); ++d)
    o << (d ? ", " : "") << plan.deviceMemory[d];
  o << "]\n";
  if (plan.simulated) {
    o << "  simulated_peak_memory: [";
    for (size_t d = 0; d < plan.simPeak.size(); ++d) o << (d ? ", " : "") << plan.simPeak[d];
    o << "]\n";
  }
  o << "  host_pool: " << plan.hostBytes << "\n";
  o << "# The same pipeline as config keys (one stash policy for all stages is all the\n"
       "# config can say; the plan's per-stage policies win):\n";
  o << "overrides:\n";
  o << "  - pipeline.schedule=" << toString(sh.kind) << "\n";
  o << "  - pipeline.stages=" << sh.stages << "\n";
  o << "  - pipeline.microbatches=" << sh.microbatches << "\n";
  o << "  - pipeline.lookahead=" << sh.lookahead << "\n";
  if (sh.kind == ScheduleKind::PipeFbAsync) o << "  - pipeline.async_lag=" << sh.lag() << "\n";
  o << "  - devices.count=" << sh.chainLength() << "\n";
  {  // Note [Folded placements], Note [Decoupled partitions]: any placement but the default
    std::vector<schedules::StagePlacement> v;
    for (const StagePlan& st : plan.stages) v.push_back({st.forwardDevice, st.backwardDevice});
    const schedules::Placement placement(std::move(v));
    if (!(placement == schedules::Placement::defaultFor(sh.kind, sh.stages)))
      o << "  - pipeline.placement=" << placement.toString() << "\n";
  }
  if (sh.replicas > 1) o << "  - pipeline.replicas=" << sh.replicas << "\n";
  {
    PlanSpec spec;  // Note [Optimizer placement search]: the runtime's per-stage list
    for (const StagePlan& st : plan.stages) {
      PlanStage ps;
      ps.optimizerOnHost = st.optimizerOnHost;
      spec.stages.push_back(ps);
    }
    const std::vector<std::string> opt = spec.optimizerOffload();
    std::string v;
    for (const auto& x : opt) v += (v.empty() ? "" : ",") + x;
    o << "  - pipeline.optimizer_offload=" << (opt.size() > 1 ? "[" + v + "]" : v) << "\n";
  }
  std::ostringstream part;
  for (size_t k = 1; k < plan.stages.size(); ++k)
    part << (k > 1 ? "," : "") << plan.stages[k].first;
  o << "  - pipeline.partition=[" << part.str() << "]\n";
  return o.str();
}

void writePlanFile(const std::string& path, const CostModel& model, const Plan& plan,
                   const PlanContext& context) {
  std::ofstream out(path);
  if (!out) throw UserError("cannot write the plan file '" + path + "'");
  out << planToYaml(model, plan, context);
  if (!out) throw UserError("writing the plan file '" + path + "' failed");
}

schedules::Placement PlanSpec::placement() const {
  std::vector<schedules::StagePlacement> v;
  for (const PlanStage& st : stages) v.push_back({st.forwardDevice, st.backwardDevice});
  return schedules::Placement(std::move(v));
}

bool PlanSpec::folded() const {
  const int S = static_cast<int>(stages.size());
  if (!isSplit(parseScheduleKind(schedule)) || S < 2) return false;
  for (int k = 0; k < S; ++k)
    if (stages[k].backwardDevice != stages[S - 1 - k].forwardDevice) return false;
  return true;
}

namespace {
// Maximal runs of consecutive stages on one device, [first, last) with the device.
struct Run {
  int first = 0, last = 0, device = 0;
};
std::vector<Run> runsOf(const std::vector<PlanStage>& stages, bool backward) {
  std::vector<Run> out;
  for (int k = 0; k < static_cast<int>(stages.size()); ++k) {
    const int d = backward ? stages[k].backwardDevice : stages[k].forwardDevice;
    if (out.empty() || out.back().device != d) out.push_back({k, k, d});
    out.back().last = k + 1;
  }
  return out;
}
}  // namespace

bool PlanSpec::decoupled() const {
  if (!isSplit(parseScheduleKind(schedule)) || folded()) return false;
  return runsOf(stages, false).size() < stages.size() ||
         runsOf(stages, true).size() < stages.size();
}

std::vector<std::string> PlanSpec::optimizerOffload() const {
  std::vector<std::string> out;
  bool uniform = true;
  for (const PlanStage& st : stages) {
    out.push_back(st.optimizerOnHost ? "host" : "none");
    uniform = uniform && st.optimizerOnHost == stages.front().optimizerOnHost;
  }
  if (uniform && !out.empty()) out.resize(1);
  return out;
}

std::vector<std::int64_t> PlanSpec::partition() const {
  std::vector<std::int64_t> out;
  for (size_t k = 1; k < stages.size(); ++k) out.push_back(stages[k].first);
  return out;
}

PlanSpec parsePlan(const std::string& yaml, const std::string& source) {
  YAML::Node n;
  try {
    n = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    throw UserError(source + ": not valid YAML: " + e.what());
  }
  if (!n.IsMap())
    throw UserError(source +
                    ": not a plan file (expected a YAML mapping with version, "
                    "schedule, stages, ...; write one with pipefb_plan -o)");
  auto need = [&](const char* k) {
    if (!n[k]) throw UserError(source + ": plan file without '" + std::string(k) + "'");
    return n[k];
  };
  PlanSpec p;
  try {
    if (need("version").as<int>() != 1)
      throw UserError(source + ": version: only plan files of version 1 are known");
    if (n["model"]) p.model = n["model"].as<std::string>();
    if (n["profile"]) p.profile = n["profile"].as<std::string>();
    if (n["precision"]) {  // Note [Half-precision training]; absent: fp32
      p.precision = precisionIn(n["precision"].as<std::string>(), source);
    }
    p.schedule = need("schedule").as<std::string>();
    const ScheduleKind kind = parseScheduleKind(p.schedule);
    p.microbatches = need("microbatches").as<int>();
    p.microbatchSize = need("microbatch_size").as<std::int64_t>();
    p.batch = need("batch").as<std::int64_t>();
    p.lookahead = n["lookahead"] ? n["lookahead"].as<int>() : 1;
    p.replicas = n["replicas"] ? n["replicas"].as<int>() : 1;
    if (n["async_lag"]) {  // Note [Planned async lag]
      p.asyncLag = n["async_lag"].as<int>();
      if (kind != ScheduleKind::PipeFbAsync)
        throw UserError(source + ": async_lag: only pipefb-async plans have one; this plan is " +
                        p.schedule);
    }
    if (p.replicas < 1 || p.replicas > 1024)
      throw UserError(source + ": replicas must be in [1, 1024], got " +
                      std::to_string(p.replicas));
    p.numLayers = need("layers").as<int>();
    // The bound on microbatch_size keeps the product from overflowing (a signed-overflow
    // UB, seen under fuzz/PlanFuzzer's UBSan with microbatch_size: 4611686018427387904).
    if (p.microbatches < 1 || p.microbatchSize < 1 ||
        p.microbatchSize > std::numeric_limits<std::int64_t>::max() / p.microbatches ||
        p.microbatches * p.microbatchSize > std::numeric_limits<std::int64_t>::max() / p.replicas ||
        p.batch != p.replicas * p.microbatches * p.microbatchSize)
      throw UserError(source +
                      ": batch must equal microbatches x microbatch_size x replicas (got " +
                      std::to_string(p.batch) + ", " + std::to_string(p.microbatches) + " x " +
                      std::to_string(p.microbatchSize) + " x " + std::to_string(p.replicas) + ")");
    if (p.asyncLag && (*p.asyncLag < 0 || *p.asyncLag > p.microbatches))
      throw UserError(source + ": async_lag must be in [0, microbatches = " +
                      std::to_string(p.microbatches) + "], got " + std::to_string(*p.asyncLag));
    int expect = 0;
    for (const auto& s : need("stages")) {
      PlanStage st;
      st.first = s["layers"][0].as<int>();
      st.last = s["layers"][1].as<int>();
      st.forwardDevice = s["forward_device"].as<int>();
      st.backwardDevice = s["backward_device"].as<int>();
      st.policy = schedules::parseStashPolicy(s["policy"].as<std::string>());
      if (s["optimizer"]) {  // Note [Optimizer placement search]; absent: the device
        const std::string where = s["optimizer"].as<std::string>();
        if (where != "host" && where != "device")
          throw UserError(source + ": stages[" + std::to_string(p.stages.size()) +
                          "].optimizer: unknown value '" + where + "'; allowed: device | host");
        st.optimizerOnHost = where == "host";
        p.optimizerGiven = true;
      }
      // The step's share per microbatch; plan files before it do not say (0).
      if (s["predicted"] && s["predicted"]["step_time"])
        st.predictedStepTime = s["predicted"]["step_time"].as<double>();
      if (st.first != expect || st.last <= st.first)
        throw UserError(source + ": stages[" + std::to_string(p.stages.size()) +
                        "].layers must start at " + std::to_string(expect) +
                        " and be non-empty; got [" + std::to_string(st.first) + ", " +
                        std::to_string(st.last) + "]");
      if (!isSplit(kind) && st.forwardDevice != st.backwardDevice)
        throw UserError(source + ": stages[" + std::to_string(p.stages.size()) +
                        "]: " + p.schedule + " runs forward and backward on the same device");
      expect = st.last;
      p.stages.push_back(st);
    }
    // PipeFB: Placement::checkFor's rule (Note [Folded placements]).
    if (isSplit(kind))
      p.placement().checkFor(p.schedule, schedules::kMaxDevices, source + ": stages");
    if (expect != p.numLayers)
      throw UserError(source + ": the stages cover layers [0, " + std::to_string(expect) +
                      ") but the model has " + std::to_string(p.numLayers));
    if (n["predicted"]) {
      if (n["predicted"]["iteration_time"])
        p.predictedIterationTime = n["predicted"]["iteration_time"].as<double>();
      if (n["predicted"]["peak_memory"])
        for (const auto& v : n["predicted"]["peak_memory"])
          p.predictedPeak.push_back(v.as<std::int64_t>());
    }
    if (n["overrides"])
      for (const auto& v : n["overrides"]) p.overrides.push_back(v.as<std::string>());
  } catch (const YAML::Exception& e) {
    throw UserError(source + ": malformed plan file: " + e.what());
  }
  return p;
}

std::string readPlanText(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UserError("plan file '" + path + "' cannot be read (does it exist?)");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

PlanSpec readPlanFile(const std::string& path) { return parsePlan(readPlanText(path), path); }

Plan planFromSpec(const CostModel& model, const PlanSpec& spec) {
  if (spec.numLayers != model.numLayers())
    throw UserError("the plan has " + std::to_string(spec.numLayers) + " layers, the model " +
                    std::to_string(model.numLayers()));
  Plan p;
  p.family = spec.schedule;
  p.shape.kind = parseScheduleKind(spec.schedule);
  p.shape.stages = static_cast<int>(spec.stages.size());
  p.shape.microbatches = spec.microbatches;
  p.shape.microbatchSize = spec.microbatchSize;
  p.shape.lookahead = spec.lookahead;
  p.shape.asyncLag = spec.asyncLag.value_or(-1);
  p.shape.replicas = spec.replicas;
  p.shape.folded = spec.folded();
  const int S = p.shape.stages;
  if (spec.decoupled()) {  // Note [Decoupled search]: the ranges and their devices
    const auto fr = runsOf(spec.stages, false), br = runsOf(spec.stages, true);
    PipelineShape& sh = p.shape;
    sh.forwardDevices = static_cast<int>(fr.size());
    sh.backwardDevices = static_cast<int>(br.size());
    sh.chain.assign(sh.chainLength(), 0);
    sh.forwardRange.assign(S, 0);
    sh.backwardRange.assign(S, 0);
    for (size_t a = 0; a < fr.size(); ++a) {
      sh.chain[a] = fr[a].device;
      for (int k = fr[a].first; k < fr[a].last; ++k) sh.forwardRange[k] = static_cast<int>(a);
    }
    for (size_t r = 0; r < br.size(); ++r) {
      sh.chain[sh.chainLength() - 1 - r] = br[r].device;
      for (int k = br[r].first; k < br[r].last; ++k) sh.backwardRange[k] = static_cast<int>(r);
    }
  } else {
    p.shape.chain.assign(p.shape.chainLength(), 0);
  }
  for (int k = 0; k < S; ++k) {
    if (!spec.decoupled()) {
      p.shape.chain[p.shape.position(k)] = spec.stages[k].forwardDevice;
      if (isSplit(p.shape.kind) && !p.shape.folded)
        p.shape.chain[2 * S - 1 - k] = spec.stages[k].backwardDevice;
    }
    StagePlan sp;
    sp.first = spec.stages[k].first;
    sp.last = spec.stages[k].last;
    sp.policy = spec.stages[k].policy;
    sp.optimizerOnHost = spec.stages[k].optimizerOnHost;
    p.stages.push_back(sp);
  }
  for (int d : p.shape.chain)
    if (d < 0 || d >= model.cluster().numDevices())
      throw UserError("the plan uses device " + std::to_string(d) + " but the cluster has " +
                      std::to_string(model.cluster().numDevices()));
  evaluatePlan(model, p);
  return p;
}

}  // namespace pipefb::planner
