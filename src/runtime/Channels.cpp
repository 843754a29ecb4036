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
    if (receiving_.insert(k).second) cv_.notify_all();  // a rendezvous sender may go
    cv_.wait(lock);
  }
}

void Channels::awaitReceiver(const ChanKey& k) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return closed_ || receiving_.count(k) > 0; });
  if (closed_) throw Cancelled{};
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
  std::map<ChanKey, Message> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old.swap(box_);
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
  if (isLocal(peer)) return channels.take(k).tensors;
  memory::MemoryScope scope(MemoryCategory::CommBuffers);
  return options.group->recv(rankOf(peer), tagOf(k));
}

void PipelineEngine::Impl::execSendAct(DeviceState& dev, const Action& a) {
  Tensor t = takeFrom(dev.acts, {a.stage, a.index}, "activation");
  const ChanKey key{Chan::Act, a.stage, a.index, a.peer};
  // Note [Message rendezvous] (schedules/Messages.h)
  if (isLocal(a.peer) && schedules::rendezvous(passes, dev.id, a.peer)) channels.awaitReceiver(key);
  post(a.peer, key, {t});
}

void PipelineEngine::Impl::execRecvAct(DeviceState& dev, const Action& a) {
  dev.acts[{a.stage, a.index}] = receive(a.peer, {Chan::Act, a.stage, a.index, dev.id}).at(0);
}

void PipelineEngine::Impl::execSendGrad(DeviceState& dev, const Action& a) {
  Tensor t = takeFrom(dev.grads, {a.stage, a.index}, "gradient");
  const ChanKey key{Chan::Grad, a.stage, a.index, a.peer};
  // Note [Message rendezvous] (schedules/Messages.h): the gradient waits here, not there.
  if (isLocal(a.peer) && schedules::rendezvous(passes, dev.id, a.peer)) channels.awaitReceiver(key);
  post(a.peer, key, {t});
}

void PipelineEngine::Impl::execRecvGrad(DeviceState& dev, const Action& a) {
  dev.grads[{a.stage, a.index}] = receive(a.peer, {Chan::Grad, a.stage, a.index, dev.id}).at(0);
}

}  // namespace pipefb::runtime
