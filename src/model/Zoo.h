#pragma once
// Private to src/model: the builders behind buildModel. Each returns the layers in
// order; options are already validated.
#include <memory>
#include <vector>

#include "pipefb/model/Model.h"

namespace pipefb::model::detail {

using Layers = std::vector<std::shared_ptr<Layer>>;

Layers buildVgg16(const ModelOptions& o);
Layers buildAlexNet(const ModelOptions& o);
Layers buildResNet50(const ModelOptions& o);
Layers buildMlp(const ModelOptions& o);
Layers buildGpt2(const ModelOptions& o);
/// Note [TorchScript models] (TorchScript.cpp).
std::shared_ptr<Model> buildTorchScript(const ModelOptions& o);

/// prefix + "." + name, skipping empty parts.
inline std::string joinKey(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + "." + b;
}

}  // namespace pipefb::model::detail
