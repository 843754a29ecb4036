#pragma once
// The seeded model and the random batches the pipeline tests (tests/runtime, tests/dist)
// compare runs on. LibTorch; test-only.
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "pipefb/data/Dataset.h"
#include "pipefb/model/Model.h"

namespace pipefb::test {

/// The model of `o`, built from torch's seed 7, in training mode.
inline std::shared_ptr<model::Model> buildSeeded(const model::ModelOptions& o) {
  torch::manual_seed(7);
  auto m = model::buildModel(o);
  m->train(true);
  return m;
}

/// n random samples of m's input (token ids below `classes` for a token model, N(0,1)
/// otherwise) and their targets, from torch's seed `seed`.
inline data::Batch makeBatch(const model::Model& m, int64_t n, int64_t classes, uint64_t seed) {
  torch::manual_seed(seed);
  data::Batch b;
  std::vector<int64_t> shape = {n};
  for (auto s : m.sampleShape()) shape.push_back(s);
  if (m.inputDtype() == torch::kLong) {
    b.input = torch::randint(classes, shape, torch::kLong);
    b.target = torch::randint(classes, shape, torch::kLong);
  } else {
    b.input = torch::randn(shape);
    b.target = torch::randint(classes, {n}, torch::kLong);
  }
  return b;
}

}  // namespace pipefb::test
