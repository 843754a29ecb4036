// From config + flags to a cost model (Setup.h).
#include "pipefb/planner/Setup.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "pipefb/common/Error.h"
#include "pipefb/planner/AnalyticProfile.h"
#include "pipefb/planner/DetectedCluster.h"
#include "pipefb/planner/PipeDreamProfile.h"
#include "pipefb/planner/ProfileFile.h"
#include "pipefb/topology/Topology.h"

namespace pipefb::planner {

namespace {
// A profile of another model would plan nonsense; pipefb_profile writes "<model key>
// optimizer=..." as the model (Profiler.h). layers < 0: not known without the profile.
void checkProfileModel(const Profile& profile, const std::string& file, const std::string& key,
                       int layers, const config::Config& cfg) {
  const std::string& config = cfg.source;
  // Note [Autocast]: a profile measures one precision's bytes and times.
  if (toString(profile.precision) != cfg.training.precision)
    throw UserError("--profile: " + file + " was measured at " + toString(profile.precision) +
                    " but training.precision is " + cfg.training.precision +
                    "; profile it with: pipefb_profile --config " + config +
                    " --set training.precision=" + cfg.training.precision);
  if ((layers < 0 || profile.numLayers() == layers) &&
      profile.model.compare(0, key.size(), key) == 0 &&
      (profile.model.size() == key.size() || profile.model[key.size()] == ' '))
    return;
  throw UserError("--profile: " + file + " is for '" + profile.model + "' (" +
                  std::to_string(profile.numLayers()) + " layers), but the config's model is '" +
                  key + "'" + (layers >= 0 ? " (" + std::to_string(layers) + " layers)" : "") +
                  "; profile it with: pipefb_profile --config " + config);
}

// A profile with no model work to scale (PipeDream's, a torchscript model's): its times are
// taken as measured on the cluster's first device, and the others scale by their sustained
// FLOP rate.
std::vector<double> flopRateSpeeds(const std::vector<DeviceSpec>& devices, Precision precision) {
  std::vector<double> out;
  const DeviceSpec& ref = devices.front();
  for (const auto& d : devices)
    out.push_back((flopsAt(d, precision) * d.efficiency) /
                  (flopsAt(ref, precision) * ref.efficiency));
  return out;
}
}  // namespace

namespace fs = std::filesystem;

std::string configsDirFor(const std::string& configPath) {
  fs::path dir = fs::path(configPath).parent_path();
  if (!dir.empty() && fs::exists(dir / "devices")) return dir.string();
#ifdef PIPEFB_SOURCE_DIR
  return std::string(PIPEFB_SOURCE_DIR) + "/configs";
#else
  return "configs";
#endif
}

Planning setupPlanning(const config::Config& cfg, const SetupOptions& opt) {
  Planning pl;
  pl.config = cfg;
  const std::string configs = opt.configsDir.empty() ? configsDirFor(cfg.source) : opt.configsDir;
  const std::string devicesDir = configs + "/devices";
  if (!opt.cluster.empty()) {
    std::string path = opt.cluster;
    if (!fs::exists(path)) path = configs + "/clusters/" + opt.cluster + ".yaml";
    if (!fs::exists(path))
      throw UserError("--cluster: no file '" + opt.cluster + "' and no cluster named so in " +
                      configs + "/clusters");
    pl.clusterSpec = loadClusterSpec(path, devicesDir);
  } else {
    DeviceSpec spec = findDeviceSpec(opt.device, devicesDir);
    if (cfg.devices.memory)
      spec.memory = *cfg.devices.memory;
    else if (spec.name == "cpu")
      spec.memory = std::int64_t(1) << 50;  // unlimited domain
    const std::int64_t hostPool = cfg.devices.host_memory ? *cfg.devices.host_memory : -1;
    if (spec.name == "cpu") {
      // Virtual CPU devices on this machine: the detected cluster (Note [Detected cluster]);
      // NUMA-aware links only when devices.bind ties each device to a core.
      DetectedClusterOptions d;
      d.devices = static_cast<int>(cfg.devices.count);
      d.hostPool = hostPool;
      d.numaLinks = cfg.devices.bind == "cores";
      pl.clusterSpec = detectedClusterSpec(topology::machine(), spec, d);
    } else {
      pl.clusterSpec = uniformClusterSpec(spec, static_cast<int>(cfg.devices.count),
                                          Link{spec.pcieBandwidth, spec.hostLatency}, hostPool);
    }
  }
  const OptimizerMemory optimizer =
      optimizerMemory(cfg.training.optimizer, cfg.training.momentum, cfg.training.weight_decay);
  // Note [Half-precision training] (common/Precision.h): every device needs a FLOP rate at
  // the precision; a measured profile is fp32.
  const Precision precision = parsePrecision(cfg.training.precision).value_or(Precision::FP32);
  for (const auto& d : pl.clusterSpec.devices) flopsAt(d, precision);
  const std::int64_t mb = opt.profileMicrobatch > 0 ? opt.profileMicrobatch : 1;
  std::string profileText;
  if (!opt.profile.empty()) {
    std::ifstream in(opt.profile);
    if (!in)
      throw UserError("--profile: file '" + opt.profile + "' cannot be read (does it exist?)");
    std::stringstream ss;
    ss << in.rdbuf();
    profileText = ss.str();
  }
  Profile profile;
  std::vector<double> speeds;
  if (!opt.profile.empty() && isPipeDreamGraph(profileText)) {
    // Note [PipeDream profiles]: no zoo model; the config gives the batch and the optimizer.
    if (precision != Precision::FP32)
      throw UserError("--profile " + opt.profile +
                      ": a PipeDream profile is fp32 but "
                      "training.precision is " +
                      cfg.training.precision + "; allowed with it: fp32");
    PipeDreamImport imp;
    imp.batch = opt.profileBatch;
    imp.optimizer = optimizer;
    imp.device = pl.clusterSpec.devices.front().name;
    profile = importPipeDreamProfile(profileText, opt.profile, imp);
    pl.profileText = "pipedream " + opt.profile;
    speeds = flopRateSpeeds(pl.clusterSpec.devices, precision);
  } else if (cfg.model.name == "torchscript") {
    // Note [TorchScript models] (model/Model.h): no analytic profile, and the planner does
    // not load the file: its layers are the measured profile's.
    if (opt.profile.empty())
      throw UserError(
          "--profile: model.name torchscript has no analytic profile; measure one "
          "with pipefb_profile --config " +
          cfg.source + " and pass it with --profile");
    profile = parseProfile(profileText, opt.profile);
    pl.profileText = "measured " + opt.profile;
    checkProfileModel(profile, opt.profile, model::modelKey(cfg.model), -1, cfg);
    speeds = flopRateSpeeds(pl.clusterSpec.devices, precision);
  } else {
    const ModelWork work = modelWork(cfg.model);
    if (!opt.profile.empty()) {
      profile = parseProfile(profileText, opt.profile);
      pl.profileText = "measured " + opt.profile;
      // A profile of another model would plan nonsense; pipefb_profile writes
      // "<modelWork key> optimizer=..." as the model (Profiler.h).
      checkProfileModel(profile, opt.profile, work.model, static_cast<int>(work.layers.size()),
                        cfg);
    } else {
      profile = analyticProfile(work, mb, pl.clusterSpec.devices.front(), optimizer, precision);
      pl.profileText = "analytic " + pl.clusterSpec.devices.front().name;
    }
    speeds = analyticSpeeds(work, mb, pl.clusterSpec.devices, precision);
  }
  Cluster cluster = pl.clusterSpec.toCluster(speeds);
  cluster.reservePerMille = kPlannedReservePerMille;  // Note [Planned reserve] (CostModel.h)
  // Virtual CPU devices share this machine's cores (Note [Shared cores] in CostModel.h): the
  // detected ones (hwloc cores this process may use), or --cores.
  if (opt.cluster.empty() && pl.clusterSpec.devices.front().name == "cpu" && opt.cores >= 0)
    cluster.cores = opt.cores;
  // Note [Devices and processes]: which devices share a process decides which stash
  // policies a split stage may take.
  if (opt.processes == "one") {
    for (auto& d : cluster.devices) d.process = 0;
  } else if (opt.processes == "per_device") {
    cluster.processPerDevice();
  } else if (opt.processes == "auto") {
    const char* ws = std::getenv("WORLD_SIZE");  // torchrun's convention (ProcessGroup.h)
    if (pl.clusterSpec.processes.empty() && ws != nullptr && std::atoi(ws) > 1)
      cluster.processPerDevice();
  } else {
    throw UserError("--processes: unknown value '" + opt.processes +
                    "'; allowed: auto | one | per_device");
  }
  pl.model = std::make_unique<CostModel>(profile, std::move(cluster));
  pl.solver.batch = cfg.training.batch;
  pl.solver.lookahead = static_cast<int>(cfg.pipeline.lookahead);
  pl.solver.asyncLag = static_cast<int>(cfg.pipeline.async_lag);  // Note [Planned async lag]
  // Note [Optimizer placement search]: the config's placement; a list that mixes host and
  // none lets the planner choose per stage.
  const auto& perStage = cfg.pipeline.stage_optimizer_offload;
  const bool anyHost = cfg.pipeline.optimizer_offload == "host";
  const bool allHost = anyHost && std::all_of(perStage.begin(), perStage.end(),
                                              [](const std::string& v) { return v == "host"; });
  pl.solver.optimizerOffload = !anyHost  ? OptimizerOffload::None
                               : allHost ? OptimizerOffload::Host
                                         : OptimizerOffload::PerStage;
  return pl;
}

}  // namespace pipefb::planner
