#pragma once
// What the data sets share (private header): which models take tokens, the split's name,
// the sample count a limit leaves, and checked sample indices.
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "pipefb/common/Error.h"
#include "pipefb/data/Dataset.h"

namespace pipefb::data::detail {

using model::isTokenModel;

/// A torchscript model's sample shape in the zoo's keys, for the data sets that read them
/// (Note [TorchScript models] in model/Model.h): [T] sets model.input_size, [C, H, H]
/// model.channels and model.input_size. Other shapes: model.sample_shape alone.
inline model::ModelOptions shapedOptions(model::ModelOptions m) {
  const std::vector<int64_t>& s = m.sample_shape;
  if (m.name != "torchscript") return m;
  if (s.size() == 1) m.input_size = s[0];
  if (s.size() == 3 && s[1] == s[2]) {
    m.channels = s[0];
    m.input_size = s[1];
  }
  return m;
}

/// The zoo's images are [C, H, H]: a torchscript model of another sample shape cannot
/// take an image data set.
inline bool squareImages(const model::ModelOptions& m) {
  const std::vector<int64_t> s = model::sampleShape(m);
  return s.size() == 3 && s[1] == s[2];
}

inline const char* splitName(Split s) { return s == Split::Train ? "train" : "test"; }

/// n, or at most `limit` when it is > 0 (data.limit_train, data.limit_test).
inline int64_t capped(int64_t n, int64_t limit) { return limit > 0 ? std::min(n, limit) : n; }

/// Indices -> long tensor, each checked against the set size (a bug if not).
inline torch::Tensor indexTensor(const std::vector<int64_t>& indices, int64_t n) {
  for (int64_t i : indices) PIPEFB_ASSERT(i >= 0 && i < n, "sample index " << i << " of " << n);
  return torch::tensor(indices, torch::kLong);
}

}  // namespace pipefb::data::detail
