#pragma once
// The trainer behind pipefb_train. With pipeline.schedule "none" it trains on one
// device, accumulating gradients over pipeline.microbatches; this is also the
// reference the pipeline schedules are checked against (DESIGN.md, "Correctness").
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pipefb/config/Config.h"
#include "pipefb/data/Dataset.h"
#include "pipefb/model/Model.h"
#include "pipefb/train/Checkpoint.h"

namespace pipefb::memory {
class MemoryDomain;
}
namespace pipefb::runtime {
class PipelineEngine;
}
namespace pipefb::dist {
class ProcessGroup;
}

namespace pipefb::train {

struct DeviceSummary {
  std::string name;
  int64_t capacity_bytes = -1;  // -1 = unlimited
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;
  std::map<std::string, int64_t> peak_by_category;  // live bytes per category at the peak
};

struct RunSummary {
  int64_t steps = 0;
  int64_t samples = 0;
  double final_loss = 0;
  double test_accuracy = -1;  // -1 when not evaluated
  double test_loss = -1;
  double throughput_samples_per_s = 0;  // training samples / training seconds
  double wall_seconds = 0;
  std::vector<DeviceSummary> devices;
  std::string run_dir;
  std::string checkpoint;  // path of the final checkpoint ("" if none)
};

/// Fault injection for tests (pipefb_train reads them from PIPEFB_TEST_FAULT). Steps
/// are 1-based: the optimizer step being (or just) computed.
struct TrainerHooks {
  /// Before step `step` runs on `batch` (e.g. poison it with NaN).
  std::function<void(int64_t step, data::Batch& batch)> beforeStep;
  /// After step `step` and its checkpoint, if any (e.g. SIGKILL).
  std::function<void(int64_t step)> afterStep;
  /// Inside the checkpoint of `step`, after its data files and before its manifest.
  std::function<void(int64_t step)> beforeManifest;
};

class Trainer {
 public:
  explicit Trainer(config::Config config, TrainerHooks hooks = {});
  ~Trainer();

  /// Trains for the configured steps (from the resumed step on), writing a checkpoint
  /// every training.checkpoint_every steps, evaluates, writes the run folder
  /// (config.yaml, metrics.csv, summary.json, model.pt, checkpoints/) and returns the
  /// summary. A NaN/Inf (training.check_numerics) throws pipefb::NumericalError naming
  /// the stage, microbatch and step, and the last good checkpoint stays as it was.
  RunSummary run();
  /// The run's plan (pipefb_plan's YAML: --plan's file, or the planner partition
  /// pipefb_train chose). run() writes it to RUN_DIR/plan.yaml next to config.yaml, where
  /// the report finds its predictions.
  void setPlanYaml(std::string yaml) { planYaml_ = std::move(yaml); }
  /// One process per device (issue 8): the pipeline runs this rank's device only
  /// (EngineOptions::group). Call before run().
  void setProcessGroup(std::shared_ptr<dist::ProcessGroup> group) { group_ = std::move(group); }

  /// Continues from a checkpoint folder (readCheckpoint): weights (re-partitioned by
  /// name for this config's plan), optimizer state, loader position, RNG and step.
  /// Call before run(). A checkpoint that does not fit the model is a UserError.
  void resume(const std::string& checkpointDir);
  /// Optimizer steps done (the resumed step included).
  int64_t stepsDone() const { return stepsDone_; }
  /// The state a checkpoint holds now (between steps).
  CheckpointState checkpointState(double lastLoss);

  /// One optimizer step on `batch`: gradient accumulation over the configured
  /// microbatches, then the optimizer. Returns the batch's mean loss.
  double step(const data::Batch& batch);
  /// Test-set accuracy and mean loss, without grad.
  std::pair<double, double> evaluate(data::Dataset& test);

  model::Model& model() { return *model_; }
  /// Single-device only (a pipeline has one optimizer per stage, in the engine).
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  /// The pipeline runtime when pipeline.schedule is not none, else null.
  /// (Built on first use, after any resume(); see Note [Checkpointing asynchronous
  /// pipelines] for when it is replaced.)
  runtime::PipelineEngine* pipeline() {
    ensureEngine();
    return engine_.get();
  }
  const config::Config& config() const { return config_; }
  int64_t totalSteps() const { return totalSteps_; }

 private:
  std::vector<DeviceSummary> deviceSummaries() const;
  /// Builds the pipeline engine for the steps from stepsDone_ on (Note [Checkpointing
  /// asynchronous pipelines]) and restores pendingOptimizer_ into it.
  void ensureEngine();
  std::string writeCheckpointNow(double lastLoss);
  /// The merged state_dict: the model's, with the forward copies' buffers of split stages.
  NamedTensors mergedStateDict() const;

  TrainerHooks hooks_;
  std::string planYaml_;
  std::shared_ptr<dist::ProcessGroup> group_;
  NamedTensors ownWeights() const;
  NamedTensors pendingOptimizer_;  // optimizer state for the next engine
  std::string pendingSource_;      // where it came from, for errors
  int64_t engineEnd_ = 0;          // the engine was built for steps up to here
  std::string lastCheckpoint_;

  config::Config config_;
  std::shared_ptr<model::Model> model_;
  std::shared_ptr<data::Dataset> train_;
  /// training.eval: the test split, loaded with the training one so that a bad test file
  /// is refused before training (data.test_path, Note [Token files]).
  std::shared_ptr<data::Dataset> test_;
  std::unique_ptr<data::Loader> loader_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  int64_t totalSteps_ = 0;
  int64_t stepsDone_ = 0;
  /// fp16 (Note [Loss scaling]): the one-device run's scaler, or the state the next engine
  /// starts from (a resumed checkpoint's, the previous segment's).
  std::optional<LossScale> lossScale_;
  memory::MemoryDomain* device_ = nullptr;           // cpu:0
  std::unique_ptr<runtime::PipelineEngine> engine_;  // pipeline.schedule != none
};

/// Number of optimizer steps a config asks for: training.iterations when set,
/// else epochs × batches per epoch.
int64_t plannedSteps(const config::Config& config, int64_t trainSamples);

}  // namespace pipefb::train
