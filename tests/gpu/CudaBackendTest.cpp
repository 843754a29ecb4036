// The CUDA backend's pieces on a GPU (issue 17; ctest label `gpu`): per-device memory
// domains on one GPU (Note [CUDA accounting]), the CUDA copy backend under the transfer
// manager (Note [Copy backends]) and NCCL groups (Note [c10d backends]). Built in every
// build (Note [CUDA sources]); every test skips without a GPU.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <atomic>
#include <thread>

#include "pipefb/dist/cuda/NcclGroup.h"
#include "pipefb/memory/TrackingAllocator.h"
#include "pipefb/memory/cuda/CudaMemory.h"
#include "pipefb/offload/TransferManager.h"
#include "pipefb/offload/cuda/CudaCopyBackend.h"

namespace {

using namespace pipefb;

#define PIPEFB_NEED_GPUS(n)                                                                        \
  do {                                                                                             \
    if (static_cast<int>(torch::cuda::device_count()) < (n))                                       \
      GTEST_SKIP() << "needs " << (n) << " GPU(s), " << torch::cuda::device_count() << " visible"; \
  } while (0)

#define PIPEFB_NEED_ACCOUNTING()                                                     \
  do {                                                                               \
    if (const std::string why = memory::cuda::installCudaAccounting(); !why.empty()) \
      GTEST_SKIP() << why;                                                           \
  } while (0)

int64_t nbytes(const at::Tensor& t) { return static_cast<int64_t>(t.numel()) * t.element_size(); }

TEST(CudaMemory, TwoPipelineDevicesOnOneGpuAreAccountedApart) {
  PIPEFB_NEED_GPUS(1);
  PIPEFB_NEED_ACCOUNTING();
  auto& a = memory::cuda::configureCudaDomain(0, 0, memory::kUnlimited);
  auto& b = memory::cuda::configureCudaDomain(1, 0, memory::kUnlimited);
  a.resetStats();
  b.resetStats();
  const auto cuda = torch::TensorOptions().device(torch::kCUDA, 0);
  at::Tensor x, y;
  {
    memory::MemoryScope s(a, MemoryCategory::Stash);
    x = torch::empty({1 << 20}, cuda);  // 4 MiB
  }
  {
    memory::MemoryScope s(b, MemoryCategory::Weights);
    y = torch::empty({3 << 20}, cuda);  // 12 MiB
  }
  EXPECT_EQ(a.liveBytes(MemoryCategory::Stash), nbytes(x));
  EXPECT_EQ(b.liveBytes(MemoryCategory::Weights), nbytes(y));
  EXPECT_EQ(a.liveBytes(MemoryCategory::Weights), 0);
  const auto gpu = memory::cuda::gpuMemory(0);
  EXPECT_GE(gpu.allocated, nbytes(x) + nbytes(y));  // the GPU's total holds both devices
  EXPECT_GT(gpu.total, gpu.allocated);
  x = at::Tensor();
  EXPECT_EQ(a.liveBytes(), 0);
  EXPECT_EQ(a.peakBytes(), 4 << 20);
  EXPECT_EQ(b.liveBytes(), 12 << 20);
}

TEST(CudaMemory, OverBudgetNamesDeviceBytesAndTheSmallestBudget) {
  PIPEFB_NEED_GPUS(1);
  PIPEFB_NEED_ACCOUNTING();
  auto& d = memory::cuda::configureCudaDomain(2, 0, 8 << 20);
  d.resetStats();
  const auto cuda = torch::TensorOptions().device(torch::kCUDA, 0);
  memory::MemoryScope s(d, MemoryCategory::WorkingSet);
  auto keep = torch::empty({1 << 20}, cuda);  // 4 MiB of 8
  auto over = torch::empty({2 << 20}, cuda);  // 8 MiB more: refused by the domain
  try {
    memory::cuda::throwPendingOutOfMemory();
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.info().domain, memory::cuda::cudaDeviceName(2, 0));
    EXPECT_EQ(e.info().requested, 8 << 20);
    EXPECT_EQ(e.info().neededCapacity(), 12 << 20);
    EXPECT_NE(std::string(e.what()).find("smallest capacity"), std::string::npos) << e.what();
  }
  memory::cuda::throwPendingOutOfMemory();  // raised once
  EXPECT_EQ(d.stats().num_ooms, 1);
}

