// The data-transfer manager: host pool, copy engines, saved-tensor hooks (issue 5).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <future>
#include <mutex>
#include <thread>

#include "pipefb/memory/MemoryEvent.h"
#include "pipefb/memory/TrackingAllocator.h"
#include "pipefb/offload/CopyBackend.h"
#include "pipefb/offload/HostPool.h"
#include "pipefb/offload/SavedTensorHooks.h"
#include "pipefb/offload/TransferManager.h"

using namespace pipefb;
using offload::TransferKey;

namespace {
class OffloadEnv : public ::testing::Environment {
 public:
  void SetUp() override {
    memory::installTrackingAllocator();
    offload::installSavedTensorHooks();  // before the first autograd call
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new OffloadEnv);

memory::MemoryDomain& freshDomain(const std::string& name, int64_t capacity = memory::kUnlimited) {
  auto& d = memory::configureDomain(name, capacity);
  d.resetStats();
  return d;
}
}  // namespace

TEST(HostPool, SizeClassesRoundUpByAtMostAQuarter) {
  EXPECT_EQ(offload::HostPool::sizeClass(1), 4096);
  EXPECT_EQ(offload::HostPool::sizeClass(4097), 8192);
  EXPECT_EQ(offload::HostPool::sizeClass(65536), 65536);
  EXPECT_EQ(offload::HostPool::sizeClass(65537), 65536 + 16384);
  EXPECT_EQ(offload::HostPool::sizeClass(1 << 20), 1 << 20);
  EXPECT_EQ(offload::HostPool::sizeClass((1 << 20) + 1), (1 << 20) + (1 << 18));
  for (int64_t b : {100000, 777777, 12345678}) {
    EXPECT_GE(offload::HostPool::sizeClass(b), b);
    EXPECT_LE(offload::HostPool::sizeClass(b), b + b / 4 + 4096);
  }
}

TEST(HostPool, ChargesItsDomainReusesBlocksAndRefusesCleanly) {
  auto& dom = freshDomain("test-host-pool", 1 << 20);
  offload::HostPool pool(dom);
  auto like = torch::empty({1000}, torch::kFloat);  // 4000 bytes
  {
    auto a = pool.allocate(like);
    EXPECT_EQ(a.sizes(), like.sizes());
    EXPECT_EQ(dom.liveBytes(MemoryCategory::Stash), 4000);
    a.fill_(3);
    EXPECT_EQ(a.sum().item<float>(), 3000);
  }
  EXPECT_EQ(dom.liveBytes(), 0);
  { auto b = pool.allocate(like); }
  auto st = pool.stats();
  EXPECT_EQ(st.allocations, 2);
  EXPECT_EQ(st.reuses, 1);
  EXPECT_EQ(st.systemAllocations, 1);
  EXPECT_EQ(st.peakBytes, 4000);
  // Exhaustion: an OutOfMemoryError naming the domain; the pool keeps working.
  auto keep = pool.allocate(torch::empty({200000}, torch::kFloat));  // 800 KB
  try {
    pool.allocate(torch::empty({100000}, torch::kFloat));
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.info().domain, "test-host-pool");
    EXPECT_EQ(e.info().requested, 400000);
  }
  EXPECT_EQ(dom.liveBytes(), 800000);
  keep = torch::Tensor();
  auto again = pool.allocate(torch::empty({100000}, torch::kFloat));
  EXPECT_EQ(dom.liveBytes(), 400000);
  std::cout << "host pool memory: " << offload::toString(pool.kind()) << "\n";
}

