// Tests of the LibTorch tracking allocator: accounting against live tensors'
// nbytes, cross-thread frees, OOM through ops, the event stream, intra-op
// attribution (Note [Intra-op threads]) and the overhead of tracking.
#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "ParallelRegion.h"
#include "pipefb/common/Size.h"
#include "pipefb/memory/TrackingAllocator.h"

namespace pipefb::memory {
namespace {

using C = MemoryCategory;
constexpr int64_t KiB = 1024, MiB = 1024 * KiB;

MemoryDomain& freshDomain(const std::string& tag, int64_t capacity = kUnlimited) {
  static int n = 0;
  return configureDomain("ta:" + tag + ":" + std::to_string(n++), capacity);
}

int64_t nbytes(const torch::Tensor& t) { return static_cast<int64_t>(t.storage().nbytes()); }

// Restores the intra-op thread count a test changed.
struct NumThreadsGuard {
  int saved = at::get_num_threads();
  explicit NumThreadsGuard(int n) { at::set_num_threads(n); }
  ~NumThreadsGuard() { at::set_num_threads(saved); }
};

class TrackingAllocatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    installTrackingAllocator();
    clearLastOutOfMemory();
  }
};

TEST_F(TrackingAllocatorTest, InstallIsIdempotent) {
  installTrackingAllocator();
  installTrackingAllocator();
  EXPECT_TRUE(trackingAllocatorInstalled());
  MemoryDomain& d = freshDomain("install");
  MemoryScope s(d, C::WorkingSet);
  auto t = torch::empty({10});
  EXPECT_EQ(d.liveBytes(), 40);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u);  // c10's alignment kept
}

TEST_F(TrackingAllocatorTest, AccountingAgreesWithLiveTensors) {
  MemoryDomain& d0 = freshDomain("acct0");
  MemoryDomain& d1 = freshDomain("acct1");
  std::vector<torch::Tensor> weights, stash, grads, work;
  {
    MemoryScope s(d0, C::Weights);
    weights.push_back(torch::randn({3, 5, 7}));
    weights.push_back(torch::zeros({129}, torch::kDouble));
    {
      MemoryScope st(C::Stash);
      stash.push_back(torch::ones({1000}));
      stash.push_back(torch::empty({17, 3}, torch::kInt8));
    }
    weights.push_back(torch::full({64, 64}, 2.0));  // back in Weights
    {
      MemoryScope other(d1, C::Grads);
      grads.push_back(torch::empty({4096}));
      grads.push_back(weights[0] * 2);  // an op's output lands in the scope too
      MemoryScope w(C::WorkingSet);
      work.push_back(torch::matmul(torch::ones({8, 16}), torch::ones({16, 32})));
    }
  }
  auto sum = [](const std::vector<torch::Tensor>& ts) {
    int64_t s = 0;
    for (const auto& t : ts) s += nbytes(t);
    return s;
  };
  auto check = [&](const char* when) {
    SCOPED_TRACE(when);
    EXPECT_EQ(d0.liveBytes(C::Weights), sum(weights));
    EXPECT_EQ(d0.liveBytes(C::Stash), sum(stash));
    EXPECT_EQ(d0.liveBytes(), sum(weights) + sum(stash));
    EXPECT_EQ(d1.liveBytes(C::Grads), sum(grads));
    EXPECT_EQ(d1.liveBytes(C::WorkingSet), sum(work));  // temporaries (the ones) are gone
    EXPECT_EQ(d1.liveBytes(), sum(grads) + sum(work));
  };
  check("all live");
  const int64_t peak0 = d0.peakBytes();
  EXPECT_EQ(peak0, sum(weights) + sum(stash));
  EXPECT_EQ(d0.stats().allocations.current, 5);

  stash.erase(stash.begin());  // free one stash tensor
  grads.clear();
  check("some freed");
  EXPECT_EQ(d0.peakBytes(), peak0);
  EXPECT_EQ(d0.stats()[C::Stash].peak, 4000 + 51);
  EXPECT_EQ(d0.stats().bytes_at_peak[index(C::Stash)], 4000 + 51);

  d0.resetPeak();
  EXPECT_EQ(d0.peakBytes(), d0.liveBytes());
  EXPECT_LT(d0.peakBytes(), peak0);

  // A view shares storage: no new charge. A zero-size tensor costs nothing.
  {
    MemoryScope s(d0, C::Stash);
    auto v = weights[2].view({-1});
    auto z = torch::empty({0});
  }
  check("views");
  weights.clear();
  stash.clear();
  work.clear();
  EXPECT_EQ(d0.liveBytes(), 0);
  EXPECT_EQ(d1.liveBytes(), 0);
}

