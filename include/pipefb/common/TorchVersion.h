#pragma once
// PIPEFB_TORCH_AT_LEAST(major, minor): the LibTorch being compiled against is at least
// that version. The CUDA sources build against Debian's LibTorch 1.13 (type-checked
// only, CPU) and against a CUDA LibTorch 2.x; where their APIs differ, the code says so
// with this guard (README.md, "On a GPU host").
#include <torch/version.h>

#define PIPEFB_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||         \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