TEST(TransferManager, OffloadReleasesTheDeviceCopyOnlyAfterTheCopyAndPrefetchBringsItBack) {
  auto& dev0 = freshDomain("test-dev0");
  auto& dev1 = freshDomain("test-dev1");
  auto& host = freshDomain("test-host");
  offload::TransferManager mgr(host, {2, true});
  torch::Tensor x, y;
  {
    memory::MemoryScope s(dev0, MemoryCategory::Stash);
    x = torch::randn({64, 128});
    y = torch::arange(10);
  }
  auto xr = x.clone(), yr = y.clone();
  EXPECT_EQ(dev0.liveBytes(MemoryCategory::Stash), 64 * 128 * 4 + 10 * 8);
  mgr.offload(0, {0, 1, 2}, {x, torch::Tensor(), y});
  x = y = torch::Tensor();
  mgr.synchronize();
  EXPECT_EQ(dev0.liveBytes(MemoryCategory::Stash), 0);  // released after the D2H copy
  EXPECT_EQ(host.liveBytes(MemoryCategory::Stash), 64 * 128 * 4 + 10 * 8);
  mgr.prefetch(1, {0, 1, 2}, dev1);
  auto got = mgr.acquire(1, {0, 1, 2}, dev1);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(torch::equal(got[0], xr));
  EXPECT_FALSE(got[1].defined());
  EXPECT_TRUE(torch::equal(got[2], yr));
  EXPECT_EQ(dev1.liveBytes(MemoryCategory::Stash), 64 * 128 * 4 + 10 * 8);
  EXPECT_EQ(host.liveBytes(), 0);  // the host copy went back to the pool
  EXPECT_EQ(mgr.pending(), 0u);
  auto c0 = mgr.counters(0), c1 = mgr.counters(1);
  EXPECT_EQ(c0.bytesD2H, 64 * 128 * 4 + 10 * 8);
  EXPECT_EQ(c1.bytesH2D, 64 * 128 * 4 + 10 * 8);
  EXPECT_EQ(c0.offloads, 1);
  EXPECT_EQ(c1.prefetches, 1);
  EXPECT_EQ(c0.intervals.size(), 1u);
  EXPECT_GE(mgr.hostPoolStats().peakBytes, 64 * 128 * 4);
}

// Note [Release as copied]: within one offload job, a tensor's device copy goes as soon
// as its own D2H copy is done, before the next tensor's host block is even taken.
TEST(TransferManager, OffloadReleasesEachTensorAsSoonAsItIsCopied) {
  auto& dev = freshDomain("test-dev-rac");
  auto& host = freshDomain("test-host-rac");
  offload::TransferManager mgr(host, {1, false});
  const int64_t aBytes = 3 << 20, bBytes = 5 << 20;  // distinct sizes, to tell them apart
  std::vector<torch::Tensor> job;
  {
    memory::MemoryScope s(dev, MemoryCategory::Stash);
    job.push_back(torch::ones({aBytes / 4}));
    job.push_back(torch::full({bBytes / 4}, 2.0f));
  }
  ASSERT_EQ(dev.liveBytes(MemoryCategory::Stash), aBytes + bBytes);
  memory::drainEvents();
  memory::setRecording(true);
  mgr.offload(0, {0, 0, 0}, std::move(job));  // the manager holds the only references
  mgr.synchronize();
  memory::setRecording(false);
  int64_t freeA = -1, hostAllocB = -1;
  for (const auto& e : memory::drainEvents()) {
    if (e.domain == dev.id() && e.kind == memory::MemoryEventKind::Free && e.bytes == aBytes)
      freeA = e.time_ns;
    if (e.domain == host.id() && e.kind == memory::MemoryEventKind::Alloc && e.bytes == bBytes)
      hostAllocB = e.time_ns;
  }
  ASSERT_GE(freeA, 0) << "the first tensor's device copy was never freed";
  ASSERT_GE(hostAllocB, 0) << "the second tensor never reached the host pool";
  EXPECT_LE(freeA, hostAllocB) << "the first tensor lived until the second one's copy";
  EXPECT_EQ(dev.liveBytes(), 0);
  auto got = mgr.acquire(0, {0, 0, 0}, dev);
  EXPECT_EQ(got[0].sum().item<double>(), aBytes / 4);
  EXPECT_EQ(got[1].sum().item<double>(), 2.0 * (bBytes / 4));
}