TEST_F(TrackingAllocatorTest, AutogradChargesTheCallingThreadsScope) {
  // CPU autograd runs backward() on the calling thread, so its scope applies.
  MemoryDomain& d = freshDomain("autograd");
  MemoryScope dev(d, C::WorkingSet);
  torch::nn::Sequential net;
  {
    MemoryScope w(C::Weights);
    net = torch::nn::Sequential(torch::nn::Linear(32, 64), torch::nn::ReLU(),
                                torch::nn::Linear(64, 10));
  }
  int64_t paramBytes = 0;
  for (const auto& p : net->parameters()) paramBytes += nbytes(p);
  EXPECT_EQ(d.liveBytes(C::Weights), paramBytes);
  {
    auto x = torch::randn({16, 32});
    auto loss = net->forward(x).pow(2).mean();
    EXPECT_GT(d.liveBytes(C::WorkingSet), nbytes(x));  // saved activations
    MemoryScope g(C::Grads);
    loss.backward();
  }
  // Activations and backward temporaries are gone; grads stay, charged as grads.
  EXPECT_EQ(d.liveBytes(C::WorkingSet), 0);
  EXPECT_EQ(d.liveBytes(C::Grads), paramBytes);
  EXPECT_EQ(d.liveBytes(), 2 * paramBytes);
  net = nullptr;
  EXPECT_EQ(d.liveBytes(), 0);
}

TEST_F(TrackingAllocatorTest, FreeIsChargedToTheAllocatingDomainOnAnyThread) {
  MemoryDomain& a = freshDomain("allocA");
  MemoryDomain& b = freshDomain("allocB");
  torch::Tensor t;
  std::thread([&] {
    MemoryScope s(a, C::CommBuffers);
    t = torch::empty({1000});
  }).join();
  EXPECT_EQ(a.liveBytes(C::CommBuffers), 4000);
  std::thread([&] {
    MemoryScope s(b, C::WorkingSet);  // a different scope on the freeing thread
    auto mine = torch::empty({10});
    t.reset();
    EXPECT_EQ(b.liveBytes(), 40);
  }).join();
  EXPECT_EQ(a.liveBytes(), 0);
  EXPECT_EQ(a.stats().allocations.freed, 1);
  EXPECT_EQ(b.liveBytes(), 0);
  EXPECT_EQ(b.stats().bytes.freed, 40);
}

TEST_F(TrackingAllocatorTest, BlocksFromBeforeInstallAreInvisible) {
  // Stand-in for "made before installTrackingAllocator()": a block from c10's
  // default allocator. Its free must not be charged anywhere.
  c10::Allocator* ours = c10::GetCPUAllocator();
  c10::SetCPUAllocator(c10::GetDefaultCPUAllocator(), kTrackingAllocatorPriority);
  auto old = torch::empty({1000});
  c10::SetCPUAllocator(ours, kTrackingAllocatorPriority);
  ASSERT_TRUE(trackingAllocatorInstalled());
  MemoryDomain& d = freshDomain("preinstall");
  const int64_t unscopedBefore = unscopedDomain().liveBytes();
  {
    MemoryScope s(d, C::Stash);
    old.reset();
  }
  EXPECT_EQ(d.stats().bytes.freed, 0);
  EXPECT_EQ(unscopedDomain().liveBytes(), unscopedBefore);
}

TEST_F(TrackingAllocatorTest, UnscopedAllocationsAreNotLost) {
  const int64_t before = unscopedDomain().liveBytes(C::WorkingSet);
  auto t = torch::empty({256});
  EXPECT_EQ(unscopedDomain().liveBytes(C::WorkingSet), before + 1024);
}

// --- OOM ---------------------------------------------------------------------

