#pragma once
// Data sets and the deterministic loader.
//
// A Dataset holds all its samples in memory, already shaped for the model:
// images are float (N, C, H, W), padded or resized to the model's input side and
// channel count; token data (gpt2) is long (N, T+1) so that input = [:, :T] and
// target = [:, 1:]. Labels are long (N).
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pipefb/data/DataOptions.h"
#include "pipefb/model/ModelOptions.h"

namespace pipefb::data {

struct Batch {
  torch::Tensor input;   // (B, C, H, W) float, or (B, T) long
  torch::Tensor target;  // (B) long, or (B, T) long
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  /// Gathers the samples at `indices` into one batch.
  virtual Batch get(const std::vector<int64_t>& indices) const = 0;
  virtual std::string describe() const = 0;
};

/// Which split to load.
enum class Split { Train, Test };

/// Builds the data set the options name, shaped for the model. Throws
/// pipefb::UserError for a missing, truncated or garbled file, naming the file and
/// the byte offset.
std::shared_ptr<Dataset> makeDataset(const DataOptions& data, const model::ModelOptions& model,
                                     Split split, uint64_t seed);

/// Iterates over a data set in batches; the order is a permutation drawn from
/// (seed, epoch), so two loaders with the same seed yield the same batches.
class Loader {
 public:
  Loader(std::shared_ptr<Dataset> dataset, int64_t batch, bool shuffle, uint64_t seed,
         bool dropLast = true);
  /// Batches per epoch.
  int64_t batchesPerEpoch() const;
  /// The next batch; moves to the next epoch (reshuffled) after the last one.
  Batch next();
  int64_t epoch() const { return epoch_; }
  /// Position within the epoch, in batches (for checkpoints).
  int64_t position() const { return position_; }
  /// Jumps to (epoch, position), e.g. on resume.
  void seek(int64_t epoch, int64_t position);

 private:
  void reshuffle();
  std::shared_ptr<Dataset> dataset_;
  int64_t batch_;
  bool shuffle_;
  uint64_t seed_;
  bool dropLast_;
  int64_t epoch_ = 0;
  int64_t position_ = 0;
  std::vector<int64_t> order_;
};

}  // namespace pipefb::data
