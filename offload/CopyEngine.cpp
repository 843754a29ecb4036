#include "pipefb/offload/CopyEngine.h"

#include <torch/torch.h>

#include "pipefb/memory/TrackingAllocator.h"

namespace pipefb::offload {

ThreadCopyEngine::ThreadCopyEngine(std::string name) : name_(std::move(name)) {
  thread_ = std::thread([this] { loop(); });
}

ThreadCopyEngine::~ThreadCopyEngine() { shutdown(); }

void ThreadCopyEngine::submit(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void ThreadCopyEngine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void ThreadCopyEngine::loop() {
  // One intra-op thread: a copy must not compete with the devices' compute threads
  // (Note [Intra-op threads] in MemoryScope.h).
  memory::oneIntraOpThread();
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
  }
}

}  // namespace pipefb::offload