// Note [Held offload copies]: a held offload keeps its device copy after its copy to the
// host is done, and after B took the stash elsewhere, until the device's next OFF (with
// maxOffloadsInFlight 1); an offload without hold releases as copied.
TEST(TransferManager, HeldOffloadKeepsItsDeviceCopyUntilTheNextOffload) {
  auto& dev0 = freshDomain("test-dev-held");
  auto& dev1 = freshDomain("test-dev-held-b");
  auto& host = freshDomain("test-host-held");
  offload::TransferManager mgr(host, {2, false, /*maxOffloadsInFlight=*/1});
  const int64_t bytes = 64 * 128 * 4;
  auto stash = [&] {
    memory::MemoryScope s(dev0, MemoryCategory::Stash);
    return std::vector<torch::Tensor>{torch::randn({64, 128})};
  };
  mgr.offload(0, {0, 0, 0}, stash(), MemoryCategory::Stash, /*hold=*/true);
  mgr.synchronize();
  EXPECT_EQ(dev0.liveBytes(MemoryCategory::Stash), bytes);  // copied, still held
  auto got = mgr.acquire(1, {0, 0, 0}, dev1);
  EXPECT_EQ(got[0].numel(), 64 * 128);
  EXPECT_EQ(dev0.liveBytes(MemoryCategory::Stash), bytes);  // B took it: still held
  mgr.offload(0, {0, 0, 1}, stash(), MemoryCategory::Stash, /*hold=*/false);
  mgr.synchronize();
  EXPECT_EQ(dev0.liveBytes(MemoryCategory::Stash), 0);  // released by the next OFF
  mgr.offload(0, {0, 0, 2}, stash(), MemoryCategory::Stash, /*hold=*/true);
  mgr.drop({0, 0, 2});
  mgr.synchronize();
  EXPECT_EQ(dev0.liveBytes(MemoryCategory::Stash), 0);  // a drop releases it too
}

TEST(TransferManager, PrefetchIssuedBeforeTheOffloadWaitsOnTheCopyEngine) {
  auto& dev = freshDomain("test-dev2");
  auto& host = freshDomain("test-host2");
  offload::TransferManager mgr(host, {2, false});
  mgr.prefetch(1, {0, 0, 7}, dev);  // the OFF on device 0 has not run yet
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto t = torch::full({1000}, 2.0);
  mgr.offload(0, {0, 0, 7}, {t});
  auto got = mgr.acquire(1, {0, 0, 7}, dev);
  EXPECT_TRUE(torch::equal(got[0], t));
  // acquire without a prefetch issues one and counts the wait as stall.
  mgr.offload(0, {0, 0, 8}, {t});
  got = mgr.acquire(0, {0, 0, 8}, dev);
  EXPECT_TRUE(torch::equal(got[0], t));
  EXPECT_GT(mgr.counters(0).stallSeconds, 0);
  // drop forgets a key whether or not its copies ran.
  mgr.offload(0, {0, 0, 9}, {t});
  mgr.drop({0, 0, 9});
  mgr.synchronize();
  EXPECT_EQ(mgr.pending(), 0u);
  EXPECT_EQ(host.liveBytes(), 0);
}

namespace {
// The CPU backend whose offload jobs, while armed, wait for open() before they copy: a
// copy engine that lags, on demand.
class GatedBackend : public offload::CopyBackend {
 public:
  struct Gate : offload::CopyFence {
    std::shared_future<void> opened;
    void block() override { opened.wait(); }
  };
  void arm() {
    std::lock_guard<std::mutex> lock(mu_);
    promise_ = std::promise<void>();
    gate_ = std::make_shared<Gate>();
    gate_->opened = promise_.get_future().share();
  }
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    promise_.set_value();
    gate_ = nullptr;
  }
  std::string name() const override { return "gated"; }
  std::unique_ptr<offload::CopyEngine> makeEngine(int device, const std::string& role) override {
    return cpu_->makeEngine(device, role);
  }
  std::shared_ptr<offload::CopyFence> fence() override {
    std::lock_guard<std::mutex> lock(mu_);  // copy engines call it too
    return gate_;
  }
  at::Tensor emptyLike(const at::Tensor& like, const memory::MemoryDomain& domain) override {
    return cpu_->emptyLike(like, domain);
  }
  offload::HostMemoryKind hostKind() const override { return cpu_->hostKind(); }
  offload::HostMemoryKind pinHost(void* block, std::size_t bytes) override {
    return cpu_->pinHost(block, bytes);
  }
  void unpinHost(void* block, std::size_t bytes, offload::HostMemoryKind kind) override {
    cpu_->unpinHost(block, bytes, kind);
  }