void expectFullOomMessage(const std::string& m, const MemoryDomain& d, int64_t requested) {
  EXPECT_NE(
      m.find("out of memory on " + d.name() + ": tried to allocate " + formatBytes(requested)),
      std::string::npos)
      << m;
  EXPECT_NE(m.find(" of " + formatBytes(d.capacity()) + " in use ("), std::string::npos) << m;
  EXPECT_NE(m.find("weights " + formatBytes(600 * KiB)), std::string::npos) << m;
  EXPECT_NE(m.find("HINT:"), std::string::npos) << m;
}

TEST_F(TrackingAllocatorTest, OverCapacityThrowsBeforeTakingMemory) {
  MemoryDomain& d = freshDomain("oom", MiB);
  MemoryScope s(d, C::Weights);
  auto w = torch::empty({600 * KiB / 4});
  setRecording(true);
  drainEvents();
  const int64_t before = d.liveBytes();
  try {
    MemoryScope st(C::Stash);
    auto t = torch::empty({600 * KiB / 4});
    FAIL() << "no OOM";
  } catch (const OutOfMemoryError& e) {
    expectFullOomMessage(e.what(), d, 600 * KiB);
    EXPECT_EQ(e.info().category, C::Stash);
    EXPECT_EQ(e.info().live_by_category[index(C::Weights)], 600 * KiB);
    EXPECT_EQ(e.info().neededCapacity(), 1200 * KiB);
  }
  setRecording(false);
  EXPECT_EQ(d.liveBytes(), before);
  EXPECT_EQ(d.stats().num_ooms, 1);
  EXPECT_EQ(d.stats().allocations.allocated, 1);
  bool sawOom = false;
  for (const auto& e : drainEvents())
    if (e.domain == d.id()) {
      EXPECT_EQ(e.kind, MemoryEventKind::Oom);
      EXPECT_EQ(e.bytes, 600 * KiB);
      EXPECT_EQ(e.category, C::Stash);
      EXPECT_EQ(e.live_after, 600 * KiB);
      sawOom = true;
    }
  EXPECT_TRUE(sawOom);
  ASSERT_TRUE(lastOutOfMemory().has_value());
  EXPECT_EQ(lastOutOfMemory()->domain, d.name());
  // The domain still works below capacity.
  auto small = torch::empty({100 * KiB / 4});
  EXPECT_EQ(d.liveBytes(), 700 * KiB);
}

// What reaches the caller when the allocation fails deep inside LibTorch.
TEST_F(TrackingAllocatorTest, OomKeepsItsTypeThroughOps) {
  const auto mainThread = std::this_thread::get_id();
  MemoryDomain& d = freshDomain("oomops", MiB);
  MemoryScope s(d, C::Weights);
  auto w = torch::ones({600 * KiB / 4});                // 600 KiB weights; 424 KiB left
  auto big = [&] { return torch::ones({128, 1024}); };  // would need 512 KiB
  torch::Tensor a, b;
  {
    d.setCapacity(kUnlimited);
    a = big();
    b = big();
    d.setCapacity(d.liveBytes() + 100 * KiB);
  }
  std::vector<std::pair<const char*, std::function<void()>>> cases = {
      {"elementwise", [&] { auto c = a + b; }},
      {"matmul", [&] { auto c = torch::matmul(a.t(), b); }},
      {"conv2d",
       [&] {
         auto c = torch::conv2d(a.view({1, 1, 128, 1024}), torch::ones({4, 1, 3, 3}));
       }},
      {"cat",
       [&] {
         auto c = torch::cat({a, b});
       }},
      {"clone", [&] { auto c = a.clone(); }},
  };
  for (auto& [name, fn] : cases) {
    SCOPED_TRACE(name);
    const int64_t before = d.liveBytes();
    try {
      fn();
      FAIL() << "no OOM";
    } catch (const OutOfMemoryError& e) {
      EXPECT_EQ(e.info().domain, d.name());
    } catch (const c10::Error& e) {
      ADD_FAILURE() << "arrived as c10::Error: " << e.what();
    }
    EXPECT_EQ(d.liveBytes(), before);
  }

  // Inside an intra-op parallel region, on a pool thread: OpenMP rethrows it.
  {
    NumThreadsGuard two(2);
    ScopeLeader leader;
    const int64_t before = d.liveBytes();
    clearLastOutOfMemory();
    try {
      testing::parallelForOnPool(2, [&](int64_t i) {
        if (std::this_thread::get_id() != mainThread) auto c = torch::empty({512 * KiB / 4});
      });
      FAIL() << "no OOM";
    } catch (const OutOfMemoryError& e) {
      EXPECT_EQ(e.info().domain, d.name());
    }
    EXPECT_EQ(d.liveBytes(), before);
    EXPECT_FALSE(lastOutOfMemory().has_value());  // it was the pool thread's
    ASSERT_TRUE(lastOutOfMemoryAnyThread().has_value());
    EXPECT_EQ(lastOutOfMemoryAnyThread()->requested, 512 * KiB);
  }
}

