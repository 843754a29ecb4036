#pragma once
// Runs ATen's intra-op parallel_for as LibTorch's own kernels do. See
// ParallelRegion.cpp for why this needs its own translation unit.
#include <cstdint>
#include <functional>

namespace pipefb::memory::testing {

/// at::parallel_for(0, n, 1, ...) calling chunk(i) for each i; returns how many
/// indices ran on an intra-op pool thread (not the calling thread).
int parallelForOnPool(int64_t n, const std::function<void(int64_t)>& chunk);

}  // namespace pipefb::memory::testing
