// The engine's channels: in-process mailboxes and messages across processes (Note
// [Channels across processes] in Channels.h), and the send/receive actions.
#include "Channels.h"

#include "EngineImpl.h"
#include "pipefb/common/Error.h"
#include "pipefb/memory/MemoryScope.h"
#include "pipefb/schedules/Messages.h"

namespace pipefb::runtime {

void Channels::put(const ChanKey& k, Message m) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    PIPEFB_ASSERT(!box_.count(k), "duplicate message on a channel");
    box_.emplace(k, std::move(m));
  }
  cv_.notify_all();
}

Message Channels::take(const ChanKey& k) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (closed_) throw Cancelled{};
    auto it = box_.find(k);
    if (it != box_.end()) {
      Message m = std::move(it->second);
      box_.erase(it);
      receiving_.erase(k);
      return m;
    }
    // Note [Rendezvous hand-over]: a sender waits with it; the receiver copies it.
    if (auto o = offered_.find(k); o != offered_.end()) {
      Message m = std::move(o->second);
      offered_.erase(o);
      receiving_.erase(k);
      return m;
    }
    receiving_.insert(k);
    cv_.wait(lock);
  }
}

// Note [Rendezvous hand-over]
// A rendezvous send (Note [Message rendezvous] in schedules/Messages.h) must not put its
// message in the receiver's memory before the receiver waits for it. The sender used to
// wait for the receiver to reach take() and then copy the message over, so a receiver
// that came second slept until the sender's thread ran again, and then until its own did:
// two thread wake-ups per message on the receiver's path (decoupled resnet50/8
// pipefb-async on the loaded 2-core machine: the first backward range's RG waits grew 2-3x
// and iterations 14-47% longer than sending when made). Now the sender that comes first
// leaves the message, still in its own memory (as it held it while waiting), and waits;
// the receiver takes it in take(), copies it into its own domain (PipelineEngine::Impl::
// receive) and releases the sender. A receiver that comes first waits as for any message.
bool Channels::offer(const ChanKey& k, Message& m) {
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) throw Cancelled{};
  if (receiving_.count(k)) return false;
  m.offered = true;
  offered_.emplace(k, std::move(m));
  cv_.notify_all();
  cv_.wait(lock, [&] { return closed_ || released_.count(k) > 0; });
  if (released_.erase(k) == 0) throw Cancelled{};
  return true;
}

void Channels::release(const ChanKey& k) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    released_.insert(k);
  }
  cv_.notify_all();
}

std::optional<Message> Channels::tryTake(const ChanKey& k) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = box_.find(k);
  if (it == box_.end()) return std::nullopt;
  Message m = std::move(it->second);
  box_.erase(it);
  return m;
}

void Channels::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

void Channels::clear() {
  std::map<ChanKey, Message> old, offered;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old.swap(box_);
    offered.swap(offered_);
    released_.clear();
  }
}

int64_t tagOf(const ChanKey& k) {
  return ((static_cast<int64_t>(k.index) & ((1 << 17) - 1)) * 256 + (k.stage & 255)) * 8 +
         static_cast<int>(k.kind);
}

torch::Tensor copyInto(const torch::Tensor& t, memory::MemoryDomain& domain,
                       MemoryCategory category) {
  memory::MemoryScope scope(domain, category);
  return t.detach().clone();
}

bool PipelineEngine::Impl::isLocal(int d) const { return !options.group || d == myDevice; }

// Note [Channels across processes]
void PipelineEngine::Impl::post(int peer, const ChanKey& k, std::vector<Tensor> tensors) {
  if (isLocal(peer)) {
    Message m;
    for (const auto& t : tensors)
      m.tensors.push_back(copyInto(t, *devices[peer].domain, MemoryCategory::CommBuffers));
    channels.put(k, std::move(m));
    return;
  }
  memory::MemoryScope scope(MemoryCategory::CommBuffers);  // the send buffer until delivered
  options.group->send(std::move(tensors), rankOf(peer), tagOf(k));
}

std::vector<Tensor> PipelineEngine::Impl::receive(int peer, const ChanKey& k) {
  if (isLocal(peer)) {
    Message m = channels.take(k);
    if (!m.offered) return m.tensors;
    // Note [Rendezvous hand-over]: the sender's tensors, copied here; then it may go.
    std::vector<Tensor> out;
    for (const auto& t : m.tensors)
      out.push_back(copyInto(t, *devices[k.device].domain, MemoryCategory::CommBuffers));
    m.tensors.clear();
    channels.release(k);
    return out;
  }
  memory::MemoryScope scope(MemoryCategory::CommBuffers);
  return options.group->recv(rankOf(peer), tagOf(k));
}

// Note [Message rendezvous] (schedules/Messages.h): an activation or gradient between two
// devices of one PipeFB pass, or the last stage's output from a forward-only device to a
// backward-only one, waits here, not on its receiver (Note [Rendezvous hand-over]).
void PipelineEngine::Impl::sendAt(DeviceState& dev, const Action& a, const ChanKey& key, Tensor t) {
  if (isLocal(a.peer) &&
      schedules::rendezvous(passes, dev.id, a.peer,
                            schedules::messageKind(a, plan.schedule.numStages))) {
    Message m;
    m.tensors.push_back(std::move(t));
    if (channels.offer(key, m)) return;
    t = std::move(m.tensors.at(0));
  }
  post(a.peer, key, {t});
}

void PipelineEngine::Impl::execSendAct(DeviceState& dev, const Action& a) {
  Tensor t = takeFrom(dev.acts, {a.stage, a.index}, "activation");
  const ChanKey key{Chan::Act, a.stage, a.index, a.peer};
  sendAt(dev, a, key, std::move(t));
}

void PipelineEngine::Impl::execRecvAct(DeviceState& dev, const Action& a) {
  dev.acts[{a.stage, a.index}] = receive(a.peer, {Chan::Act, a.stage, a.index, dev.id}).at(0);
}

void PipelineEngine::Impl::execSendGrad(DeviceState& dev, const Action& a) {
  Tensor t = takeFrom(dev.grads, {a.stage, a.index}, "gradient");
  const ChanKey key{Chan::Grad, a.stage, a.index, a.peer};
  sendAt(dev, a, key, std::move(t));
}

void PipelineEngine::Impl::execRecvGrad(DeviceState& dev, const Action& a) {
  dev.grads[{a.stage, a.index}] = receive(a.peer, {Chan::Grad, a.stage, a.index, dev.id}).at(0);
}

}  // namespace pipefb::runtime
