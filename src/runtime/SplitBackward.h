#pragma once
// Private to src/runtime: the autograd half of I(s,m) and W(s,m) (Note [Split backward],
// pipefb/schedules/Action.h). The engine's execInputGrad / execWeightGrad take the stash,
// compute the loss and accumulate into .grad as execBackward does; this file holds what
// differs: which gradients each half asks autograd for, and what W keeps alive.
//
// Note [Split backward in the runtime]
// I(s,m) asks autograd for d loss / d input only, with retain_graph: the engine prunes
// every node that leads to a parameter alone (Node::task_should_compute_output), so
// AddmmBackward, ConvolutionBackward, ... skip their weight outputs. W(s,m) asks the
// retained graph for d loss / d params, from the same root and output gradient, and frees
// it. Between the two the device keeps the stage's autograd graph (its saved tensors:
// the stash, or under a checkpoint policy what IR's recompute saved) and the output
// gradient: exactly the stash the contract counts in flight until W (MemoryContract::
// deferredW; the cost file's deferred_bytes defaults to stash_bytes), plus one tensor the
// size of the stage output.
// Why not per layer (capture each weight layer's output gradient in I, then
// convolution_backward / addmm in W)? W would hold those output gradients on top of the
// saved inputs, which the graph keeps anyway (about +50% of a VGG stash, +30% of a GPT-2
// block's), so deferred_bytes would no longer be the stash, and layers without a separate
// weight kernel (BatchNorm, LayerNorm, attention) need a path of their own. The price of
// going through the graph: W re-runs the stage's chain of activation gradients from its
// output down to the first layer holding weights (only the first layer's input gradient
// is skipped), so I + W can exceed B by up to I. Measured on VGG16 (experiments/README.md,
// "zb_runtime"), the mean I + W is 0.89-1.08 B, within the loaded machine's noise of the
// cost model's I + W = B.
#include <torch/torch.h>

#include <vector>

namespace pipefb::runtime {

/// What W(s,m) needs from I(s,m): the retained graph (through its root) and the gradient
/// of the loss w.r.t. the stage output.
struct DeferredWeightGrad {
  torch::Tensor output;   // root of the stage's autograd graph
  torch::Tensor gradOut;  // (same shape as output)
};

/// I: d loss / d input from `output`'s graph, keeping the graph for W. Undefined when
/// `input` is undefined or does not require grad (stage 0), or `output` has no graph.
torch::Tensor inputGradient(const DeferredWeightGrad& w, const torch::Tensor& input);

/// W: d loss / d params from the graph I kept (one entry per param, undefined for an
/// unused one or when the output has no graph), then frees the graph.
std::vector<torch::Tensor> weightGradients(DeferredWeightGrad& w,
                                           const std::vector<torch::Tensor>& params);

/// dst[i] = src[i] without bumping dst[i]'s version counter: IR restores the BatchNorm
/// statistics its recompute advanced while W still has to unpack them from the graph
/// (batch_norm saves running_mean/var; a plain copy_ would fail W's version check). The
/// forwards of other microbatches update them the same way, in place below autograd.
void restoreBuffersUnversioned(const std::vector<torch::Tensor>& dst,
                               const std::vector<torch::Tensor>& src);

}  // namespace pipefb::runtime
