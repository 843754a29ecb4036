// pipefb_train --config configs/vgg16.yaml [--set section.key=value ...] [--plan plan.yaml]
//
// --plan: a plan file written by pipefb_plan sets the pipeline (schedule, stages,
// partition, microbatches, stash policy, lookahead, devices.count; TrainPlan.h). Without
// it, a pipeline schedule with no pipeline.partition runs the planner's partition for the
// configured shape (pipeline.partition_by: planner, the default), from a measured profile
// (Note [Planner partition in pipefb_train]); `params` keeps the runtime's parameter-bytes
// balance.
//
// --resume RUN_DIR: continues the run in RUN_DIR from its latest complete checkpoint
// (training.checkpoint_every; pipefb/train/Checkpoint.h), with the run's config.yaml
// unless --config is given; --set and --plan apply on top, so a run may resume under
// another partition, stage count or placement. The run folder stays RUN_DIR.
//
// PIPEFB_TEST_FAULT (tests only): kill-after-step:N (SIGKILL after step N and its
// checkpoint), kill-before-manifest:N (SIGKILL inside step N's checkpoint, before its
// manifest), nan-input:N (NaN in step N's input batch).
//
// Exit codes: 0 success; 2 bad input (config, flag, data or plan file), with one line on
// stderr naming the key or file; 1 any other failure (out of memory, numerical).
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <system_error>

#include "pipefb/common/Program.h"
#include "pipefb/common/Size.h"
#include "pipefb/common/Suggest.h"
#include "pipefb/config/Config.h"
#include "pipefb/dist/ProcessGroup.h"
#include "pipefb/planner/ConfigPartition.h"
#include "pipefb/planner/Explain.h"
#include "pipefb/planner/PlanFile.h"
#include "pipefb/planner/Profiler.h"
#include "pipefb/planner/Setup.h"
#include "pipefb/planner/Solver.h"
#include "pipefb/planner/TrainPlan.h"
#include "pipefb/runtime/DeviceKind.h"
#include "pipefb/runtime/Partition.h"
#include "pipefb/schedules/Placement.h"
#include "pipefb/schedules/ScheduleKind.h"
#include "pipefb/train/Trainer.h"