TEST(CudaTransfer, OffloadWaitsForComputeAndPrefetchRoundTripsThroughPinnedMemory) {
  PIPEFB_NEED_GPUS(1);
  PIPEFB_NEED_ACCOUNTING();
  auto& dev = memory::cuda::configureCudaDomain(0, 0, memory::kUnlimited);
  auto& host = memory::configureDomain("test-cuda-host", memory::kUnlimited);
  dev.resetStats();
  offload::TransferOptions o;
  o.numDevices = 1;
  o.backend = offload::cudaCopyBackend({0});
  offload::TransferManager tm(host, o);
  // The compute stream of pipeline device 0: the tensor is still being written on it when
  // the offload is issued, so only the fence makes the copy see the final values.
  c10::cuda::CUDAStreamGuard compute(c10::cuda::getStreamFromPool(false, 0));
  memory::MemoryScope scope(dev, MemoryCategory::Stash);
  auto x = torch::zeros({64, 1024, 1024}, torch::TensorOptions().device(torch::kCUDA, 0));
  for (int i = 0; i < 20; ++i) x.add_(1);
  const int64_t bytes = nbytes(x);
  tm.offload(0, {0, 0, 0}, {x});
  x = at::Tensor();
  tm.synchronize();
  EXPECT_EQ(dev.liveBytes(MemoryCategory::Stash), 0);  // released once copied
  EXPECT_EQ(tm.hostMemoryKind(), offload::HostMemoryKind::Pinned);
  auto back = tm.acquire(0, {0, 0, 0}, dev);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_TRUE(back[0].is_cuda());
  EXPECT_EQ(dev.liveBytes(MemoryCategory::Stash), bytes);
  EXPECT_EQ(back[0].min().item<float>(), 20.0f);
  EXPECT_EQ(back[0].max().item<float>(), 20.0f);
  const auto c = tm.counters(0);
  EXPECT_EQ(c.bytesD2H, bytes);
  EXPECT_EQ(c.bytesH2D, bytes);
  EXPECT_GT(c.copySeconds, 0);
}

TEST(Nccl, WorldSizeOneOnOneGpu) {
  PIPEFB_NEED_GPUS(1);
  dist::DistEnv env;
  env.masterPort = 29671;
  auto g = dist::makeNcclGroup(env, {30.0});
  EXPECT_EQ(g->backend(), "nccl");
  std::vector<at::Tensor> t{
      torch::full({1000}, 3.0f, torch::TensorOptions().device(torch::kCUDA, 0))};
  g->allreduce(t);
  EXPECT_EQ(t[0].sum().item<float>(), 3000.0f);
  g->barrier();
}

TEST(Nccl, TwoRanksOnTwoGpusSendReceiveAndAllReduce) {
  PIPEFB_NEED_GPUS(2);  // NCCL refuses two ranks on one GPU
  std::atomic<int> ok{0};
  auto rank = [&](int r) {
    dist::DistEnv env;
    env.rank = r;
    env.localRank = r;
    env.worldSize = 2;
    env.masterPort = 29672;
    auto g = dist::makeNcclGroup(env, {60.0});
    const auto cuda = torch::TensorOptions().device(torch::kCUDA, r);
    std::vector<at::Tensor> t{torch::full({256}, float(r + 1), cuda)};
    g->allreduce(t);
    bool good = t[0].sum().item<float>() == 256 * 3.0f;
    if (r == 0) {
      g->send({torch::arange(10, cuda).to(torch::kFloat)}, 1, 7);
      g->flush();
    } else {
      auto got = g->recv(0, 7);
      good = good && got.size() == 1 && got[0].is_cuda() && got[0].sum().item<float>() == 45.0f;
    }
    g->barrier();
    if (good) ++ok;
  };
  std::thread r1(rank, 1);
  rank(0);
  r1.join();
  EXPECT_EQ(ok.load(), 2);
}

}  // namespace
