#include "pipefb/model/ChunkedLoss.h"

#include <algorithm>

namespace pipefb::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Note [Chunked loss]
struct ChunkedCrossEntropy : public torch::autograd::Function<ChunkedCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& target, int64_t chunk) {
    const int64_t N = logits.size(0);
    const auto wide = torch::promote_types(logits.scalar_type(), torch::kFloat);
    auto lse = torch::empty({N}, logits.options().dtype(wide));
    auto picked = torch::empty({N}, logits.options().dtype(wide));
    for (int64_t r = 0; r < N; r += chunk) {
      const int64_t n = std::min(chunk, N - r);
      const auto x = logits.narrow(0, r, n).to(wide);
      lse.narrow(0, r, n).copy_(torch::logsumexp(x, 1));
      picked.narrow(0, r, n).copy_(x.gather(1, target.narrow(0, r, n).unsqueeze(1)).squeeze(1));
    }
    ctx->save_for_backward({logits, target, lse});
    ctx->saved_data["chunk"] = chunk;
    return (lse - picked).mean();
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &logits = saved[0], &target = saved[1], &lse = saved[2];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const int64_t N = logits.size(0);
    const auto scale = grads[0].to(lse.scalar_type()) / static_cast<double>(N);
    auto grad = torch::empty_like(logits);
    for (int64_t r = 0; r < N; r += chunk) {
      const int64_t n = std::min(chunk, N - r);
      const auto t = target.narrow(0, r, n).unsqueeze(1);
      auto p =
          (logits.narrow(0, r, n).to(lse.scalar_type()) - lse.narrow(0, r, n).unsqueeze(1)).exp_();
      p.scatter_add_(1, t, torch::full({n, 1}, -1.0, p.options()));
      p.mul_(scale);
      grad.narrow(0, r, n).copy_(p);
    }
    return {grad, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor chunkedCrossEntropy(const torch::Tensor& logits, const torch::Tensor& target,
                                  int64_t chunk) {
  TORCH_CHECK(logits.dim() == 2 && target.dim() == 1 && target.size(0) == logits.size(0),
              "chunkedCrossEntropy: logits (N, V) and target (N), got ", logits.sizes(), " and ",
              target.sizes());
  TORCH_CHECK(chunk >= 1, "chunkedCrossEntropy: chunk must be >= 1, got ", chunk);
  return ChunkedCrossEntropy::apply(logits, target, chunk);
}

}  // namespace pipefb::model
