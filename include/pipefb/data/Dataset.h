#pragma once
// Data sets and the deterministic loader.
//
// A Dataset hands out batches shaped for the model: images are float
// (B, C, H, W) at the model's input side and channel count; token data (gpt2)
// comes from sequences (N, T+1) long, so that input = [:, :T] and
// target = [:, 1:]. Labels are long (B).
//
// Where the samples live (see Note [Image shaping] in src/data/Dataset.cpp):
//  * Fashion-MNIST and CIFAR-10 are held in memory as float, scaled, normalised
//    and zero-padded once at load. Work that would multiply memory is done per
//    batch in get(): repeating 1 channel to C, and a bilinear resize (used when
//    padding does not fit, e.g. 28 -> 224).
//  * Synthetic images are generated per batch from (seed, split, index), so a
//    224 px synthetic set costs no memory; synthetic tokens are held in memory.
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
  /// Gathers the samples at `indices` into one batch. Safe to call from several
  /// threads at once (the data set is read-only after construction).
  virtual Batch get(const std::vector<int64_t>& indices) const = 0;
  virtual std::string describe() const = 0;
  /// Number of classes in the targets (the vocabulary size for tokens). A model
  /// needs model.num_classes >= numClasses().
  virtual int64_t numClasses() const = 0;
};

/// Which split to load.
enum class Split { Train, Test };

/// Builds the data set the options name, shaped for the model. Throws
/// pipefb::UserError for a missing, truncated or garbled file, naming the file and
/// the byte offset.
std::shared_ptr<Dataset> makeDataset(const DataOptions& data, const model::ModelOptions& model,
                                     Split split, uint64_t seed);

/// Iterates over a data set in batches; the order is a permutation drawn from
/// (seed, epoch) with a private RNG (never torch's global one), so two loaders
/// with the same seed yield the same batches whatever the model does.
/// (epoch(), position()) always names the *next* batch: after the last batch of
/// an epoch they read (epoch + 1, 0). With dropLast = false the last batch of an
/// epoch may be short. Throws UserError when batch < 1, or when dropLast leaves
/// no batch at all (batch larger than the data set).
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
  /// Jumps to (epoch, position), e.g. on resume; next() then returns exactly the
  /// batch an uninterrupted loader would. 0 <= position <= batchesPerEpoch().
  void seek(int64_t epoch, int64_t position);

 private:
  void reshuffle();
  /// The permutation of epoch `epoch` (identity when not shuffling).
  std::vector<int64_t> orderOf(int64_t epoch) const;
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
