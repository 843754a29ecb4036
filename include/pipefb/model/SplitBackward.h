#pragma once
// The autograd half of I(s,m) and W(s,m) (Note [Split backward],
// pipefb/schedules/Action.h). The engine's execInputGrad / execWeightGrad take the stash,
// compute the loss and accumulate into .grad as execBackward does; this file holds what
// differs: which gradients each half asks autograd for, and what W keeps alive.
//
// Note [Split backward in the runtime]
// I(s,m) runs autograd from the stage output down to the stage input, keeping the graph
// (retain_graph): the engine prunes every edge that leads to a parameter alone
// (Node::task_should_compute_output), so AddmmBackward, ConvolutionBackward, ... skip
// their weight outputs. Along the way it keeps, for each node of the input's path that
// has an edge towards a parameter (a "weight node": addmm's, a convolution's, a norm's),
// the gradient flowing into it: the engine captures it as an output of the same call.
// W(s,m) cuts the weight nodes' edges back into the input's path and runs autograd from
// them, with the kept gradients, to the parameters: only the weight kernels and what lies
// between them and the parameters (a transpose), never the chain of activation gradients
// again. The off-path parts of the graph cannot lead back into the input's path (a node
// that did would be on it), so once those edges are cut no gradient is counted twice, and
// a parameter used by several weight nodes sums their parts as B does.
// Between the two the device keeps the stage's autograd graph (its saved tensors: the
// stash, or under a checkpoint policy what IR's recompute saved) and the kept gradients
// (LayerCost::keptGradBytes, measured by the profiler with this same I), not the output
// or its gradient: MemoryContract::deferredW counts such stashes, Note [What waits for W]
// in planner/CostModel.h charges them.
// A stage without an input gradient (stage 0) has no I to speak of: its W runs the whole
// backward from the output and its gradient, which wait for it.
// Before (until the comparison with torch.distributed.pipelining, experiments/README.md,
// "peer_pipelining"), W asked the retained graph for the weight gradients from the stage
// output. It kept nothing but the output's gradient, and ran the chain of activation
// gradients a second time: on GPT-2 tiny's last device I + W was 1.19x B, against 1.05x
// for torch's split, which keeps the gradients as this one does.
#include <torch/torch.h>

#include <vector>

namespace pipefb::model {

/// What W(s,m) needs from I(s,m).
struct DeferredWeightGrad {
  torch::Tensor output;   // root of the stage's autograd graph; released by I when it keeps
  torch::Tensor gradOut;  // (same shape as output)
  /// The weight nodes' inputs and the gradients I kept for them (Note [Split backward in
  /// the runtime]); empty when W runs from the output.
  std::vector<torch::autograd::Edge> roots;
  std::vector<torch::Tensor> kept;
  /// Per weight node, the edges into the input's path W cuts: (node, next-edge index).
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, size_t>> cut;
};

/// I: d loss / d input from `output`'s graph, keeping the graph and the weight nodes'
/// gradients for W. Undefined (and nothing kept) when `input` is undefined or does not
/// require grad (stage 0), or `output` has no graph.
torch::Tensor inputGradient(DeferredWeightGrad& w, const torch::Tensor& input,
                            const std::vector<torch::Tensor>& params);

/// The bytes of the gradients I kept for W.
std::int64_t keptBytes(const DeferredWeightGrad& w);

/// W: d loss / d params from what I kept (one entry per param, undefined for an unused one
/// or when the output has no graph), then frees the graph.
std::vector<torch::Tensor> weightGradients(DeferredWeightGrad& w,
                                           const std::vector<torch::Tensor>& params);

/// W in place: as weightGradients, but autograd adds each parameter's gradient into its
/// .grad as it makes it (AccumulateGrad; a linear layer's straight into .grad under
/// WeightGradientsIntoGrad), so no stage's worth of fresh gradients is ever held together
/// (Note [In-place weight gradients] in src/runtime/StageCompute.cpp). For `params` that are
/// the ones the graph was built on; then frees the graph.
void accumulateWeightGradients(DeferredWeightGrad& w, const std::vector<torch::Tensor>& params);

/// dst[i] = src[i] without bumping dst[i]'s version counter: IR restores the BatchNorm
/// statistics its recompute advanced while W still has to unpack them from the graph
/// (batch_norm saves running_mean/var; a plain copy_ would fail W's version check). The
/// forwards of other microbatches update them the same way, in place below autograd.
void restoreBuffersUnversioned(const std::vector<torch::Tensor>& dst,
                               const std::vector<torch::Tensor>& src);

}  // namespace pipefb::model
