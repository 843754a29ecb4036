#pragma once
// The process group on NCCL (issue 17; Note [c10d backends] in src/dist/C10dBackend.h):
// one process per GPU under pipefb_launch or torchrun, for the pipeline's sends and
// receives and the hybrid gradient all-reduce. Built and linked in every build (Note
// [CUDA sources]); runs only where there are GPUs.
#include <memory>

#include "pipefb/dist/ProcessGroup.h"

namespace pipefb::dist {

/// The GPU of a rank: LOCAL_RANK modulo the visible GPUs.
int ncclDeviceOf(const DistEnv& env);

/// The rendezvous of makeGlooGroup() and a c10d::ProcessGroupNCCL on GPU ncclDeviceOf(env)
/// (made current on the calling thread). Message buffers live on that GPU. NCCL refuses
/// two ranks on one GPU; a UserError says so when there are fewer GPUs than local ranks.
std::shared_ptr<ProcessGroup> makeNcclGroup(const DistEnv& env, const GroupOptions& options);

}  // namespace pipefb::dist
