// Note [Chunked loss] (model/ChunkedLoss.h): the same loss and logits' gradient as torch's
// cross_entropy, a chunk of rows at a time, and B's memory as the note charges it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipefb/memory/DomainRegistry.h"
#include "pipefb/memory/MemoryScope.h"
#include "pipefb/memory/TrackingAllocator.h"
#include "pipefb/model/ChunkedLoss.h"
#include "pipefb/model/Model.h"

namespace pipefb::model {
namespace {

struct LossAndGrad {
  torch::Tensor loss, grad;
};

// The loss and d loss / d logits, the loss seeded with `seed` (a loss scale).
LossAndGrad run(const torch::Tensor& logits, const torch::Tensor& target, int64_t chunk,
                double seed = 1.0) {
  auto x = logits.detach().requires_grad_(true);
  auto l = chunk > 0 ? chunkedCrossEntropy(x, target, chunk)
                     : torch::nn::functional::cross_entropy(x, target);
  auto g = torch::autograd::grad({l}, {x}, {torch::full_like(l, seed)})[0];
  return {l.detach(), g};
}

double relErr(const torch::Tensor& got, const torch::Tensor& want) {
  const auto w = want.to(torch::kFloat64), d = got.to(torch::kFloat64) - w;
  return d.abs().max().item<double>() / std::max(w.abs().max().item<double>(), 1e-300);
}

TEST(ChunkedLoss, MatchesCrossEntropyForEveryChunk) {
  torch::manual_seed(3);
  const int64_t N = 37, V = 50;
  const auto target = torch::randint(V, {N}, torch::kLong);
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    const auto logits = 4 * torch::randn({N, V}, dtype);
    const auto want = run(logits, target, 0, 1024.0);
    const double tol = dtype == torch::kFloat64 ? 1e-12 : 1e-6;
    for (int64_t chunk : {1, 7, 36, 37, 1000}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      const auto got = run(logits, target, chunk, 1024.0);
      EXPECT_EQ(got.loss.scalar_type(), dtype);
      EXPECT_EQ(got.grad.scalar_type(), dtype);
      EXPECT_LE(relErr(got.loss, want.loss), tol);
      EXPECT_LE(relErr(got.grad, want.grad), tol);
    }
  }
}

// Under bf16 autocast both compute in fp32 from the same bf16 logits: the same loss, and
// gradients whose fp32 values differ in their last bits, so that their bf16 roundings differ
// by at most one bf16 step (2^-7 relative).
TEST(ChunkedLoss, MatchesCrossEntropyUnderBf16Autocast) {
  torch::manual_seed(4);
  const int64_t N = 64, V = 300;
  const auto logits = (4 * torch::randn({N, V})).to(torch::kBFloat16);
  const auto target = torch::randint(V, {N}, torch::kLong);
  Autocast autocast("bf16", torch::kCPU);
  const auto want = run(logits, target, 0), got = run(logits, target, 16);
  EXPECT_EQ(got.grad.scalar_type(), torch::kBFloat16);
  EXPECT_LE(relErr(got.loss, want.loss), 1e-6);
  const auto w = want.grad.to(torch::kFloat64), d = (got.grad.to(torch::kFloat64) - w).abs();
  EXPECT_TRUE(torch::all(d <= w.abs() * std::ldexp(1.0, -7) + 1e-12).item<bool>());
}

// What B allocates for the loss: the logits' gradient and two fp32 chunks with the chunked
// loss (the note's charge), and at least the log-softmax and the gradient without it.
TEST(ChunkedLoss, HoldsTheGradientAndTwoChunks) {
  memory::installTrackingAllocator();
  torch::manual_seed(5);
  const int64_t N = 2048, V = 1024, chunk = 128, full = N * V * 4;
  const auto logits = torch::randn({N, V});
  const auto target = torch::randint(V, {N}, torch::kLong);
  auto peak = [&](int64_t c) {
    static int n = 0;
    auto& d = memory::configureDomain("chunked-loss:" + std::to_string(n++), memory::kUnlimited);
    {
      memory::MemoryScope scope(d, MemoryCategory::WorkingSet);
      run(logits, target, c);
    }
    return d.peakBytes();
  };
  const int64_t chunked = peak(chunk), plain = peak(0);
  EXPECT_LE(chunked, full + 2 * chunk * V * 4 + 64 * 1024);
  EXPECT_GE(chunked, full);  // the gradient itself
  EXPECT_GE(plain, 2 * full);
}

TEST(ChunkedLoss, ModelLossUsesItForGpt2) {
  ModelOptions o;
  o.name = "gpt2";
  o.size = "tiny";
  o.input_size = 8;
  o.num_classes = 32;
  o.loss_chunk = 5;
  auto model = buildModel(o);
  torch::manual_seed(6);
  const auto out = torch::randn({3, 8, 32}), target = torch::randint(32, {3, 8}, torch::kLong);
  const auto l = model->loss(out.requires_grad_(true), target);
  EXPECT_NE(l.grad_fn()->name().find("ChunkedCrossEntropy"), std::string::npos)
      << l.grad_fn()->name();
  EXPECT_LE(
      relErr(l, torch::nn::functional::cross_entropy(out.reshape({-1, 32}), target.reshape({-1}))),
      1e-6);
}

}  // namespace
}  // namespace pipefb::model