TEST_F(TrackingAllocatorTest, OomKeepsItsTypeThroughBackward) {
  MemoryDomain& d = freshDomain("oombwd");
  MemoryScope s(d, C::WorkingSet);
  auto lin = torch::nn::Linear(256, 256);
  auto x = torch::randn({64, 256});
  auto loss = lin->forward(x).relu().sum();
  d.setCapacity(d.liveBytes());  // no room for any gradient
  try {
    loss.backward();
    FAIL() << "no OOM";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.info().domain, d.name());
    EXPECT_NE(std::string(e.what()).find("HINT"), std::string::npos);
  } catch (const c10::Error& e) {
    // Not expected in 1.13; if it ever happens the message must still carry it.
    auto info = findOutOfMemory(std::current_exception());
    ASSERT_TRUE(info.has_value()) << e.what();
    ADD_FAILURE() << "arrived wrapped in c10::Error: " << e.what();
  }
  EXPECT_GE(d.stats().num_ooms, 1);
}

TEST_F(TrackingAllocatorTest, FindOutOfMemoryRecognisesWrappedErrors) {
  MemoryDomain& d = freshDomain("wrapped", 1000);
  std::string msg;
  try {
    d.charge(C::Stash, 2000);
  } catch (const OutOfMemoryError& e) {
    auto found = findOutOfMemory(std::current_exception());
    ASSERT_TRUE(found.has_value());
    EXPECT_EQ(found->requested, 2000);
    msg = e.what();
  }
  // As TorchScript or a TORCH_CHECK re-raise would wrap it.
  try {
    TORCH_CHECK(false, "The following operation failed in the interpreter: ", msg);
  } catch (const c10::Error&) {
    auto found = findOutOfMemory(std::current_exception());
    ASSERT_TRUE(found.has_value());
    EXPECT_EQ(found->domain, d.name());
    EXPECT_EQ(found->requested, 2000);
  }
  clearLastOutOfMemory();  // details gone: the domain still comes from the message
  try {
    throw std::runtime_error("worker 3 failed: " + msg);
  } catch (...) {
    auto found = findOutOfMemory(std::current_exception());
    ASSERT_TRUE(found.has_value());
    EXPECT_EQ(found->domain, d.name());
  }
  try {
    TORCH_CHECK(false, "shape mismatch");
  } catch (...) {
    EXPECT_FALSE(findOutOfMemory(std::current_exception()).has_value());
  }
}

TEST_F(TrackingAllocatorTest, EventStreamFollowsTensorLifetimes) {
  MemoryDomain& d = freshDomain("events");
  setRecording(true);
  drainEvents();
  {
    MemoryScope s(d, C::Stash);
    auto a = torch::empty({100});  // 400 B
    {
      MemoryScope w(C::Weights);
      auto b = torch::empty({50});  // 200 B, freed at the brace
    }
    a.reset();
  }
  setRecording(false);
  std::vector<MemoryEvent> mine;
  for (const auto& e : drainEvents())
    if (e.domain == d.id()) mine.push_back(e);
  ASSERT_EQ(mine.size(), 4u);
  using K = MemoryEventKind;
  EXPECT_EQ(mine[0].kind, K::Alloc);
  EXPECT_EQ(mine[0].bytes, 400);
  EXPECT_EQ(mine[0].category, C::Stash);
  EXPECT_EQ(mine[1].kind, K::Alloc);
  EXPECT_EQ(mine[1].category, C::Weights);
  EXPECT_EQ(mine[1].live_after, 600);
  EXPECT_EQ(mine[2].kind, K::Free);
  EXPECT_EQ(mine[2].category, C::Weights);
  EXPECT_EQ(mine[3].kind, K::Free);
  EXPECT_EQ(mine[3].category, C::Stash);
  EXPECT_EQ(mine[3].live_after, 0);
  for (int i = 1; i < 4; ++i) EXPECT_GE(mine[i].time_ns, mine[i - 1].time_ns);
}

