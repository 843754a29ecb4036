#pragma once
// Options of a data set. Torch-free so that the config layer can carry them.
#include <cstdint>
#include <string>
#include <vector>

namespace pipefb::data {

struct DataOptions {
  /// fashion-mnist | cifar10 | synthetic | tensors | tokens
  std::string name = "fashion-mnist";
  /// Folder holding the files. Empty means the default for the data set
  /// (/usr/share/datasets/fashion-mnist for fashion-mnist). tensors and tokens: the
  /// training file (Notes [Tensors from Python], [Token files] in src/data/UserData.cpp).
  std::string path;
  /// tensors and tokens: the test (validation) file; needed when training.eval is on.
  std::string test_path;
  /// synthetic only: number of training and test samples.
  int64_t synthetic_train = 4096;
  int64_t synthetic_test = 1024;
  /// Use at most this many training / test samples (0 = all). Handy for quick runs.
  int64_t limit_train = 0;
  int64_t limit_test = 0;
  /// Normalise images to zero mean / unit variance with the data set's statistics.
  bool normalize = true;
  /// Draw the training samples in a new random order each epoch (training.seed); false:
  /// in the file's order, as another trainer fed the same file sees them.
  bool shuffle = true;
};

inline const std::vector<std::string>& dataNames() {
  static const std::vector<std::string> names = {"fashion-mnist", "cifar10", "synthetic", "tensors",
                                                 "tokens"};
  return names;
}

}  // namespace pipefb::data
