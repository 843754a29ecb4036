#pragma once
// Private to src/runtime: how the engine's devices hand each other tensors. In one
// process a message is a mailbox entry (Channels); to a device of another process it is
// a c10d send/recv under tagOf() (PipelineEngine::Impl::post / receive, Channels.cpp).
//
// Note [Channels across processes]
// With EngineOptions::group (one process per device, issue 8) this process runs the
// worker of device group->rank() mod D only. A message to or from a device of another
// process is a c10d send/recv (pipefb/dist/ProcessGroup.h) under tagOf(its ChanKey);
// between devices of this process it stays a mailbox. Sends never block (the group
// holds the buffer until delivered), receives block until the peer sent, died, or
// distributed.timeout passed (PeerError: the failure names the action and the rank).
// The stash of a stage whose F and B run in different processes can only be its stage
// input (checkpoint kinds, checked in build()): OFF sends it from host memory, PRE posts
// its receive on a helper thread, and B waits for it. The loss is all-reduced in
// step(), so every rank returns it.
#include <torch/torch.h>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "pipefb/common/MemoryCategory.h"

namespace pipefb::memory {
class MemoryDomain;
}

namespace pipefb::runtime {

struct StashEntry;  // Stash.h

// Thrown inside a worker whose receive was woken because the pipeline is stopping.
struct Cancelled {};

enum class Chan : std::uint8_t { Act, Grad, Weights, Input, Target, Stash };

struct ChanKey {
  Chan kind;
  int stage;
  int index;
  int device;  // receiver (-1 for the host stash registry)
  bool operator<(const ChanKey& o) const {
    return std::tie(kind, stage, index, device) < std::tie(o.kind, o.stage, o.index, o.device);
  }
};

struct Message {
  std::vector<torch::Tensor> tensors;
  std::shared_ptr<StashEntry> stash;
  // What `tensors` belong to, held until the receiver is done with them (a weight
  // prediction sent by reference, Note [Weight syncs]).
  std::shared_ptr<void> owner;
  // Channels::offer's: `tensors` are still the sender's, for the receiver to copy.
  bool offered = false;
};

// In-process mailboxes. A receive blocks until its message is there, or throws
// Cancelled once the pipeline stops.
class Channels {
 public:
  void put(const ChanKey& k, Message m);
  Message take(const ChanKey& k);
  // Note [Rendezvous hand-over]: a message sent at its receive (Note [Message rendezvous]
  // in schedules/Messages.h). Returns false at once when a receiver already waits in
  // take(k): the caller posts m as usual. Otherwise leaves m, uncopied, for take(k) and
  // blocks until the receiver copied it and called release(k) (or throws Cancelled once
  // the pipeline stops).
  bool offer(const ChanKey& k, Message& m);
  void release(const ChanKey& k);
  std::optional<Message> tryTake(const ChanKey& k);
  void close();
  // Drops every message (their tensors are freed on the calling thread).
  void clear();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<ChanKey, Message> box_;
  std::set<ChanKey> receiving_;         // keys a take() waits for
  std::map<ChanKey, Message> offered_;  // Note [Rendezvous hand-over]
  std::set<ChanKey> released_;
  bool closed_ = false;
};

// Note [Message tags] in ProcessGroup.cpp: c10d tags stay below 2^29. The microbatch
// index (run-wide, so it carries the iteration) wraps at 2^17, far more than are ever in
// flight between two ranks; stages < 256.
int64_t tagOf(const ChanKey& k);

// A copy of `t` in `domain` under `category`: what a receiver's mailbox holds.
torch::Tensor copyInto(const torch::Tensor& t, memory::MemoryDomain& domain,
                       MemoryCategory category);

}  // namespace pipefb::runtime
