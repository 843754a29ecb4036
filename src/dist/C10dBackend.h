#pragma once
// Note [c10d backends]
// The group of ProcessGroup.cpp (rendezvous on a c10d::TCPStore, message tags and
// headers, first failures, gone ranks, subgroups) runs over one c10d backend, made by a
// BackendSpec: gloo on the CPU (makeGlooGroup), NCCL on GPUs (makeNcclGroup,
// cuda/NcclGroup.cpp). Only two things differ between them: how a backend is made over a
// store, and the device of the message buffers (NCCL moves CUDA tensors only). NCCL
// matches point-to-point messages by their order between two ranks, not by tag; the
// runtime posts them in schedule order on both sides, so the two agree.
#include <c10/core/Device.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "pipefb/dist/ProcessGroup.h"

namespace pipefb::dist::detail {

// What ProcessGroupGloo and ProcessGroupNCCL derive from. The group drives its backends
// directly: it needs only their point-to-point messages and collectives, which a
// c10d::ProcessGroup around them would only dispatch to.
using C10dBackend = c10d::Backend;

struct BackendSpec {
  std::string name;               // "gloo", "nccl": in logs and errors
  c10::Device device{c10::kCPU};  // where message buffers are made
  /// Note [One message, one operation] (ProcessGroup.cpp): the backend completes a receive
  /// with a message shorter than the buffer posted for it (gloo; NCCL needs the sizes to
  /// match), so a small message's data can ride with its header.
  bool shortReceives = false;
  /// One backend for `rank` of `size` over `store`; throws when it cannot connect.
  std::function<c10::intrusive_ptr<C10dBackend>(const c10::intrusive_ptr<c10d::Store>& store,
                                                int rank, int size,
                                                std::chrono::milliseconds timeout)>
      make;
};

/// The rendezvous at env's MASTER_ADDR:MASTER_PORT and a group over `spec`'s backend.
std::shared_ptr<ProcessGroup> makeC10dGroup(const DistEnv& env, const GroupOptions& options,
                                            BackendSpec spec);

}  // namespace pipefb::dist::detail
