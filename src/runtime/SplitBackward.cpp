// Note [Split backward in the runtime] (SplitBackward.h).
#include "SplitBackward.h"

#include <ATen/core/LegacyTypeDispatch.h>

namespace pipefb::runtime {

torch::Tensor inputGradient(const DeferredWeightGrad& w, const torch::Tensor& input) {
  if (!input.defined() || !input.requires_grad() || !w.output.requires_grad()) return {};
  return torch::autograd::grad({w.output}, {input}, {w.gradOut}, /*retain_graph=*/true,
                               /*create_graph=*/false, /*allow_unused=*/true)[0];
}

std::vector<torch::Tensor> weightGradients(DeferredWeightGrad& w,
                                           const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> wrt, out(params.size());
  for (const auto& p : params)
    if (p.requires_grad()) wrt.push_back(p);
  if (!wrt.empty() && w.output.requires_grad()) {
    auto g = torch::autograd::grad({w.output}, wrt, {w.gradOut}, /*retain_graph=*/false,
                                   /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t i = 0, j = 0; i < params.size(); ++i)
      if (params[i].requires_grad()) out[i] = std::move(g[j++]);
  }
  w = DeferredWeightGrad{};  // the graph (and with it the stash) goes here
  return out;
}

void restoreBuffersUnversioned(const std::vector<torch::Tensor>& dst,
                               const std::vector<torch::Tensor>& src) {
  at::AutoDispatchBelowADInplaceOrView belowAutograd;
  for (size_t i = 0; i < dst.size() && i < src.size(); ++i) dst[i].copy_(src[i]);
}

}  // namespace pipefb::runtime
