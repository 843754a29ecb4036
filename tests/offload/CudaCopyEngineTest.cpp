// The CUDA copy engine: builds wherever /usr/local/cuda exists; runs only with a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <future>

#include "pipefb/offload/cuda/CudaCopyEngine.h"

using namespace pipefb;

TEST(CudaCopyEngine, PinnedRoundTripOnItsStream) {
  if (!offload::cudaAvailable()) GTEST_SKIP() << "no CUDA device";
  const size_t n = 1 << 20;
  auto* a = static_cast<char*>(offload::cudaPinnedAlloc(n));
  auto* b = static_cast<char*>(offload::cudaPinnedAlloc(n));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::memset(a, 7, n);
  std::memset(b, 0, n);
  offload::CudaCopyEngine engine(0);
  std::promise<void> done;
  engine.submit([&] {
    engine.copy(b, a, n);
    done.set_value();
  });
  done.get_future().wait();
  EXPECT_EQ(std::memcmp(a, b, n), 0);
  offload::cudaPinnedFree(a);
  offload::cudaPinnedFree(b);
}
