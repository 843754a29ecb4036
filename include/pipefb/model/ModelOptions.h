#pragma once
// Options of a model in the zoo. Torch-free so that the config layer and the
// planner can carry them without LibTorch.
#include <cstdint>
#include <string>
#include <vector>

namespace pipefb::model {

struct ModelOptions {
  /// vgg16 | alexnet | resnet50 | gpt2 | mlp
  std::string name = "vgg16";
  /// Channel / hidden-size multiplier. 1.0 gives torchvision's shapes.
  double width = 1.0;
  /// Image side H = W (images), or sequence length T (gpt2).
  int64_t input_size = 224;
  /// Input channels (images). Ignored by gpt2.
  int64_t channels = 3;
  /// Output classes; for gpt2 the vocabulary size.
  int64_t num_classes = 1000;
  /// gpt2 only: tiny | small | medium | large | xl.
  std::string size = "small";
  /// mlp only: hidden layer sizes (before the width multiplier).
  std::vector<int64_t> hidden = {256, 256};
  /// Dropout probability where the reference model has dropout (vgg, alexnet, gpt2).
  /// Default 0 so that pipelined and single-device runs are comparable bit for bit.
  double dropout = 0.0;
};

/// The names the zoo knows, for error messages.
inline const std::vector<std::string>& modelNames() {
  static const std::vector<std::string> names = {"vgg16", "alexnet", "resnet50", "gpt2", "mlp"};
  return names;
}
inline const std::vector<std::string>& gpt2Sizes() {
  static const std::vector<std::string> sizes = {"tiny", "small", "medium", "large", "xl"};
  return sizes;
}

}  // namespace pipefb::model
