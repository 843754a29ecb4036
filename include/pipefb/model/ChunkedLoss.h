#pragma once
// The mean cross-entropy over a large vocabulary, a chunk of rows at a time (issue 36).
//
// Note [Chunked loss]
// torch's cross_entropy over (N, V) logits casts them to fp32 under autocast, keeps the fp32
// log-softmax for its backward, and makes an fp32 gradient of the same size, cast back to
// the logits' dtype: three or four N x V tensors at the last stage's B. For GPT-2 small at
// 1024 tokens (V = 50,257) that is 206 MB a sample for each fp32 one, and it bounded the
// smallest budget of a half-precision plan (experiments/README.md, half_precision).
// chunkedCrossEntropy (model.loss_chunk: C tokens) computes the same loss and gradient
// C rows at a time:
//  - forward: per chunk, the rows' logsumexp and the target's logit, in fp32 (fp64 for
//    fp64 logits); it keeps the logits it was given (the stage output, alive until B
//    anyway) and N fp32 logsumexps;
//  - backward: per chunk, softmax = exp(logit - logsumexp), minus 1 at the target, times
//    the incoming gradient / N, written into a gradient in the logits' dtype.
// So B holds the logits, their gradient in their own dtype, and one chunk's fp32 softmax
// and its temporary: 2 x C x V x 4 bytes whatever the microbatch. The loss is the mean over
// the N rows, as cross_entropy's default reduction; there is no ignore_index. The planner's
// analytic GPT-2 head charges this (planner/AnalyticProfile.cpp); a measured profile
// measures it.
#include <torch/torch.h>

namespace pipefb::model {

/// Mean cross-entropy of `logits` (N, V) against class ids `target` (N), computed `chunk`
/// rows at a time (Note [Chunked loss]). A scalar in fp32 (fp64 for fp64 logits).
torch::Tensor chunkedCrossEntropy(const torch::Tensor& logits, const torch::Tensor& target,
                                  int64_t chunk);

}  // namespace pipefb::model
