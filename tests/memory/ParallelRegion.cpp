// at::parallel_for is an inline template: it runs in parallel only where the
// calling code is compiled with -fopenmp (ATen/ParallelOpenMP.h checks _OPENMP).
// LibTorch's kernels are; pipefb's code is not. This file is compiled with
// -fopenmp (tests/memory/CMakeLists.txt) so that the test reproduces exactly what
// a LibTorch kernel that allocates inside its parallel region does.
#include "ParallelRegion.h"

#include <ATen/Parallel.h>

#include <atomic>
#include <thread>

#ifndef _OPENMP
#error "ParallelRegion.cpp must be compiled with -fopenmp"
#endif

namespace pipefb::memory::testing {

int parallelForOnPool(int64_t n, const std::function<void(int64_t)>& chunk) {
  const auto caller = std::this_thread::get_id();
  std::atomic<int> onPool{0};
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (std::this_thread::get_id() != caller) onPool++;
      chunk(i);
    }
  });
  return onPool.load();
}

}  // namespace pipefb::memory::testing
