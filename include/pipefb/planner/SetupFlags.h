#pragma once
// The command-line flags of SetupOptions, shared by pipefb_plan and pipefb_sweep.
#include <CLI/CLI.hpp>

#include "pipefb/planner/Setup.h"

namespace pipefb::planner {

inline void addSetupOptions(CLI::App& app, SetupOptions& setup) {
  app.add_option(
      "--cluster", setup.cluster,
      "cluster spec: a file or a name in configs/clusters (default: devices.count x --device)");
  app.add_option("--device", setup.device,
                 "device spec for a config-derived cluster (default cpu)");
  app.add_option("--profile", setup.profile,
                 "profile file from pipefb_profile, or a PipeDream graph.txt (told apart by its "
                 "content; default: analytic)");
  app.add_option("--profile-batch", setup.profileBatch,
                 "profiling batch of a PipeDream graph.txt (default: inferred from its Input node)")
      ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 40));
  app.add_option(
         "--cores", setup.cores,
         "cores the virtual cpu devices share; compute slows by cores/devices when "
         "more devices run (default: this machine's cores, detected by hwloc; 0: each device "
         "has its own)")
      ->check(CLI::Range(-1, 1 << 20));
  app.add_option("--processes", setup.processes,
                 "which devices share a process (a stage whose forward and backward devices are "
                 "in different processes can only checkpoint): auto (the cluster spec's, else "
                 "one per device when WORLD_SIZE > 1), one, per_device")
      ->check(CLI::IsMember({"auto", "one", "per_device"}));
}

/// The solver's search flags that pipefb_plan and pipefb_sweep both take.
struct SearchFlags {
  int maxMicrobatches = 64;
  int microbatches = 0;          // 0: search
  int simulateTop = 0;           // candidates re-scored with the simulator
  std::string optimizerOffload;  // "": the config's (Setup.cpp); none | host | per-stage
  void applyTo(SolverOptions& o) const {
    o.maxMicrobatches = maxMicrobatches;
    o.microbatches = microbatches;
    o.simulateTop = simulateTop;
    if (!optimizerOffload.empty())
      o.optimizerOffload = parseOptimizerOffload(optimizerOffload, "--optimizer-offload");
  }
};

/// --max-microbatches, --microbatches and --simulate-top; the help shows `flags`' defaults.
inline void addSearchOptions(CLI::App& app, SearchFlags& flags) {
  app.add_option("--max-microbatches", flags.maxMicrobatches,
                 "largest microbatch count tried (" + std::to_string(flags.maxMicrobatches) + ")");
  app.add_option("--microbatches", flags.microbatches,
                 "only this microbatch count (default: search)");
  app.add_option("--simulate-top", flags.simulateTop,
                 "re-score this many candidates with the simulator (" +
                     std::to_string(flags.simulateTop) + ")");
  app.add_option("--optimizer-offload", flags.optimizerOffload,
                 "where each stage's optimizer state and master weights may live: none (its "
                 "backward device), host (the host pool), per-stage (the planner chooses per "
                 "stage); default: the config's pipeline.optimizer_offload (a list with both: "
                 "per-stage)");
}

}  // namespace pipefb::planner
