#pragma once
// State-dict files that Python's torch.load reads, and the resumable checkpoints of
// training.checkpoint_every.
//
// Note [Atomic checkpoint]
// The bytes go to "<path>.tmp.<pid>", are fsync'ed, and the file is renamed over
// <path>, then the folder is fsync'ed. A reader therefore sees either the old
// file or the new one, never a partial one, even if the process dies mid-write.
//
// Note [Checkpoint layout]
// RUN_DIR/checkpoints/step-000040/ holds
//   model.pt       the merged state_dict, torchvision names (torch.load reads it)
//   optimizer.pt   optimizer state by parameter name: "<param>/momentum_buffer" (sgd),
//                  "<param>/exp_avg", "<param>/exp_avg_sq", "<param>/step" (adam)
//   rng.pt         {"torch": torch's CPU generator state}
//   manifest.json  written LAST: the step, the config (YAML), the plan (schedule, stages
//                  with their layer ranges, devices, weight versions and parameter
//                  names), the data-loader position, and every file with its size and
//                  CRC-32.
// Each file is written atomically; the manifest is renamed into place only after
// every other file is durable, so a folder without manifest.json is a checkpoint that
// died mid-write and is never resumed from. On resume every file is checked against
// the manifest's size and CRC-32 before anything is loaded.
//
// Both state files are keyed by parameter name, not by stage, so a run resumes under
// any partition, stage count or placement: the merged weights are re-partitioned by
// the new plan (Trainer::resume).
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pipefb/common/AtomicFile.h"
#include "pipefb/train/LossScaler.h"

namespace pipefb::train {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// Writes `tensors` as a pickled dict {name: tensor} (torch::pickle_save), which
/// `torch.load(path)` returns as an OrderedDict-compatible dict in Python.
void saveStateDict(const std::string& path, const NamedTensors& tensors);

/// Reads a file written by saveStateDict. Throws pipefb::UserError naming the file
/// when it is missing or not a pipefb/torch state dict.
NamedTensors loadStateDict(const std::string& path);

/// Writes `bytes` to `path` atomically (see Note [Atomic checkpoint]).
using pipefb::writeFileAtomically;

/// One stage of the plan a checkpoint was taken under (informational: resume
/// re-partitions by name).
struct CheckpointStage {
  int64_t first = 0, last = 0;  // layers [first, last)
  int forwardDevice = 0, backwardDevice = 0;
  int64_t weightVersion = 0;       // optimizer steps applied to its master weights
  std::vector<std::string> names;  // its state_dict keys
};

struct CheckpointState {
  int64_t step = 0;  // optimizer steps done
  int64_t totalSteps = 0;
  double loss = 0;  // of the last step
  NamedTensors model;
  NamedTensors optimizer;
  torch::Tensor torchRng;              // at::Generator::get_state() of the default CPU generator
  std::optional<LossScale> lossScale;  // fp16: Note [Loss scaling] (LossScaler.h)
  int64_t loaderEpoch = 0, loaderPosition = 0;
  uint64_t loaderSeed = 0;  // the loader's order is a function of (seed, epoch)
  std::string configYaml;
  std::string schedule;  // pipeline.schedule
  int64_t microbatches = 1;
  std::vector<CheckpointStage> stages;
};

/// "RUN_DIR/checkpoints"
std::string checkpointsDir(const std::string& runDir);

/// Writes the checkpoint of `state` (Note [Checkpoint layout]), then deletes all but the
/// newest `keep` complete checkpoints and any incomplete one older than it. Returns its
/// folder.
/// `beforeManifest` (tests) runs after the data files, before the manifest.
std::string writeCheckpoint(const std::string& runDir, const CheckpointState& state, int64_t keep,
                            const std::function<void()>& beforeManifest = {});

/// The folder of the newest checkpoint of runDir that has a manifest, "" when there is
/// none (folders without a manifest died mid-write and are skipped).
std::string latestCheckpoint(const std::string& runDir);

/// Reads a checkpoint folder, checking every file against the manifest. A missing or
/// unreadable manifest, a missing, truncated or garbled file is a pipefb::UserError
/// with one line naming the file.
CheckpointState readCheckpoint(const std::string& dir);

/// CRC-32 (zlib) of `bytes`.
uint32_t crc32Of(const std::string& bytes);

}  // namespace pipefb::train
