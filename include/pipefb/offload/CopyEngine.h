#pragma once
// A copy engine: the resource that moves bytes between one device and the host pool,
// separate from the device's compute (DESIGN.md, "Devices and memory accounting").
// On a virtual device it is a thread with a FIFO queue; on a GPU it would be a
// dedicated CUDA stream with events, behind this same interface.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace pipefb::offload {

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  /// Runs `job` after every job submitted before it (FIFO). Jobs must not throw out:
  /// they record their own errors.
  virtual void submit(std::function<void()> job) = 0;
  /// Runs what is queued, then stops; later submits are dropped. Idempotent.
  virtual void shutdown() = 0;
  virtual std::string name() const = 0;
};

/// The virtual-device engine: one thread, one queue.
class ThreadCopyEngine final : public CopyEngine {
 public:
  explicit ThreadCopyEngine(std::string name);
  ~ThreadCopyEngine() override;
  void submit(std::function<void()> job) override;
  void shutdown() override;
  std::string name() const override { return name_; }

 private:
  void loop();
  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace pipefb::offload
