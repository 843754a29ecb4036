#pragma once
// Whole-file writes that a reader never sees half done: checkpoints, run files, the
// profile cache that several processes may fill at once.
#include <string>

namespace pipefb {

/// Writes `bytes` to `path` atomically: a temporary file beside it, fsync, rename, and
/// fsync of the directory (Note [Atomic checkpoint] in pipefb/train/Checkpoint.h).
/// Creates the parent directories; std::runtime_error naming the file on failure.
void writeFileAtomically(const std::string& path, const std::string& bytes);

}  // namespace pipefb
