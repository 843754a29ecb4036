#pragma once
// One process per device (DESIGN.md, "Distributed"; issue 8).
//
// A ProcessGroup is the narrow face of a c10d process group that the pipeline runtime
// needs: tagged point-to-point sends and receives of tensor lists (Send*/Recv*, the
// stash of a stage whose F and B run in different processes, SyncWeights), a sum
// all-reduce and a barrier. The engine is c10d itself: makeGlooGroup() rendezvouses
// through c10d::TCPStore and runs on c10d::ProcessGroupGloo (CPU); makeNcclGroup()
// (cuda/NcclGroup.h) runs the same group on c10d::ProcessGroupNCCL (GPUs).
//
// Messages carry their own shapes: send() writes a small header (dtype, shapes) and
// then the tensors' data as one flat buffer, so the receiver needs no shape
// knowledge (Note [Message tags] in ProcessGroup.cpp).
#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace pipefb::dist {

/// torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.
struct DistEnv {
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
};

/// The environment of this process; nullopt when WORLD_SIZE is unset (one process).
/// Bad values are a UserError naming the variable.
std::optional<DistEnv> envFromTorchrun();

/// A peer died, or did not answer within the timeout. what() names the peer rank.
class PeerError : public std::runtime_error {
 public:
  PeerError(const std::string& message, int peer) : std::runtime_error(message), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

/// A receive was woken by abort() (the pipeline is stopping for another reason).
class Aborted : public std::runtime_error {
 public:
  Aborted() : std::runtime_error("c10d receive aborted") {}
};

struct GroupOptions {
  /// Rendezvous, and any single send or receive, give up after this (distributed.timeout).
  double timeoutSeconds = 30.0;
};

/// A collective in flight (ProcessGroup::allreduceAsync).
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  /// Blocks until the collective completed; PeerError when a rank died or timed out.
  virtual void wait() = 0;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;

  /// Posts the send of `tensors` (one dtype) to rank `dst` under `tag` and returns at
  /// once; the group holds them until the receiver took them. A send that fails later
  /// is re-raised (PeerError) by the next send(), recv() or flush().
  virtual void send(std::vector<at::Tensor> tensors, int dst, int64_t tag) = 0;
  /// Receives the tensors rank `src` sent under `tag`, allocated on the calling thread
  /// (its memory scope). Blocks up to the timeout: PeerError when `src` died or stayed
  /// silent, Aborted after abort().
  virtual std::vector<at::Tensor> recv(int src, int64_t tag) = 0;
  /// Sum over all ranks, in place.
  virtual void allreduce(std::vector<at::Tensor>& tensors) = 0;
  /// The same, started and not waited for (Note [Gradient buckets] in PipelineEngine.cpp):
  /// the tensors must stay untouched until wait() returned. Every rank starts its
  /// collectives of one group in the same order.
  virtual std::shared_ptr<PendingCollective> allreduceAsync(std::vector<at::Tensor> tensors) = 0;
  virtual void barrier() = 0;
  /// Waits until every posted send was delivered (PeerError if one failed).
  virtual void flush() = 0;
  /// Wakes every blocked recv() with Aborted; later ones throw Aborted at once.
  virtual void abort() = 0;
  /// Records `text` as the job's first failure in the rendezvous store (the first
  /// caller wins; silently nothing when the store is gone).
  virtual void publishFailure(const std::string& text) = 0;
  /// The first failure a rank published, or "" (none, or the store is gone).
  virtual std::string firstFailure() = 0;
  /// Ranks (world numbering) of this group on this host whose process is gone (Note
  /// [Gone ranks] in ProcessGroup.cpp); a failed collective names them.
  virtual std::vector<int> goneRanks() = 0;
  /// A group of `ranks` (this rank among them; ranks are renumbered 0..n-1 in their
  /// order), e.g. the replicas of one device. Every rank in `ranks` calls it with the same
  /// name and list.
  virtual std::shared_ptr<ProcessGroup> subgroup(const std::string& name,
                                                 const std::vector<int>& ranks) = 0;
};

/// Rendezvous through c10d::TCPStore at MASTER_ADDR:MASTER_PORT (rank 0 hosts it) and a
/// c10d::ProcessGroupGloo over it. A bad rendezvous (port taken or unreachable, ranks
/// that disagree on WORLD_SIZE, a rank missing past the timeout) is a UserError.
std::shared_ptr<ProcessGroup> makeGlooGroup(const DistEnv& env, const GroupOptions& options);

}  // namespace pipefb::dist