// --- Intra-op threads (Note [Intra-op threads]) ------------------------------

// Allocates 4000 B in each of two parallel_for chunks; returns how many chunks
// ran on an intra-op pool thread.
int allocateInParallelChunks(std::vector<torch::Tensor>& out) {
  out.assign(2, torch::Tensor());
  return testing::parallelForOnPool(2, [&](int64_t i) { out[i] = torch::empty({1000}); });
}

// Forward and backward through a few common kernels; nothing survives.
void trainingStep() {
  auto conv = torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).padding(1));
  auto lin = torch::nn::Linear(16 * 16 * 16, 32);
  auto emb = torch::nn::Embedding(100, 32);
  auto x = torch::randn({8, 8, 32, 32});
  auto h = torch::max_pool2d(torch::relu(conv->forward(x)), 2).flatten(1);
  auto z = torch::layer_norm(lin->forward(h) + emb->forward(torch::randint(100, {8})), {32});
  torch::nn::functional::cross_entropy(z, torch::randint(32, {8})).backward();
}

TEST_F(TrackingAllocatorTest, IntraOpThreadsWithoutLeaderGoToUnscoped) {
  NumThreadsGuard two(2);
  MemoryDomain& d = freshDomain("intra-noleader");
  MemoryScope s(d, C::Stash);
  std::vector<torch::Tensor> out;
  const int64_t unscopedBefore = unscopedDomain().liveBytes();
  const int onPool = allocateInParallelChunks(out);
  ASSERT_EQ(onPool, 1) << "expected one chunk on an OpenMP pool thread";
  // The problem the leader solves: the pool thread's block is not the device's.
  EXPECT_EQ(d.liveBytes(), 4000);
  EXPECT_EQ(unscopedDomain().liveBytes() - unscopedBefore, 4000);
  out.clear();
  // How often real kernels hit this (printed, not asserted: it depends on the
  // kernels' internals). Nothing else allocates in this process meanwhile, so any
  // unscoped allocation during the step came from an intra-op pool thread.
  const int64_t countBefore = unscopedDomain().stats().allocations.allocated;
  trainingStep();
  std::printf(
      "[ intra-op ] 2 threads, no ScopeLeader: %lld allocations of a conv/linear/"
      "layer_norm/embedding training step went to 'unscoped'\n",
      static_cast<long long>(unscopedDomain().stats().allocations.allocated - countBefore));
}

TEST_F(TrackingAllocatorTest, IntraOpThreadsFollowTheScopeLeader) {
  NumThreadsGuard two(2);
  MemoryDomain& d = freshDomain("intra-leader");
  ScopeLeader leader;  // the single-device trainer's configuration
  MemoryScope s(d, C::Stash);
  std::vector<torch::Tensor> out;
  const int64_t unscopedBefore = unscopedDomain().liveBytes();
  ASSERT_EQ(allocateInParallelChunks(out), 1);
  EXPECT_EQ(d.liveBytes(C::Stash), 8000);
  EXPECT_EQ(unscopedDomain().liveBytes(), unscopedBefore);
  {
    MemoryScope g(C::Grads);  // followed at each allocation
    std::vector<torch::Tensor> more;
    allocateInParallelChunks(more);
    EXPECT_EQ(d.liveBytes(C::Grads), 8000);
  }
  // A real training step with 2 intra-op threads: everything lands in d.
  d.resetPeak();
  const int64_t countBefore = unscopedDomain().stats().allocations.allocated;
  {
    MemoryScope w(C::WorkingSet);
    trainingStep();
  }
  EXPECT_EQ(unscopedDomain().stats().allocations.allocated, countBefore);
  EXPECT_EQ(unscopedDomain().liveBytes(), unscopedBefore);
  EXPECT_EQ(d.liveBytes(C::WorkingSet), 0);
  EXPECT_GT(d.peakBytes(), d.liveBytes());
}

