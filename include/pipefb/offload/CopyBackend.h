#pragma once
// Note [Copy backends]
// What the data-transfer manager (TransferManager.h) needs from a device kind, and
// nothing more (STYLE.md habit 8: a narrow interface):
//
//   makeEngine   the copy engine of a device: a thread (CPU), a thread that drives a
//                CUDA copy stream (offload/cuda/CudaCopyBackend.h);
//   fence        taken on the producing thread when it hands tensors over: on a GPU a
//                CUDA event recorded on its compute stream. The copy stream waits for
//                it before it reads them (compute before offload);
//   finish       inside a copy job, after its copies were queued: returns once they
//                are done (an event on the copy stream, synchronized on the copy
//                thread, never on a compute thread);
//   handOver     on the consuming thread (acquire): its stream waits for the job's
//                fence (prefetch before compute), and the tensors are marked as used by
//                that stream, so the caching allocator does not give their blocks to the
//                copy stream while compute still reads them;
//   emptyLike    a tensor on the device that a memory domain accounts for;
//   pinHost      how the host pool's blocks are page-locked (mlock, or registered
//                with the CUDA driver: pinned, so that copies run asynchronously).
//
// The CPU backend is what TransferManager did before backends existed: every member
// is a no-op except makeEngine (ThreadCopyEngine), emptyLike (at::empty on the CPU) and
// pinHost (mlock).
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "pipefb/offload/CopyEngine.h"

namespace pipefb::memory {
class MemoryDomain;
}

namespace pipefb::offload {

enum class HostMemoryKind;

/// A point in a stream's work (a CUDA event); see Note [Copy backends].
class CopyFence {
 public:
  virtual ~CopyFence() = default;
  /// Makes the calling thread's current stream wait for the work before the fence.
  /// Never blocks the calling thread.
  virtual void block() = 0;
};

class CopyBackend {
 public:
  virtual ~CopyBackend() = default;
  /// "cpu", "cuda".
  virtual std::string name() const = 0;
  /// The copy engine `role` ("copy", "in-place") of pipeline device `device`.
  virtual std::unique_ptr<CopyEngine> makeEngine(int device, const std::string& role) = 0;
  /// Whether copies may be queued without waiting (copy_(..., non_blocking)); finish()
  /// then waits for them.
  virtual bool asyncCopies() const { return false; }
  /// On the producing thread: a fence after the work queued on its stream so far; null
  /// where that work is already done when the call returns (CPU).
  virtual std::shared_ptr<CopyFence> fence() { return nullptr; }
  /// Inside a copy job: returns once the copies it queued are done.
  virtual void finish() {}
  /// On the consuming thread: its stream waits for `ready` (may be null) and takes over
  /// `tensors` (made on a copy engine).
  virtual void handOver(const std::vector<at::Tensor>& tensors, CopyFence* ready) {}
  /// An uninitialised tensor of `like`'s sizes and dtype on the device `domain` accounts
  /// for, charged to the calling thread's memory scope.
  virtual at::Tensor emptyLike(const at::Tensor& like, const memory::MemoryDomain& domain) = 0;
  /// What pinHost() gives when it succeeds: Locked (mlock) or Pinned (CUDA).
  virtual HostMemoryKind hostKind() const = 0;
  /// Page-locks a new host-pool block; the kind it got (HostMemoryKind::Plain: failed).
  virtual HostMemoryKind pinHost(void* block, std::size_t bytes) = 0;
  /// Undoes pinHost() (kind as it returned) before the block is freed.
  virtual void unpinHost(void* block, std::size_t bytes, HostMemoryKind kind) = 0;
};

/// The virtual-device backend (threads, mlock).
std::shared_ptr<CopyBackend> cpuCopyBackend();

}  // namespace pipefb::offload
