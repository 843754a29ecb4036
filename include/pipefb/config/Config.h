#pragma once
// The run configuration: one YAML file with sections model, data, training,
// devices, pipeline and output. Every key is declared once in a schema
// (src/config/Config.cpp) with its type, allowed values and range; the file and
// each `--set section.key=value` override go through the same checks. A bad key
// or value throws pipefb::UserError with one line naming the key, the YAML line
// where there is one, what it got and what is allowed.
//
// Torch-free, so the planner and the schedule tools can read configs too.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pipefb/data/DataOptions.h"
#include "pipefb/model/ModelOptions.h"
#include "pipefb/schedules/StashPolicy.h"

namespace pipefb::config {

struct TrainingOptions {
  std::string optimizer = "sgd";  // sgd | adam
  /// fp32 | bf16 | fp16: both train under autocast (Note [Autocast] in model/Model.h), fp16
  /// with dynamic loss scaling (Note [Loss scaling] in train/LossScaler.h).
  std::string precision = "fp32";
  /// fp16 only: the initial loss scale, and the steps without an overflow after which it
  /// doubles (torch.amp.GradScaler's init_scale and growth_interval).
  double loss_scale = 65536.0;
  int64_t loss_scale_window = 2000;
  double lr = 0.01;
  double momentum = 0.9;  // sgd
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999;     // adam
  std::string lr_schedule = "constant";  // constant | cosine | step
  int64_t warmup_steps = 0;
  int64_t step_every = 1000;  // step schedule: multiply by step_gamma every N steps
  double step_gamma = 0.1;
  double min_lr_ratio = 0.0;  // cosine: final lr = lr * min_lr_ratio
  int64_t batch = 64;         // global batch (samples per iteration)
  int64_t epochs = 1;
  int64_t iterations = 0;  // > 0 wins over epochs
  uint64_t seed = 0;
  int64_t log_every = 50;  // progress line every N steps
  int64_t eval_batch = 256;
  bool eval = true;              // test-set accuracy at the end
  int64_t threads = 0;           // intra-op threads; 0 = all cores
  bool checkpoint = true;        // write the final checkpoint
  int64_t checkpoint_every = 0;  // resumable checkpoint every N steps; 0 = off
  int64_t keep_checkpoints = 2;  // complete checkpoints kept in RUN_DIR/checkpoints
  bool deterministic = false;    // bitwise-reproducible runs (see README)
  /// off | loss | all: which values are checked for NaN/Inf (Note [Numerics check]).
  std::string check_numerics = "loss";
};

struct DevicesOptions {
  int64_t count = 1;
  std::string kind = "cpu";  // cpu (virtual devices) | cuda
  /// Per-device capacity in bytes; nullopt = unlimited. devices.memory is one size for
  /// every device, or a list with one per device (then `device_memory` holds them and
  /// `memory` is the smallest of them, for one-device runs and the planner).
  std::optional<int64_t> memory;
  std::vector<std::optional<int64_t>> device_memory;
  std::optional<int64_t> host_memory;  // host-pool capacity; nullopt = unlimited
  /// none | cores: pin each device's worker and copy-engine threads to a core
  /// (Note [Device binding], pipefb/topology/Binding.h).
  std::string bind = "none";
  /// Freed memory stays in the process and is reused, as a GPU's caching allocator does
  /// (Note [Keeping freed memory], pipefb/memory/FreedMemory.h); false: glibc's defaults.
  bool keep_freed_memory = true;
};

struct PipelineOptions {
  /// none | gpipe | 1f1b | pipedream | pipefb-sync | pipefb-async
  std::string schedule = "none";
  int64_t stages = 0;                    // 0 = derive from devices and schedule
  std::vector<int64_t> partition;        // explicit cut points (first layer of stages 1..S-1)
  std::string partition_by = "planner";  // without partition: planner | params
  int64_t microbatches = 1;
  /// keep | offload | checkpoint | checkpoint-offload: one for every stage, or a list with
  /// one per stage (then `stage_stash` holds them and `stash` is the first stage's).
  std::string stash = "keep";
  std::vector<std::string> stage_stash;
  /// Prefetch lookahead (pipeline.lookahead: one value, or a list with one per stage; then
  /// `lookahead` is their largest and `stage_lookahead` holds them).
  int64_t lookahead = 1;
  std::vector<int64_t> stage_lookahead;
  /// "" = the schedule's default; else "f/b f/b ...": forward/backward device per stage.
  std::string placement;
  /// interleaved-1f1b: stages per device v (stage s on device s mod S/v); 0 = the default
  /// (schedules::Placement::kDefaultVirtualStages). Other kinds take 0 only.
  int64_t virtual_stages = 0;
  /// pipefb-async: forwards of iteration k that run before the weights of iteration k-1
  /// arrive; -1 = all of them (microbatches), 0 = synchronous weights. The default 1 with
  /// linear prediction is what converges like 1f1b (experiments/README.md, async_convergence).
  int64_t async_lag = 1;
  /// pipefb-async: what the forward devices run on instead of the last weights (Note
  /// [Weight prediction] in PipelineEngine.cpp): auto (linear for pipefb-async, else none) |
  /// none | linear (W[v] + (W[v] - W[v-1])).
  std::string weight_prediction = "auto";
  /// The watchdog (EngineOptions::stallTimeoutSeconds): an iteration in which no device
  /// finishes an action for this many seconds fails, naming every device's action.
  double stall_timeout = 60.0;
  /// Stashed weight versions (pipedream; pipefb-async with a checkpoint kind) under an
  /// offload stash policy: auto (they go to the host pool between their last F and their B,
  /// Note [Weight-version offload] in schedules/Lowering.h) | none (they stay on the device).
  std::string offload_weights = "auto";
  /// Hybrid data + pipeline parallelism (issue 8): R copies of the pipeline, each on its
  /// own devices.count ranks, each on 1/R of the batch; stage gradients are averaged over
  /// the copies (AR before STEP). Needs one process per device (WORLD_SIZE = count x R).
  int64_t replicas = 1;
  /// Where each stage's optimizer runs (Note [Optimizer offload] in PipelineEngine.cpp):
  /// "none" (on its backward device) | "host" (ZeRO-Offload: Adam/SGD state and master
  /// weights in the host pool; STEP copies the gradients D2H and the new weights H2D).
  /// One value, or a list with one per stage (then `optimizer_offload` is "host" when any
  /// stage is and `stage_optimizer_offload` holds them).
  std::string optimizer_offload = "none";
  std::vector<std::string> stage_optimizer_offload;
};

/// One process per device (issue 8; pipefb/dist/ProcessGroup.h): the rendezvous and
/// every c10d transfer give up after `timeout` seconds (a dead or silent rank).
struct DistributedOptions {
  double timeout = 30.0;  // seconds
  /// pipeline.replicas: gradient all-reduce buckets of about this many MiB (DDP's default
  /// 25), started while backward runs (Note [Gradient buckets] in PipelineEngine.cpp).
  double bucket_mb = 25.0;
  /// false: every bucket starts at AR, after the backward (for comparison).
  bool overlap = true;
};

struct OutputOptions {
  std::string dir = "runs/latest";
  bool progress = true;
  /// trace.json's window (Note [Trace window] in Trainer.cpp): skip the first
  /// trace_skip steps (warm-up), then trace trace_steps steps. memory.json and the report
  /// keep the exact peaks of the whole run either way.
  int64_t trace_skip = 10;
  int64_t trace_steps = 10;
};

struct Config {
  model::ModelOptions model;
  data::DataOptions data;
  TrainingOptions training;
  DevicesOptions devices;
  PipelineOptions pipeline;
  DistributedOptions distributed;
  OutputOptions output;
  /// Where the config came from (file path, or "<string>").
  std::string source;
};

/// What a config is read for. The trainer runs the pipeline the config names, so every
/// cross-key rule applies. The planners (pipefb_plan, pipefb_sweep, pipefb_profile) choose
/// the schedule, stages, partition, placement and microbatches themselves: the rules that
/// tie those keys to devices.count (e.g. "pipeline.schedule none trains on one device") do
/// not apply, and devices.count is the cluster's size.
enum class ConfigUse { Train, Plan };

/// Loads and checks a config file, then applies `section.key=value` overrides in order.
Config loadConfig(const std::string& path, const std::vector<std::string>& overrides = {},
                  ConfigUse use = ConfigUse::Train);
/// Same, from YAML text (tests). `source` names it in error messages.
Config parseConfig(const std::string& yamlText, const std::vector<std::string>& overrides = {},
                   const std::string& source = "<string>", ConfigUse use = ConfigUse::Train);
/// Applies one `section.key=value` override to a config and re-checks it.
void applyOverride(Config& config, const std::string& assignment);
/// Cross-key checks (e.g. batch divisible by microbatches). Called by the loaders.
void validate(const Config& config, ConfigUse use = ConfigUse::Train);
/// The pipeline's stage count S: pipeline.stages, the partition's, the placement's, or
/// what the schedule's default placement puts on devices.count (Note [Stages per device]
/// in schedules/Placement.h), checked against devices.count (the placement's devices, or
/// the default placement's for S). UserError naming the key otherwise. Train use only.
int pipelineStages(const Config& config);
/// pipeline.virtual_stages with 0 resolved (schedules::Placement::kDefaultVirtualStages);
/// UserError when the schedule does not take the value given.
int virtualStages(const Config& config);

/// The resolved config as YAML, every key present; parseConfig(toYaml(c)) == c.
std::string toYaml(const Config& config);

/// Every known key as "section.key", for help text and "did you mean".
std::vector<std::string> knownKeys();

/// The schedules pipefb_train accepts (pipeline.schedule).
const std::vector<std::string>& scheduleNames();
/// The stash policies (pipeline.stash).
const std::vector<std::string>& stashPolicyNames();
/// Per stage of `stages`: pipeline.stash (one value for all, or the list with one per
/// stage; another length is a UserError naming the key).
std::vector<schedules::StashPolicy> stashPerStage(const Config& config, int stages);

}  // namespace pipefb::config
