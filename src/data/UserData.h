#pragma once
// The user's own data sets (Notes [Tensors from Python] and [Token files] in UserData.cpp).
#include <memory>

#include "pipefb/data/Dataset.h"

namespace pipefb::data {

/// data.name: tensors, the split's file (data.path, or data.test_path).
std::shared_ptr<Dataset> loadTensors(const DataOptions& data, const model::ModelOptions& model,
                                     Split split);
/// data.name: tokens, the split's file (data.path, or data.test_path).
std::shared_ptr<Dataset> loadTokens(const DataOptions& data, const model::ModelOptions& model,
                                    Split split);

}  // namespace pipefb::data