TEST_F(TrackingAllocatorTest, OneIntraOpThreadPerWorkerKeepsAttributionExact) {
  // The pipeline's configuration: each device worker calls at::set_num_threads(1).
  MemoryDomain& d0 = freshDomain("worker0");
  MemoryDomain& d1 = freshDomain("worker1");
  const int64_t unscopedBefore = unscopedDomain().liveBytes();
  int64_t live[2] = {0, 0};
  auto worker = [&](MemoryDomain& d, int i) {
    at::set_num_threads(1);
    MemoryScope s(d, C::Stash);
    std::vector<torch::Tensor> out;
    EXPECT_EQ(allocateInParallelChunks(out), 0);
    auto m = torch::matmul(torch::randn({64, 64}), torch::randn({64, 64}));
    live[i] = d.liveBytes();
    EXPECT_EQ(live[i], 8000 + nbytes(m));
    EXPECT_EQ(d.stats().bytes.peak, 8000 + 3 * 64 * 64 * 4);  // a, b and the product
  };
  std::thread t0(worker, std::ref(d0), 0), t1(worker, std::ref(d1), 1);
  t0.join();
  t1.join();
  EXPECT_EQ(d0.liveBytes(), 0);
  EXPECT_EQ(d1.liveBytes(), 0);
  EXPECT_EQ(unscopedDomain().liveBytes(), unscopedBefore);
}

// --- Overhead (printed) ------------------------------------------------------

double nsPerAlloc(c10::Allocator* alloc, size_t bytes, int n) {
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    auto p = alloc->allocate(bytes);
    asm volatile("" : : "r"(p.get()) : "memory");
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
         n;
}

double nsPerEmpty(int n) {
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    auto t = torch::empty({1024});
    asm volatile("" : : "r"(t.data_ptr()) : "memory");
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
         n;
}

TEST_F(TrackingAllocatorTest, AllocationOverhead) {
  constexpr int kN = 200000;
  c10::Allocator* ours = c10::GetCPUAllocator();
  c10::Allocator* plain = c10::GetDefaultCPUAllocator();
  MemoryDomain& d = freshDomain("bench");
  MemoryScope s(d, C::WorkingSet);
  double best[4] = {1e18, 1e18, 1e18, 1e18};
  for (int rep = 0; rep < 3; ++rep) {
    best[0] = std::min(best[0], nsPerAlloc(plain, 4096, kN));
    best[1] = std::min(best[1], nsPerAlloc(ours, 4096, kN));
    c10::SetCPUAllocator(plain, kTrackingAllocatorPriority);
    best[2] = std::min(best[2], nsPerEmpty(kN));
    c10::SetCPUAllocator(ours, kTrackingAllocatorPriority);
    best[3] = std::min(best[3], nsPerEmpty(kN));
  }
  setRecording(true, 1 << 10);
  const double recording = nsPerAlloc(ours, 4096, kN);
  setRecording(false, kDefaultEventCapacity);
  drainEvents();
  std::printf(
      "[ overhead ] 4 KiB alloc+free, allocator only: untracked %.0f ns, tracked %.0f ns "
      "(+%.0f ns), tracked+recording %.0f ns\n"
      "[ overhead ] torch::empty({1024}) float: untracked %.0f ns, tracked %.0f ns (+%.0f ns)\n",
      best[0], best[1], best[1] - best[0], recording, best[2], best[3], best[3] - best[2]);
  ASSERT_TRUE(trackingAllocatorInstalled());
  EXPECT_EQ(d.liveBytes(), 0);
  EXPECT_EQ(d.stats().allocations.allocated, 3 * kN + 3 * kN + kN);
  // Loose: tracking must stay the same order as the allocation itself.
  EXPECT_LT(best[1], 4 * best[0] + 500);
}

}  // namespace
}  // namespace pipefb::memory