namespace {

// Note [Planner partition in pipefb_train]: the runtime would balance parameter bytes,
// which puts VGG's conv layers (little weight, most of the time and activations) in one
// stage. The planner's DP balances the cost model's stage time under devices.memory, on
// the profile pipefb_profile measures for this config (its cache file, measured and
// written there on first use; a few seconds for VGG16 at width 1/4). The analytic profile
// is a roofline estimate for devices we cannot run on; on the CPU it misjudged the
// two-stage 1f1b VGG16 cut (runtime_bench 4 10: [0,9) [9,16), F+B of 18.9 ms per
// microbatch plus the 6.2 ms step on stage 1 against 10.2 ms on stage 0). With one process
// per device rank 0 measures while the others wait at a barrier, and every rank then
// reads the same cache file, so they plan the same partition.
// Returns the plan as pipefb_plan writes it (for RUN_DIR/plan.yaml).
// The config's measured profile file, measured and cached on first use (by rank 0 while
// the others wait, with one process per device).
std::string cachedProfile(const pipefb::config::Config& config, pipefb::dist::ProcessGroup* group) {
  using namespace pipefb::planner;
  const std::string cached = defaultProfilePath(profileHeader(config, ProfilerOptions{}));
  if (group == nullptr || group->rank() == 0) {
    if (!std::filesystem::exists(cached))
      spdlog::info("pipeline: measuring the model's profile for the planner (once; cached in {})",
                   cached);
    loadOrMeasureProfile(config, ProfilerOptions{}, cached);
  }
  if (group != nullptr) group->barrier();
  return cached;
}

// Note [No fit before the profile]
// No fit, no start, and fast: the first run of a config measures its profile (38 s for
// VGG16 at width 1 on two cores), and only then did the planner find that nothing fits
// devices.memory. The smallest budget of a plan at the config's microbatch depends on
// bytes alone, so before the full profile pipefb_train measures the bytes at that
// microbatch only, with analytic times (one run per layer, no other sizes: 6 s there),
// and plans on them: nothing fits, it exits 2 naming the smallest budget; something does,
// it measures the full profile and plans on that. Only when devices.memory is set and the
// full profile is not cached yet (a cached one answers in well under a second).
class QuickProfile {
 public:
  static std::optional<QuickProfile> forFitCheck(const pipefb::config::Config& config) {
    using namespace pipefb::planner;
    // Replicas run at batch / (M x R), a size the quick profile has no bytes for.
    if (!config.devices.memory || config.pipeline.replicas > 1) return std::nullopt;
    if (std::filesystem::exists(defaultProfilePath(profileHeader(config, ProfilerOptions{}))))
      return std::nullopt;
    ProfilerOptions o;
    o.times = "analytic";
    o.warmup = 0;
    o.repeats = 1;
    o.otherSizes = false;
    QuickProfile q;
    try {
      q.path_ = (std::filesystem::temp_directory_path() /
                 ("pipefb-fit-check-" + std::to_string(::getpid()) + ".yaml"))
                    .string();
      spdlog::info("pipeline: checking that a plan fits devices.memory on the model's bytes");
      loadOrMeasureProfile(config, o, q.path_, /*force=*/true);
    } catch (const std::exception& e) {
      // Only a plan that does not fit stops the run here; anything else the full profile
      // meets again, and reports, on its own.
      spdlog::debug("no quick fit check: {}", e.what());
      return std::nullopt;
    }
    return q;
  }
  QuickProfile(QuickProfile&& o) noexcept : path_(std::move(o.path_)) { o.path_.clear(); }
  QuickProfile(const QuickProfile&) = delete;
  QuickProfile& operator=(const QuickProfile&) = delete;
  QuickProfile& operator=(QuickProfile&&) = delete;
  ~QuickProfile() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  QuickProfile() = default;
  std::string path_;
};

// No fit, no start: the planner already knows the run would go out of memory, so the run
// stops before training. `what` says which plan or partition of which shape does not fit
// devices.memory; `minimalBudget` is the smallest per-device budget that fits (-1: none
// within the other limits, which `otherwise` then says how to lift).
[[noreturn]] void throwNoFit(const pipefb::config::Config& config, const std::string& what,
                             std::int64_t minimalBudget, const std::string& otherwise) {
  const std::string head = "devices.memory: " + what + " fits " +
                           pipefb::formatBytes(*config.devices.memory) + " per device";
  if (minimalBudget < 0) throw pipefb::UserError(head + ", " + otherwise);
  throw pipefb::UserError(head + "; the smallest budget that fits is " +
                          pipefb::formatBytes(minimalBudget) + " (" +
                          std::to_string(minimalBudget) +
                          " bytes): set devices.memory to at least that, or add devices, or "
                          "choose another pipeline.stash or pipeline.schedule");
}

// The planner's partition of `config` on `profile`, or the no-fit error when none fits
// devices.memory.
pipefb::planner::ConfigPartition partitionOrNoFit(pipefb::config::Config& config, int stages,
                                                  const std::string& profile,
                                                  const std::string& configPath) {
  using namespace pipefb::planner;
  ConfigPartition p = setPlannerPartition(config, stages, profile, configPath);
  if (!p.partition.withinLimits && config.devices.memory)
    throwNoFit(config,
               "no " + config.pipeline.schedule + "-" + config.pipeline.stash + " partition of " +
                   config.model.name + " into " + std::to_string(stages) + " stages on " +
                   std::to_string(config.devices.count) + " devices",
               p.partition.minimalBudget,
               "nor any budget within the host pool (devices.host_memory); raise "
               "devices.host_memory, or choose another pipeline.stash");
  return p;
}

std::string usePlannerPartition(pipefb::config::Config& config, const std::string& configPath,
                                pipefb::dist::ProcessGroup* group) {
  using namespace pipefb::planner;
  const int stages = pipefb::runtime::stagesFor(config);
  checkStagesFitLayers(config, stages);  // before the profile: cheap checks first
  if (group == nullptr)
    if (const auto quick = QuickProfile::forFitCheck(config)) {
      pipefb::config::Config probe = config;
      partitionOrNoFit(probe, stages, quick->path(), configPath);
    }
  const std::string cached = cachedProfile(config, group);
  const ConfigPartition p = partitionOrNoFit(config, stages, cached, configPath);
  spdlog::info(
      "pipeline: partition by the planner ({} profile): {}; predicted {} per iteration, peak {}"
      "{} (pipeline.partition_by: params for the parameter-bytes balance)",
      p.profileText, rangesText(p.partition.plan),
      pipefb::planner::formatSeconds(p.partition.plan.iterationTime),
      pipefb::formatBytes(p.partition.plan.peakMemory),
      p.partition.withinLimits ? "" : "; nothing fits devices.memory, planned without it");
  return p.planYaml;
}

// The whole plan of `config` on `profile`; the no-fit error when none fits devices.memory.
pipefb::planner::WholePlan wholePlanOrNoFit(const pipefb::config::Config& config,
                                            const std::string& profile,
                                            const std::string& configPath) {
  using namespace pipefb::planner;
  WholePlan p = planWholePipeline(config, profile, configPath);
  if (p.planYaml.empty() && config.devices.memory)
    throwNoFit(config,
               "no " + config.pipeline.schedule + "-" + config.pipeline.stash + " plan of " +
                   config.model.name + " on " + std::to_string(config.devices.count) +
                   " devices with " + std::to_string(config.pipeline.microbatches) +
                   " microbatches",
               p.minimalBudget,
               "nor any budget within the devices' capacities; add devices, or choose another "
               "pipeline.stash or pipeline.schedule");
  return p;
}

// Note [The planner's whole plan in pipefb_train] (planner/ConfigPartition.h): the plan
// pipefb_plan writes for the config's schedule, stash and microbatches, on the same cached
// profile as usePlannerPartition. Returns "" when nothing fits devices.memory.
std::string useWholePlan(const pipefb::config::Config& config, const std::string& configPath) {
  using namespace pipefb::planner;
  if (const auto quick = QuickProfile::forFitCheck(config))
    wholePlanOrNoFit(config, quick->path(), configPath);
  const WholePlan p = wholePlanOrNoFit(config, cachedProfile(config, nullptr), configPath);
  if (p.planYaml.empty())
    spdlog::info("pipeline: no {} plan fits devices.memory; planning the partition alone",
                 config.pipeline.schedule);
  else
    spdlog::info(
        "pipeline: planned by the planner ({} profile): {} (as pipefb_plan --schedules {}-{} "
        "--microbatches {}; set pipeline.placement or pipeline.stages to choose the shape)",
        p.profileText, p.summary, config.pipeline.schedule, config.pipeline.stash,
        config.pipeline.microbatches);
  return p.planYaml;
}

// Note [Closing lines]: what 1f1b with `keep` (every stash stays on its device) would
// need per device on the same devices, batch and microbatches, by the planner's cost
// model (the memory-minimal 1f1b-keep plan, analytic or cached profile, no budget).
// Returns nullopt for a single device or when nothing fits.
std::optional<std::int64_t> keepBaselinePeak(pipefb::config::Config config,
                                             const std::string& configPath) {
  using namespace pipefb::planner;
  if (config.pipeline.schedule == "none" || config.devices.count < 2) return std::nullopt;
  config.devices.memory = std::nullopt;  // what it would need, not what fits
  SetupOptions setup;
  setup.profileMicrobatch = config.training.batch / config.pipeline.microbatches;
  const std::string cached = defaultProfilePath(profileHeader(config, ProfilerOptions{}));
  if (std::filesystem::exists(cached)) setup.profile = cached;
  Planning planning = setupPlanning(config, setup);
  SolverOptions o = planning.solver;
  o.schedules = parseScheduleFamilies({"1f1b-keep"});
  o.objective = Objective::Memory;
  o.microbatches = static_cast<int>(config.pipeline.microbatches);
  o.simulateTop = 0;
  SolveResult r = solve(*planning.model, o);
  if (!r.feasible) return std::nullopt;
  return r.best.peakMemory;
}

// The run's closing lines (Note [Closing lines]): each device's peak against its budget,
// the 1f1b-keep prediction, samples/s and the report.
void printClosingLines(const pipefb::train::RunSummary& s, const std::string& schedule,
                       const std::string& stash, std::optional<std::int64_t> keepPeak) {
  using pipefb::formatBytes;
  std::int64_t largestBudget = -1;
  std::cout << "peak memory per device (" << schedule << ", stash " << stash << "):\n";
  for (const auto& d : s.devices) {
    std::cout << "  " << d.name << "  " << formatBytes(d.peak_bytes);
    if (d.capacity_bytes >= 0) {
      std::cout << " of " << formatBytes(d.capacity_bytes) << " ("
                << 100 * d.peak_bytes / std::max<std::int64_t>(1, d.capacity_bytes) << "%)";
      if (d.name != "host") largestBudget = std::max(largestBudget, d.capacity_bytes);
    }
    std::cout << "\n";
  }
  if (keepPeak) {
    std::cout << "1f1b with keep on the same devices would need " << formatBytes(*keepPeak)
              << " on its fullest device (the planner's prediction)";
    if (largestBudget >= 0)
      std::cout << (*keepPeak > largestBudget ? ", more than the budget of "
                                              : ", within the budget of ")
                << formatBytes(largestBudget);
    std::cout << "\n";
  }
  std::printf("%.1f samples/s over %lld steps\n", s.throughput_samples_per_s,
              static_cast<long long>(s.steps));
  std::cout << "report: " << s.run_dir << "/report.html\n";
}

// PIPEFB_TEST_FAULT=kind:step (see the top of this file).
pipefb::train::TrainerHooks faultHooks() {
  pipefb::train::TrainerHooks hooks;
  const char* env = std::getenv("PIPEFB_TEST_FAULT");
  if (env == nullptr || *env == 0) return hooks;
  const std::string text = env;
  const auto colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  int64_t at = -1;
  try {
    if (colon != std::string::npos) at = std::stoll(text.substr(colon + 1));
  } catch (const std::exception&) {
  }
  if (at < 1 ||
      (kind != "kill-after-step" && kind != "kill-before-manifest" && kind != "nan-input"))
    throw pipefb::UserError("PIPEFB_TEST_FAULT: '" + text +
                            "' is not a fault; allowed: kill-after-step:N, "
                            "kill-before-manifest:N, nan-input:N (N >= 1)");
  if (kind == "kill-after-step")
    hooks.afterStep = [at](int64_t step) {
      if (step == at) std::raise(SIGKILL);
    };
  if (kind == "kill-before-manifest")
    hooks.beforeManifest = [at](int64_t step) {
      if (step == at) std::raise(SIGKILL);
    };
  if (kind == "nan-input")
    hooks.beforeStep = [at](int64_t step, pipefb::data::Batch& batch) {
      if (step == at && batch.input.is_floating_point())
        batch.input = batch.input.clone().fill_(std::numeric_limits<float>::quiet_NaN());
    };
  return hooks;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pipefb_train: pipeline-parallel training for devices short of memory"};
  std::string configPath, planPath, resumeDir;
  std::vector<std::string> overrides;
  pipefb::addConfigOptions(app, configPath, overrides);
  app.get_option("--config")->required(false);
  app.add_option("--resume", resumeDir,
                 "continue the run in RUN_DIR from its latest complete checkpoint (its "
                 "config.yaml unless --config is given)");
  app.add_option("--plan", planPath,
                 "plan file from pipefb_plan: sets schedule, stages, partition, microbatches, "
                 "stash policy, optimizer placement, lookahead and devices.count");
  return pipefb::runProgram("pipefb_train", app, argc, argv, [&] {
    std::string checkpoint;
    if (!resumeDir.empty()) {
      namespace fs = std::filesystem;
      while (resumeDir.size() > 1 && resumeDir.back() == '/') resumeDir.pop_back();
      if (!fs::is_directory(resumeDir))
        throw pipefb::UserError("--resume " + resumeDir + ": no such run folder");
      checkpoint = pipefb::train::latestCheckpoint(resumeDir);
      if (checkpoint.empty())
        throw pipefb::UserError(
            "--resume " + resumeDir + ": no complete checkpoint in " +
            pipefb::train::checkpointsDir(resumeDir) +
            " (one without manifest.json died mid-write); run with training.checkpoint_every: N "
            "to take checkpoints");
      if (configPath.empty()) configPath = resumeDir + "/config.yaml";
    } else if (configPath.empty()) {
      throw pipefb::UserError("--config is required (or --resume RUN_DIR); see --help");
    }
    pipefb::config::Config config = pipefb::config::loadConfig(configPath, overrides);
    if (!resumeDir.empty()) config.output.dir = resumeDir;
    pipefb::runtime::checkDeviceKind(config);  // Note [No silent fallback], before planning
    std::string planYaml;
    std::optional<pipefb::planner::PlanSpec> spec;
    if (!planPath.empty()) {
      planYaml = pipefb::planner::readPlanText(planPath);  // copied to RUN_DIR/plan.yaml
      spec = pipefb::planner::parsePlan(planYaml, planPath);
      pipefb::planner::applyPlan(config, *spec, planPath);  // may set pipeline.replicas
      // No fit, no start: a plan whose planned peak is over a device's budget would go out
      // of memory; say so before training.
      for (size_t d = 0; d < spec->predictedPeak.size(); ++d) {
        std::optional<std::int64_t> capacity = config.devices.memory;
        if (d < config.devices.device_memory.size() && config.devices.device_memory[d])
          capacity = config.devices.device_memory[d];
        const std::int64_t peak = spec->predictedPeak[d];
        if (!capacity || peak <= *capacity) continue;
        const std::int64_t need =
            *std::max_element(spec->predictedPeak.begin(), spec->predictedPeak.end());
        throw pipefb::UserError(planPath + ": device " + std::to_string(d) + "'s planned peak " +
                                pipefb::formatBytes(peak) + " (" + std::to_string(peak) +
                                " bytes) is over its " + "devices.memory " +
                                pipefb::formatBytes(*capacity) + "; set devices.memory to at " +
                                "least " + std::to_string(need) +
                                " bytes, or plan again for this budget (pipefb_plan --budget)");
      }
    }
    // One process per device (issue 8), under pipefb_launch or torchrun; checked before
    // anything is printed or planned.
    const auto env = pipefb::dist::envFromTorchrun();
    if (config.pipeline.schedule != "none")  // Note [Replicated pipelines]
      pipefb::runtime::checkProcesses(config.source, config.devices.count, config.pipeline.replicas,
                                      env && env->worldSize > 1 ? env->worldSize : 0);
    if (spec) {
      spdlog::info("plan {}: {} x {} stages, {} microbatches, stash {}, partition {}", planPath,
                   config.pipeline.schedule, config.pipeline.stages, config.pipeline.microbatches,
                   config.pipeline.stash,
                   pipefb::runtime::toString(pipefb::runtime::partitionFromCuts(
                       config.pipeline.partition, spec->numLayers)));
    }
    std::shared_ptr<pipefb::dist::ProcessGroup> group;
    if (env && env->worldSize > 1) {
      const std::string ws = "WORLD_SIZE=" + std::to_string(env->worldSize);
      if (config.pipeline.schedule == "none")
        throw pipefb::UserError(ws +
                                ": pipeline.schedule: none runs in one process; allowed "
                                "with one process per device: " +
                                pipefb::joinAllowed(pipefb::schedules::scheduleKindNames()));
      if (config.training.checkpoint_every > 0 || !resumeDir.empty())
        throw pipefb::UserError(ws + ": training.checkpoint_every: " +
                                std::to_string(config.training.checkpoint_every) +
                                " (and --resume) are not supported with one process per device "
                                "yet; allowed: 0");
      config.output.dir += "/rank" + std::to_string(env->rank);
      if (config.training.eval)
        spdlog::info(
            "distributed: a rank holds only its own stages' weights, so no test-set "
            "evaluation (training.eval off); its model.pt holds its own stages' weights");
      config.training.eval = false;
      group = pipefb::dist::makeGlooGroup(*env, {config.distributed.timeout});
    }
    if (planPath.empty() && config.pipeline.schedule != "none" &&
        config.pipeline.partition.empty() && config.pipeline.partition_by == "planner") {
      // Note [The planner's whole plan in pipefb_train] (planner/ConfigPartition.h); when
      // nothing fits devices.memory, the partition below, so the run names the OOM.
      if (!group && pipefb::planner::plansWholePipeline(config))
        planYaml = useWholePlan(config, configPath);
      if (!planYaml.empty()) {
        spec = pipefb::planner::parsePlan(planYaml, "the planner's plan");
        pipefb::planner::applyPlan(config, *spec, "the planner's plan");
      } else if (pipefb::planner::plannerPartitions(config, pipefb::runtime::stagesFor(config)))
        planYaml = usePlannerPartition(config, configPath, group.get());
      else
        spdlog::info(
            "pipeline: the planner does not partition {} (placement '{}', virtual_stages {}) "
            "by itself; partition balanced by parameter bytes (pipefb_plan, then --plan, "
            "plans it whole; or set pipeline.partition)",
            config.pipeline.schedule, config.pipeline.placement, config.pipeline.virtual_stages);
    }
    std::optional<std::int64_t> keepPeak;
    try {  // informational: a config the planner cannot model still trains
      if (!group) keepPeak = keepBaselinePeak(config, configPath);
    } catch (const std::exception& e) {
      spdlog::debug("no 1f1b-keep prediction: {}", e.what());
    }
    const std::string schedule = config.pipeline.schedule, stash = config.pipeline.stash;
    pipefb::train::Trainer trainer(std::move(config), faultHooks());
    trainer.setPlanYaml(std::move(planYaml));
    trainer.setProcessGroup(group);
    if (!checkpoint.empty()) trainer.resume(checkpoint);
    auto summary = trainer.run();
    if (summary.test_accuracy >= 0) std::cout << "test_accuracy " << summary.test_accuracy << "\n";
    if (!group) printClosingLines(summary, schedule, stash, keepPeak);
    return 0;
  });
}
