// Note [Keeping freed memory]: after keepFreedMemory(), a block a worker thread frees is
// reused without page faults; with glibc's defaults it is unmapped and faults again.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "pipefb/memory/FreedMemory.h"

namespace pipefb::memory {
namespace {

// On a new thread (as a device worker): allocate, touch and free a 48 MiB block twice;
// the minor page faults of the second round. 48 MiB is above glibc's largest dynamic
// mmap threshold (32 MiB), so with its defaults the block is a mapping of its own.
long faultsOfReuse() {
  long faults = -1;
  std::thread worker([&] {
    const size_t n = size_t(48) << 20;
    for (int round = 0; round < 2; ++round) {
      rusage a{}, b{};
      getrusage(RUSAGE_THREAD, &a);
      char* p = static_cast<char*>(std::malloc(n));
      ASSERT_NE(p, nullptr);
      std::memset(p, round + 1, n);
      asm volatile("" : : "r"(p) : "memory");  // the stores must happen
      getrusage(RUSAGE_THREAD, &b);
      std::free(p);
      faults = b.ru_minflt - a.ru_minflt;
    }
  });
  worker.join();
  return faults;
}

TEST(FreedMemory, AFreedBlockIsReusedWithoutPageFaults) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's malloc: mallopt does nothing";
#elif !defined(__GLIBC__)
  GTEST_SKIP() << "not glibc";
#else
  // (Each test is its own process: ctest runs the discovered tests one by one.)
  EXPECT_FALSE(keepingFreedMemory());
  const long before = faultsOfReuse();
  ASSERT_TRUE(keepFreedMemory());
  EXPECT_TRUE(keepingFreedMemory());
  EXPECT_TRUE(keepFreedMemory());  // idempotent
  const long after = faultsOfReuse();
  // 4 KiB pages: about 12 000 faults before and none after; with transparent huge pages
  // both shrink, so the test asks for a clear factor, not for counts.
  EXPECT_GT(before, 0);
  EXPECT_LT(4 * after, before) << "before " << before << ", after " << after;
  std::printf("page faults of a reused 48 MiB block: %ld with glibc defaults, %ld kept\n", before,
              after);
#endif
}

}  // namespace
}  // namespace pipefb::memory
