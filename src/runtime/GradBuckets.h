#pragma once
// Private to src/runtime: the gradient all-reduce of pipeline.replicas, in buckets
// started while backward runs. GradBuckets.cpp holds the bucket layout, the hooks on the
// final B, and AR(s).
//
// Note [Gradient buckets]
// With pipeline.replicas (hybrid data + pipeline parallelism) a stage's gradients are
// averaged over its replicas before STEP, the way DDP's reducer does it. The stage's
// parameters, in reverse order (the order backward finishes them), fill buckets of about
// distributed.bucket_mb MiB; each bucket is one flat buffer (CommBuffers, on the backward
// device), made at the stage's first AR and reused. During the B that completes the
// stage's gradients of the iteration (the last B(s, m) before AR(s) in the device's list),
// post hooks on the autograd nodes that feed a parameter's accumulator see that
// parameter's gradient as soon as backward computed it: the hook adds it to .grad (the
// add B makes anyway), copies the now final .grad into its bucket slot, and once a bucket
// is complete starts its all-reduce (c10d, asynchronous). The all-reduce of the last
// layers' gradients so runs while backward still works on the first layers. Buckets
// start in index order on every rank (a bucket that completes early waits for those
// before it), so the replicas' collectives pair up. What no hook saw (a parameter fed by
// more than one node, an unused one) is added after autograd returns, as before, and the
// remaining buckets start then. AR(s) waits for the buckets in order, divides by R and
// copies the means back into .grad: the same sums and the same division as the single
// concatenated bucket it replaces. distributed.overlap: false starts every bucket at AR
// (no hooks), for comparison.
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace pipefb::dist {
class PendingCollective;
}

namespace pipefb::runtime {

struct GradBuckets {
  struct Bucket {
    std::vector<int> params;       // indices into the stage's params
    std::vector<int64_t> offsets;  // their element offsets in flat
    torch::Tensor flat;
    int missing = 0;  // parameters whose gradient is not final yet (this iteration)
    std::shared_ptr<dist::PendingCollective> work;
    int64_t startNs = 0;
    size_t record = 0;  // its entry in the engine's bucket log
  };
  std::vector<Bucket> buckets;
  std::vector<int> bucketOf, slotOf;  // per parameter
  std::vector<char> ready;            // per parameter: final and in its bucket
  int next = 0;                       // the next bucket to start
  bool active = false;                // this iteration's buckets are being filled
  int backwardAction = -1;            // the B filling them (index into the device's list)
  bool inAutograd = false;            // hooks run: the B's autograd call has not returned
  int64_t backwardDoneNs = 0;         // when it returned
};

}  // namespace pipefb::runtime