 private:
  std::shared_ptr<offload::CopyBackend> cpu_ = offload::cpuCopyBackend();
  std::mutex mu_;
  std::promise<void> promise_;
  std::shared_ptr<Gate> gate_;
};
}  // namespace

// Note [Prefetches behind their stage's offloads]: a prefetch issued while the device still
// copies out an offload of the same stage gets its destination once that copy is done (here
// from the acquire after its wait), never beside that offload's device copy.
TEST(TransferManager, PrefetchBehindItsStagesOffloadBindsOnceThatCopyIsDone) {
  auto& dev = freshDomain("test-dev-behind");
  auto& host = freshDomain("test-host-behind");
  auto backend = std::make_shared<GatedBackend>();
  offload::TransferManager mgr(host, {1, false, /*maxOffloadsInFlight=*/1, backend});
  const int64_t bytes = 64 * 128 * 4;
  auto stash = [&] {
    memory::MemoryScope s(dev, MemoryCategory::Stash);
    return std::vector<torch::Tensor>{torch::randn({64, 128})};
  };
  mgr.offload(0, {0, 3, 0}, stash());
  mgr.offload(0, {0, 3, 1}, stash());
  mgr.synchronize();  // on the host; the stage's layout is known
  ASSERT_EQ(dev.liveBytes(MemoryCategory::Stash), 0);
  backend->arm();
  mgr.offload(0, {0, 3, 2}, stash());  // its copy waits for the gate
  mgr.prefetch(0, {0, 3, 0}, dev);
  mgr.prefetch(0, {0, 3, 1}, dev);
  EXPECT_EQ(dev.liveBytes(MemoryCategory::Stash), bytes) << "bound beside the copy going out";
  mgr.prefetch(0, {0, 4, 0}, dev);  // another stage's: nothing to wait for, but no layout
  backend->open();
  auto first = mgr.acquire(0, {0, 3, 0}, dev);
  // The offload is done and gone; the second prefetch is bound (or its copy holds it).
  EXPECT_EQ(dev.liveBytes(MemoryCategory::Stash), 2 * bytes);
  auto second = mgr.acquire(0, {0, 3, 1}, dev);
  EXPECT_EQ(dev.liveBytes(MemoryCategory::Stash), 2 * bytes);
  mgr.drop({0, 4, 0});
  mgr.drop({0, 3, 2});
  mgr.synchronize();
}

TEST(TransferManager, HostPoolExhaustionReachesAcquireAsOutOfMemory) {
  auto& dev = freshDomain("test-dev3");
  auto& host = freshDomain("test-host3", 1000);
  offload::TransferManager mgr(host, {1, false});
  mgr.offload(0, {0, 0, 0}, {torch::zeros({1000})});
  EXPECT_THROW(mgr.acquire(0, {0, 0, 0}, dev), OutOfMemoryError);
  // Still usable.
  mgr.offload(0, {0, 0, 1}, {torch::zeros({10})});
  EXPECT_EQ(mgr.acquire(0, {0, 0, 1}, dev)[0].numel(), 10);
}

TEST(TransferManager, CloseWakesWaiters) {
  auto& dev = freshDomain("test-dev4");
  auto& host = freshDomain("test-host4");
  offload::TransferManager mgr(host, {1, false});
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    mgr.close();
  });
  EXPECT_THROW(mgr.acquire(0, {0, 0, 0}, dev), offload::TransferCancelled);  // never offloaded
  closer.join();
}

TEST(TransferManager, OverlapOfSortedIntervals) {
  using I = offload::CopyInterval;
  // copies [0,10) [20,30); compute [5,25) -> 5 + 5 ns.
  EXPECT_NEAR(offload::TransferManager::overlapSeconds({I{0, 10}, I{20, 30}}, {I{5, 25}}), 10e-9,
              1e-15);
  EXPECT_EQ(offload::TransferManager::overlapSeconds({I{0, 10}}, {}), 0);
  EXPECT_NEAR(offload::TransferManager::overlapSeconds({I{0, 100}}, {I{10, 20}, I{30, 40}}), 20e-9,
              1e-15);
}

