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

inline bool isTokenModel(const model::ModelOptions& m) { return m.name == "gpt2"; }

inline const char* splitName(Split s) { return s == Split::Train ? "train" : "test"; }

/// n, or at most `limit` when it is > 0 (data.limit_train, data.limit_test).
inline int64_t capped(int64_t n, int64_t limit) { return limit > 0 ? std::min(n, limit) : n; }

/// Indices -> long tensor, each checked against the set size (a bug if not).
inline torch::Tensor indexTensor(const std::vector<int64_t>& indices, int64_t n) {
  for (int64_t i : indices) PIPEFB_ASSERT(i >= 0 && i < n, "sample index " << i << " of " << n);
  return torch::tensor(indices, torch::kLong);
}

}  // namespace pipefb::data::detail
