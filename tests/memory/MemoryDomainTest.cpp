// Torch-free tests of the accounting core: domains, scopes, stats, events, OOM.
#include <gtest/gtest.h>

#include <thread>

#include "pipefb/common/MemoryCategory.h"
#include "pipefb/common/Size.h"
#include "pipefb/memory/DomainRegistry.h"
#include "pipefb/memory/MemoryDomain.h"
#include "pipefb/memory/MemoryEvent.h"
#include "pipefb/memory/MemoryScope.h"
#include "pipefb/memory/OutOfMemoryError.h"

namespace pipefb::memory {
namespace {

using C = MemoryCategory;
constexpr int64_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

// A fresh domain per test: domains live for the process, and all tests of a
// binary may share one process.
MemoryDomain& freshDomain(const std::string& tag, int64_t capacity = kUnlimited) {
  static int n = 0;
  return configureDomain("test:" + tag + ":" + std::to_string(n++), capacity);
}

TEST(MemoryCategory, RoundTripsThroughStrings) {
  for (MemoryCategory c : kAllMemoryCategories) {
    EXPECT_EQ(parseMemoryCategory(toString(c)), c);
    EXPECT_EQ(memoryCategoryFromString(toString(c)), c);
  }
  EXPECT_STREQ(toString(C::OptimizerState), "optimizer_state");
  EXPECT_EQ(parseMemoryCategory("Stash"), std::nullopt);
  try {
    memoryCategoryFromString("activations");
    FAIL() << "no throw";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("'activations'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("weight_versions"), std::string::npos) << e.what();
  }
}

TEST(DomainRegistry, NamesAreStable) {
  MemoryDomain& a = getOrCreateDomain("test:registry:a");
  EXPECT_EQ(&getOrCreateDomain("test:registry:a"), &a);
  EXPECT_EQ(findDomain("test:registry:a"), &a);
  EXPECT_EQ(findDomain("test:registry:none"), nullptr);
  EXPECT_EQ(&domainById(a.id()), &a);
  EXPECT_TRUE(a.unlimited());
  EXPECT_EQ(&configureDomain("test:registry:a", 5 * MiB), &a);
  EXPECT_EQ(a.capacity(), 5 * MiB);
  EXPECT_EQ(virtualDeviceName(3), "cpu:3");
  EXPECT_EQ(hostDomain().name(), "host");
  EXPECT_EQ(unscopedDomain().name(), "unscoped");
  EXPECT_NE(hostDomain().oomHint().find("host"), std::string::npos);
  EXPECT_NE(getOrCreateDomain("cpu:7").oomHint().find("devices.memory"), std::string::npos);
}

TEST(MemoryDomain, LivePeakAndBreakdown) {
  MemoryDomain& d = freshDomain("live");
  d.charge(C::Weights, 100);
  d.charge(C::Stash, 50);
  d.charge(C::Stash, 30);
  d.release(C::Stash, 50);
  d.charge(C::Grads, 10);  // live 140; peak stays 180
  MemoryStats s = d.stats();
  EXPECT_EQ(s.bytes.current, 140);
  EXPECT_EQ(s.bytes.peak, 180);
  EXPECT_EQ(s.bytes.allocated, 190);
  EXPECT_EQ(s.bytes.freed, 50);
  EXPECT_EQ(s[C::Stash].current, 30);
  EXPECT_EQ(s[C::Stash].peak, 80);
  EXPECT_EQ(s[C::Weights].current, 100);
  EXPECT_EQ(s[C::Grads].current, 10);
  EXPECT_EQ(s.allocations.current, 3);
  EXPECT_EQ(s.allocations.peak, 3);
  EXPECT_EQ(s.allocations.allocated, 4);
  EXPECT_EQ(s.allocations.freed, 1);
  // The breakdown at the peak (180 = weights 100 + stash 80), not now.
  EXPECT_EQ(s.bytes_at_peak[index(C::Weights)], 100);
  EXPECT_EQ(s.bytes_at_peak[index(C::Stash)], 80);
  EXPECT_EQ(s.bytes_at_peak[index(C::Grads)], 0);
  EXPECT_EQ(d.liveBytes(), 140);
  EXPECT_EQ(d.liveBytes(C::Stash), 30);
  EXPECT_EQ(d.peakBytes(), 180);

  d.resetPeak();
  s = d.stats();
  EXPECT_EQ(s.bytes.peak, 140);
  EXPECT_EQ(s[C::Stash].peak, 30);
  EXPECT_EQ(s.bytes_at_peak[index(C::Grads)], 10);
  EXPECT_EQ(s.bytes.allocated, 190);  // sums survive resetPeak
  d.resetStats();
  s = d.stats();
  EXPECT_EQ(s.bytes.allocated, 0);
  EXPECT_EQ(s.bytes.current, 140);
}

TEST(MemoryDomain, CapacityRefusesBeforeCharging) {
  MemoryDomain& d = freshDomain("cap", 2 * GiB);
  d.charge(C::Stash, GiB + GiB / 5);  // 1.20 GiB
  d.charge(C::Weights, 512 * MiB);
  d.charge(C::Grads, 2 * GiB - d.liveBytes() - 100);  // exactly fits after this: 100 B left
  d.charge(C::WorkingSet, 100);                       // == capacity is allowed
  d.release(C::WorkingSet, 100);
  const int64_t before = d.liveBytes();
  clearLastOutOfMemory();
  try {
    d.charge(C::Stash, 12 * MiB);
    FAIL() << "no throw";
  } catch (const OutOfMemoryError& e) {
    const std::string m = e.what();
    EXPECT_EQ(
        m.rfind("out of memory on " + d.name() + ": tried to allocate 12.00 MiB for stash; ", 0),
        0u)
        << m;
    EXPECT_NE(m.find(formatBytes(before) + " of 2.00 GiB in use"), std::string::npos) << m;
    EXPECT_NE(m.find("(stash 1.20 GiB, weights 512.00 MiB, grads "), std::string::npos) << m;
    EXPECT_NE(m.find("smallest capacity that would fit is " + formatBytes(before + 12 * MiB)),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("HINT: raise devices.memory"), std::string::npos) << m;
    EXPECT_EQ(e.info().requested, 12 * MiB);
    EXPECT_EQ(e.info().capacity, 2 * GiB);
    EXPECT_EQ(e.info().live, before);
    EXPECT_EQ(e.info().live_by_category[index(C::Weights)], 512 * MiB);
    EXPECT_EQ(e.info().neededCapacity(), before + 12 * MiB);
  }
  EXPECT_EQ(d.liveBytes(), before);  // nothing charged
  EXPECT_EQ(d.liveBytes(C::Stash), GiB + GiB / 5);
  MemoryStats s = d.stats();
  EXPECT_EQ(s.num_ooms, 1);
  EXPECT_EQ(s.largest_refused, 12 * MiB);
  ASSERT_TRUE(lastOutOfMemory().has_value());
  EXPECT_EQ(lastOutOfMemory()->domain, d.name());
  ASSERT_TRUE(lastOutOfMemoryAnyThread().has_value());

  // Another thread's OOM is visible as "any thread" but not as this thread's.
  clearLastOutOfMemory();
  std::thread([&] { EXPECT_THROW(d.charge(C::Grads, GiB), OutOfMemoryError); }).join();
  EXPECT_FALSE(lastOutOfMemory().has_value());
  ASSERT_TRUE(lastOutOfMemoryAnyThread().has_value());
  EXPECT_EQ(lastOutOfMemoryAnyThread()->requested, GiB);

  d.setCapacity(kUnlimited);
  EXPECT_NO_THROW(d.charge(C::Stash, 12 * MiB));
}

TEST(MemoryScope, NestsAndRestores) {
  MemoryDomain& a = freshDomain("scopeA");
  MemoryDomain& b = freshDomain("scopeB");
  EXPECT_FALSE(currentScope().has_value());
  EXPECT_EQ(chargeTarget().domain, &unscopedDomain());
  EXPECT_EQ(chargeTarget().category, C::WorkingSet);
  EXPECT_THROW(MemoryScope(C::Stash), InternalError);  // no domain to keep
  {
    MemoryScope s1(a, C::Weights);
    EXPECT_EQ(currentScope()->domain, &a);
    EXPECT_EQ(currentScope()->category, C::Weights);
    {
      MemoryScope s2(C::CommBuffers);  // keeps domain a
      EXPECT_EQ(chargeTarget().domain, &a);
      EXPECT_EQ(chargeTarget().category, C::CommBuffers);
      {
        MemoryScope s3(b, C::OptimizerState);
        EXPECT_EQ(chargeTarget().domain, &b);
        EXPECT_EQ(chargeTarget().category, C::OptimizerState);
      }
      EXPECT_EQ(chargeTarget().domain, &a);
      EXPECT_EQ(chargeTarget().category, C::CommBuffers);
    }
    EXPECT_EQ(chargeTarget().category, C::Weights);
    // Scopes are per thread.
    std::thread([] { EXPECT_FALSE(currentScope().has_value()); }).join();
  }
  EXPECT_FALSE(currentScope().has_value());
}

TEST(MemoryScope, LeaderLendsItsCurrentScopeToUntaggedThreads) {
  MemoryDomain& a = freshDomain("leader");
  MemoryDomain& other = freshDomain("leaderOther");
  MemoryScope s(a, C::Stash);
  auto targetOnNewThread = [] {
    ScopeTarget t;
    std::thread([&] { t = chargeTarget(); }).join();
    return t;
  };
  EXPECT_EQ(targetOnNewThread().domain, &unscopedDomain());
  {
    ScopeLeader leader;
    ScopeTarget t = targetOnNewThread();
    EXPECT_EQ(t.domain, &a);
    EXPECT_EQ(t.category, C::Stash);
    {
      MemoryScope inner(C::Grads);  // followed live, not copied at ScopeLeader()
      EXPECT_EQ(targetOnNewThread().category, C::Grads);
    }
    // A thread with its own scope keeps it.
    std::thread([&] {
      MemoryScope own(other, C::Weights);
      EXPECT_EQ(chargeTarget().domain, &other);
    }).join();
  }
  EXPECT_EQ(targetOnNewThread().domain, &unscopedDomain());
}

TEST(MemoryEvent, RecordsInOrderOnlyWhenOn) {
  MemoryDomain& d = freshDomain("events", 1000);
  setRecording(false);
  drainEvents();
  d.charge(C::Stash, 10);
  d.release(C::Stash, 10);
  EXPECT_TRUE(drainEvents().empty());  // off: nothing kept

  setRecording(true);
  const int64_t t0 = nowNs();
  d.charge(C::Stash, 300);
  d.charge(C::Weights, 600);
  d.release(C::Stash, 300);
  EXPECT_THROW(d.charge(C::Grads, 700), OutOfMemoryError);
  setRecording(false);
  d.release(C::Weights, 600);  // after stopping: not recorded
  const auto events = drainEvents();
  std::vector<MemoryEvent> mine;
  for (const auto& e : events)
    if (e.domain == d.id()) mine.push_back(e);
  ASSERT_EQ(mine.size(), 4u);
  const MemoryEventKind kinds[] = {MemoryEventKind::Alloc, MemoryEventKind::Alloc,
                                   MemoryEventKind::Free, MemoryEventKind::Oom};
  const C cats[] = {C::Stash, C::Weights, C::Stash, C::Grads};
  const int64_t bytes[] = {300, 600, 300, 700};
  const int64_t live[] = {300, 900, 600, 600};
  int64_t prev = t0;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(mine[i].kind, kinds[i]) << i;
    EXPECT_EQ(mine[i].category, cats[i]) << i;
    EXPECT_EQ(mine[i].bytes, bytes[i]) << i;
    EXPECT_EQ(mine[i].live_after, live[i]) << i;
    EXPECT_GE(mine[i].time_ns, prev) << i;
    prev = mine[i].time_ns;
  }
  EXPECT_LE(prev, nowNs());
  EXPECT_STREQ(toString(MemoryEventKind::Oom), "OOM");
  EXPECT_TRUE(drainEvents().empty());  // drained
}

TEST(MemoryEvent, RingKeepsTheNewestAndCountsDrops) {
  MemoryDomain& d = freshDomain("ring");
  setRecording(true, 4);
  drainEvents();
  for (int i = 1; i <= 10; ++i) d.charge(C::WorkingSet, i);
  setRecording(false);
  const auto events = drainEvents();
  ASSERT_EQ(events.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(events[i].bytes, 7 + i);
  setRecording(true, 4);
  for (int i = 1; i <= 5; ++i) d.release(C::WorkingSet, i);
  EXPECT_EQ(droppedEvents(), 1);
  setRecording(false, kDefaultEventCapacity);
  drainEvents();
}

TEST(MemoryDomain, ConcurrentChargesBalance) {
  MemoryDomain& d = freshDomain("threads");
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      const C c = kAllMemoryCategories[t];
      for (int i = 0; i < 20000; ++i) {
        d.charge(c, 64);
        d.release(c, 64);
      }
      d.charge(c, 1000 + t);
    });
  for (auto& t : ts) t.join();
  MemoryStats s = d.stats();
  EXPECT_EQ(s.bytes.current, 4000 + 0 + 1 + 2 + 3);
  EXPECT_EQ(s.allocations.allocated, 4 * 20001);
  for (int t = 0; t < 4; ++t) EXPECT_EQ(s.category_bytes[t].current, 1000 + t);
  EXPECT_LE(s.bytes.peak, 4 * 64 + 4006);
}

TEST(MemoryStats, FormatsForPeople) {
  CategoryBytes b{};
  EXPECT_EQ(formatBreakdown(b), "nothing");
  b[index(C::Weights)] = 512 * MiB;
  b[index(C::Stash)] = GiB + GiB / 5;
  b[index(C::CommBuffers)] = 17;
  EXPECT_EQ(formatBreakdown(b), "stash 1.20 GiB, weights 512.00 MiB, comm_buffers 17 B");
  MemoryDomain& d = freshDomain("fmt", 2 * GiB);
  d.charge(C::Stash, MiB);
  EXPECT_EQ(toString(d.stats()),
            d.name() + ": 1.00 MiB live (peak 1.00 MiB) of 2.00 GiB; stash 1.00 MiB");
}

}  // namespace
}  // namespace pipefb::memory