TEST(SavedTensorHooks, OffloadedSavedTensorsGiveTheSameGradients) {
  ASSERT_TRUE(offload::savedTensorHooksInstalled());
  torch::manual_seed(3);
  auto l1 = torch::nn::Linear(32, 64), l2 = torch::nn::Linear(64, 8);
  auto x = torch::randn({16, 32});
  auto f = [&](const torch::Tensor& in) { return l2(torch::relu(l1(in))).pow(2).sum(); };
  // Reference.
  auto xr = x.clone().requires_grad_(true);
  f(xr).backward();
  auto g1 = l1->weight.grad().clone(), gx = xr.grad().clone();
  l1->weight.mutable_grad().zero_();
  // Offloaded.
  auto& dev = freshDomain("test-dev5");
  auto& host = freshDomain("test-host5");
  offload::TransferManager mgr(host, {1, false});
  auto group = std::make_shared<offload::SavedTensorGroup>();
  for (auto& p : l1->parameters()) group->skip(p);
  for (auto& p : l2->parameters()) group->skip(p);
  auto xi = x.clone().requires_grad_(true);
  torch::Tensor loss;
  {
    memory::MemoryScope s(dev, MemoryCategory::Stash);
    offload::StashScope scope(group);
    loss = f(xi);
  }
  ASSERT_GT(group->size(), 0u);
  const int64_t saved = group->bytes();
  EXPECT_GT(saved, 0);
  mgr.offload(0, {0, 0, 0}, group->take());
  mgr.synchronize();
  EXPECT_EQ(host.liveBytes(), saved);
  const int64_t base = dev.liveBytes(MemoryCategory::Stash);  // the loss itself, 4 B
  group->restore(mgr.acquire(0, {0, 0, 0}, dev));
  EXPECT_EQ(dev.liveBytes(MemoryCategory::Stash), base + saved);
  auto grads = torch::autograd::grad({loss}, {l1->weight, xi});
  EXPECT_TRUE(torch::allclose(grads[0], g1));
  EXPECT_TRUE(torch::allclose(grads[1], gx));
  // Note [Saved tensors go as they are used]: every node ran, so the restored stash is
  // gone although the graph (loss's grad_fn) and the group are still alive.
  EXPECT_EQ(group->bytes(), 0);
  EXPECT_EQ(dev.liveBytes(MemoryCategory::Stash), base);
  // A saved tensor whose graph is gone before the offload is not copied at all.
  auto g3 = std::make_shared<offload::SavedTensorGroup>();
  torch::Tensor kept;
  {
    offload::StashScope scope(g3);
    auto a = torch::randn({100}).requires_grad_(true);
    kept = (a * a).sum();  // saves a (twice: one slot, two users)
    (a.exp() * 3).sum();   // exp saves its result; graph dropped here
  }
  ASSERT_EQ(g3->size(), 2u);
  auto taken = g3->take();
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_TRUE(taken[0].defined());
  EXPECT_FALSE(taken[1].defined()) << "exp's result was collected though nothing can use it";
  // Outside a StashScope nothing is caught.
  auto g2 = std::make_shared<offload::SavedTensorGroup>();
  f(x.clone().requires_grad_(true)).backward();
  EXPECT_EQ(g2->size(), 0u);
}

