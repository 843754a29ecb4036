#pragma once
// From a run config and the planner flags to a cost model: the profile (a profile file,
// or analytic from the device spec), the cluster (a cluster spec, or devices.count x a
// device spec with devices.memory as capacity; for the cpu spec, the detected cluster of
// Note [Detected cluster]) and the solver options. Shared by
// pipefb_plan and pipefb_sweep. Torch-free.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pipefb/config/Config.h"
#include "pipefb/planner/DeviceSpec.h"
#include "pipefb/planner/Solver.h"

namespace pipefb::planner {

struct SetupOptions {
  std::string cluster;         // cluster spec path or name in configs/clusters; "" = from config
  std::string device = "cpu";  // device spec used when no cluster is given
  std::string profile;         // profile file (pipefb's, or a PipeDream graph.txt); "" = analytic
  /// A PipeDream graph.txt's profiling batch; 0 = inferred (Note [PipeDream profiles]).
  std::int64_t profileBatch = 0;
  std::string configsDir;              // holds devices/ and clusters/ (default: next to the config)
  std::int64_t profileMicrobatch = 0;  // analytic profile microbatch; 0 = 1
  /// Cores the virtual CPU devices of a config-derived `cpu` cluster share (Note [Shared
  /// cores]): -1 = the detected ones (Note [Detected cluster]), 0 = not shared.
  int cores = -1;
  /// Note [Devices and processes] (Cluster.h): "one" (every device in one process),
  /// "per_device", or "auto": the cluster spec's `processes`, else one process per device
  /// when the run is multi-process (WORLD_SIZE > 1, as under pipefb_launch or torchrun),
  /// else one.
  std::string processes = "auto";
};

struct Planning {
  config::Config config;
  ClusterSpec clusterSpec;
  std::unique_ptr<CostModel> model;
  SolverOptions solver;     // batch, lookahead from the config; schedules empty (= all)
  std::string profileText;  // "analytic t4-16g", "measured <path>" or "pipedream <path>"
};

Planning setupPlanning(const config::Config& config, const SetupOptions& options);

/// "configs" directory for a config path: <dir of config>, or PIPEFB_SOURCE_DIR/configs.
std::string configsDirFor(const std::string& configPath);

}  // namespace pipefb::planner
