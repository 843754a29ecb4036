#include <torch/torch.h>

#include <string>

#include "Random.h"
#include "pipefb/common/Error.h"
#include "pipefb/data/Dataset.h"

namespace pipefb::data {

Loader::Loader(std::shared_ptr<Dataset> dataset, int64_t batch, bool shuffle, uint64_t seed,
               bool dropLast)
    : dataset_(std::move(dataset)),
      batch_(batch),
      shuffle_(shuffle),
      seed_(seed),
      dropLast_(dropLast) {
  PIPEFB_ASSERT(dataset_ != nullptr, "Loader without a data set");
  if (batch_ < 1) throw UserError("training.batch = " + std::to_string(batch_) + ", expected >= 1");
  if (batchesPerEpoch() == 0) {
    throw UserError("training.batch = " + std::to_string(batch_) +
                    " is larger than the data set (" + dataset_->describe() +
                    "), so an epoch has no full batch; lower training.batch");
  }
  reshuffle();
}

int64_t Loader::batchesPerEpoch() const {
  const int64_t n = dataset_->size();
  return dropLast_ ? n / batch_ : (n + batch_ - 1) / batch_;
}

std::vector<int64_t> Loader::orderOf(int64_t epoch) const {
  const int64_t n = dataset_->size();
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  if (shuffle_) {
    // Fisher-Yates with a generator seeded from (seed, epoch) only: the order
    // neither depends on nor disturbs torch's global RNG.
    std::mt19937_64 rng(detail::mixSeed(seed_, static_cast<uint64_t>(epoch)));
    for (int64_t i = n - 1; i > 0; --i)
      std::swap(order[i], order[detail::uniformBelow(rng, static_cast<uint64_t>(i) + 1)]);
  }
  return order;
}

void Loader::reshuffle() { order_ = orderOf(epoch_); }

Batch Loader::next() {
  const int64_t n = static_cast<int64_t>(order_.size());
  const int64_t begin = position_ * batch_;
  const int64_t end = std::min(begin + batch_, n);
  PIPEFB_ASSERT(begin < end, "loader past the end: epoch " << epoch_ << " position " << position_);
  Batch b = dataset_->get(std::vector<int64_t>(order_.begin() + begin, order_.begin() + end));
  if (++position_ == batchesPerEpoch()) {
    ++epoch_;
    position_ = 0;
    reshuffle();
  }
  return b;
}

void Loader::seek(int64_t epoch, int64_t position) {
  const int64_t per = batchesPerEpoch();
  if (epoch < 0 || position < 0 || position > per) {
    throw UserError("cannot seek the loader to epoch " + std::to_string(epoch) + ", position " +
                    std::to_string(position) + ": expected epoch >= 0 and 0 <= position <= " +
                    std::to_string(per) + " (batches per epoch)");
  }
  if (position == per) {
    ++epoch;
    position = 0;
  }
  epoch_ = epoch;
  position_ = position;
  reshuffle();
}

}  // namespace pipefb::data
