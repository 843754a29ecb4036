#pragma once
// State-dict checkpoints that Python's torch.load reads.
//
// Note [Atomic checkpoint]
// The bytes go to "<path>.tmp.<pid>", are fsync'ed, and the file is renamed over
// <path>, then the folder is fsync'ed. A reader therefore sees either the old
// file or the new one, never a partial one, even if the process dies mid-write.
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

namespace pipefb::train {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// Writes `tensors` as a pickled dict {name: tensor} (torch::pickle_save), which
/// `torch.load(path)` returns as an OrderedDict-compatible dict in Python.
void saveStateDict(const std::string& path, const NamedTensors& tensors);

/// Reads a file written by saveStateDict. Throws pipefb::UserError naming the file
/// when it is missing or not a pipefb/torch state dict.
NamedTensors loadStateDict(const std::string& path);

/// Writes `bytes` to `path` atomically (see Note [Atomic checkpoint]).
void writeFileAtomically(const std::string& path, const std::string& bytes);

}  // namespace pipefb::train
