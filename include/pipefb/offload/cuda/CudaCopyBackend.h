#pragma once
// The CUDA copy backend (Note [Copy backends], pipefb/offload/CopyBackend.h; issue 17).
// Built and linked in every build (Note [CUDA sources]); runs only on a GPU.
//
//   engines    one CudaCopyEngine per pipeline device and role: its own CUDA stream on
//              the device's GPU and a thread that queues LibTorch copies on it
//              (c10::cuda::CUDAStreamGuard), so several pipeline devices on one GPU each
//              have their own copy streams;
//   fences     at::cuda::CUDAEvent: recorded on the producer's current stream (its
//              compute stream) when it hands tensors over, waited for by the copy stream
//              (compute before offload); recorded after a prefetch's copies and waited
//              for by the consumer's stream in acquire() (prefetch before compute);
//   finish     synchronizes the copy stream on the copy thread, then raises an OOM that
//              the allocator hook recorded (Note [CUDA accounting]);
//   handOver   record_stream() on the consumer's stream, so the caching allocator keeps
//              a prefetched block from the copy stream until compute is done with it;
//   host pool  blocks registered with cudaHostRegister (pinned): D2H and H2D copies run
//              asynchronously on the copy streams.
#include <memory>
#include <vector>

#include "pipefb/offload/CopyBackend.h"

namespace pipefb::offload {

/// Pipeline device d's copy streams are on GPU gpuOfDevice[d]; tensors for a domain go
/// to memory::cuda::gpuOfDomain() (the CPU for any other domain).
std::shared_ptr<CopyBackend> cudaCopyBackend(std::vector<int> gpuOfDevice);

}  // namespace pipefb::offload