// Note [Views of one storage]: mm saves b.t() and b, two views of one 512-byte storage.
TEST(SavedTensorHooks, ViewsOfOneStorageGoOnce) {
  ASSERT_TRUE(offload::savedTensorHooksInstalled());
  torch::manual_seed(5);
  auto f = [](const torch::Tensor& in) {
    auto b = in * 2;
    return b.t().mm(b).pow(2).sum();  // pow saves mm's 16x16 result (1024 bytes)
  };
  auto x = torch::randn({8, 16});
  auto xr = x.clone().requires_grad_(true);
  f(xr).backward();
  auto& dev = freshDomain("test-dev6");
  auto& host = freshDomain("test-host6");
  offload::TransferManager mgr(host, {1, false});
  auto group = std::make_shared<offload::SavedTensorGroup>();
  auto xi = x.clone().requires_grad_(true);
  torch::Tensor loss;
  {
    memory::MemoryScope s(dev, MemoryCategory::Stash);
    offload::StashScope scope(group);
    loss = f(xi);
  }
  ASSERT_EQ(group->size(), 3u);
  auto taken = group->take();
  ASSERT_EQ(taken.size(), 3u);
  mgr.offload(0, {0, 0, 0}, std::move(taken));
  mgr.synchronize();
  EXPECT_EQ(host.liveBytes(), 512 + 1024) << "a storage's views were copied each on its own";
  const int64_t base = dev.liveBytes(MemoryCategory::Stash);
  group->restore(mgr.acquire(0, {0, 0, 0}, dev));
  EXPECT_EQ(dev.liveBytes(MemoryCategory::Stash), base + 512 + 1024);
  auto g = torch::autograd::grad({loss}, {xi});
  EXPECT_TRUE(torch::allclose(g[0], xr.grad()));
  EXPECT_EQ(dev.liveBytes(MemoryCategory::Stash), base);
}

// Note [Hollow graph ends]: the runtime swaps an offloaded stash's graph input and output
// for hollow tensors; backward through that graph gives the reference gradients, and the
// hollow tensors hold no device memory (zeros({}).expand held 4 bytes each).
TEST(SavedTensorHooks, HollowGraphEndsHoldNothing) {
  ASSERT_TRUE(offload::savedTensorHooksInstalled());
  torch::manual_seed(7);
  auto l1 = torch::nn::Linear(16, 32), l2 = torch::nn::Linear(32, 8);
  auto f = [&](const torch::Tensor& in) { return l2(torch::tanh(l1(in))); };  // (4,8)
  auto x = torch::randn({4, 16});
  auto gy = torch::randn({4, 8});
  auto xr = x.clone().requires_grad_(true);
  torch::autograd::backward({f(xr)}, {gy});
  auto& dev = freshDomain("test-dev7");
  auto& host = freshDomain("test-host7");
  offload::TransferManager mgr(host, {1, false});
  auto group = std::make_shared<offload::SavedTensorGroup>();
  for (auto& p : l1->parameters()) group->skip(p);
  for (auto& p : l2->parameters()) group->skip(p);
  torch::Tensor xi, y;
  int64_t before = 0;
  {
    memory::MemoryScope s(dev, MemoryCategory::Stash);
    xi = x.clone().requires_grad_(true);
    before = dev.liveBytes(MemoryCategory::Stash);
    offload::StashScope scope(group);
    y = f(xi);
  }
  mgr.offload(0, {0, 0, 0}, group->take());
  mgr.synchronize();
  {
    memory::MemoryScope s(dev, MemoryCategory::Stash);
    torch::NoGradGuard noGrad;
    xi.set_data(offload::hollowLike(xi));
    y.set_data(offload::hollowLike(y));
  }
  EXPECT_EQ(xi.sizes(), x.sizes());
  EXPECT_EQ(y.sizes(), gy.sizes());
  EXPECT_EQ(y.scalar_type(), torch::kFloat);
  // Input and output gone, saved tensors on the host: the device holds nothing of them.
  EXPECT_EQ(before, static_cast<int64_t>(x.nbytes()));
  EXPECT_EQ(dev.liveBytes(MemoryCategory::Stash), 0);
  {
    // The check sees the old hollow tensor's element.
    memory::MemoryScope s(dev, MemoryCategory::Stash);
    auto old = torch::zeros({}, y.options()).expand(y.sizes());
    EXPECT_EQ(dev.liveBytes(MemoryCategory::Stash), 4);
  }
  group->restore(mgr.acquire(0, {0, 0, 0}, dev));
  torch::autograd::backward({y}, {gy});
  EXPECT_TRUE(torch::allclose(xi.grad(), xr.grad()));
  EXPECT_THROW(y.add_(1), c10::Error) << "a hollow tensor must refuse writes";
  EXPECT_EQ(offload::hollowLike(torch::empty({3}, torch::kLong)).scalar_type(), torch::kLong);
}
