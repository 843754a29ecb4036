#include "pipefb/dist/ProcessGroup.h"

#include <c10/util/Logging.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "C10dBackend.h"
#include "pipefb/common/Error.h"

namespace pipefb::dist {

namespace {

int envInt(const char* name, int lo, int hi, const char* hint) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) throw UserError(std::string(name) + " is not set; " + hint);
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != 0 || x < lo || x > hi)
    throw UserError(std::string(name) + "=" + v + ": allowed: an integer in [" +
                    std::to_string(lo) + ", " + std::to_string(hi) + "]; " + hint);
  return static_cast<int>(x);
}

std::string firstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

std::string seconds(double s) { return fmt::format("{:g} s", s); }

// c10d logs its connection retries and timeouts through c10's logging on stderr; during
// the rendezvous they would double our one-line error (README, "Programs"). c10 prints a
// message only at or above FLAGS_caffe2_log_level (3: fatal).
class QuietC10Log {
 public:
  QuietC10Log() : old_(FLAGS_caffe2_log_level) { FLAGS_caffe2_log_level = 3; }
  ~QuietC10Log() { FLAGS_caffe2_log_level = old_; }

 private:
  int old_;
};

// Note [Message tags]
// A message is two sends under slots 2*tag (the header: dtype, tensor count and shapes,
// kHeader int64s) and 2*tag+1 (the data of all tensors, flattened into one buffer), or one
// (Note [One message, one operation]). The runtime derives `tag` from (channel kind,
// stage, microbatch) (the microbatch index is run-wide, so it carries the iteration);
// c10d's int tag bounds it to [0, 2^30).
//
// Note [One message, one operation]
// Each send and receive is a rendezvous in gloo: the sides tell each other they are
// ready, then the data moves, each step a write under the pair's lock and a wake-up of
// its event loop (Note [gloo's event loop at the lowest priority]). With the header and
// the data as two operations, the receiver can post the data's only once the header is
// there, so every message paid two rendezvous in a row. gloo completes a receive with a
// message shorter than the posted buffer (checked: 10 floats into a buffer of 20 arrive,
// 30 abort the process), so on gloo the receiver posts a buffer of kHeader int64s and
// kInlineBytes, and a sender whose data fits puts it after the header, in one operation
// (magic kMagicInline); larger messages go in two as before. The receive buffers are
// transport buffers, as gloo's socket buffers are: reused from a pool, made outside the
// tracking allocator, so a device's tracked bytes are the message's data as before, not
// the buffer's room (the data is copied out into a tensor of its own).
constexpr int64_t kHeader = 1024;
constexpr int64_t kMagic = 0x70666231;        // "pfb1": the data follows in slot 2*tag+1
constexpr int64_t kMagicInline = 0x70666232;  // "pfb2": the data follows the header
constexpr int64_t kInlineBytes = int64_t(1) << 20;
const std::string kFailureKey = "pipefb/first_failure";

// Note [c10d backends] (C10dBackend.h): gloo or NCCL underneath.
class C10dGroup final : public ProcessGroup, public std::enable_shared_from_this<C10dGroup> {
 public:
  C10dGroup(const DistEnv& env, const GroupOptions& options, detail::BackendSpec spec)
      : env_(env),
        timeout_(static_cast<int64_t>(options.timeoutSeconds * 1000)),
        spec_(std::move(spec)) {
    QuietC10Log quiet;
    rendezvous(options);
    connect("");
    spdlog::info("distributed: rank {} of {} (local rank {}), c10d {}, store {}:{}", env.rank,
                 env.worldSize, env.localRank, spec_.name, env.masterAddr, env.masterPort);
  }

  // A subgroup over the parent's store: `env` holds the rank and size within it.
  C10dGroup(const DistEnv& env, std::chrono::milliseconds timeout,
            c10::intrusive_ptr<c10d::Store> store, const std::string& prefix,
            detail::BackendSpec spec)
      : env_(env), timeout_(timeout), spec_(std::move(spec)), store_(std::move(store)) {
    QuietC10Log quiet;
    connect(prefix);
  }

  void publishFailure(const std::string& text) override {
    try {
      QuietC10Log quiet;
      store_->compareSet(kFailureKey, {}, std::vector<uint8_t>(text.begin(), text.end()));
    } catch (const std::exception&) {
    }
  }

  std::string firstFailure() override {
    try {
      QuietC10Log quiet;
      if (!store_->check({kFailureKey})) return "";
      auto v = store_->get(kFailureKey);
      return std::string(v.begin(), v.end());
    } catch (const std::exception&) {
      return "";
    }
  }

  std::shared_ptr<ProcessGroup> subgroup(const std::string& name,
                                         const std::vector<int>& ranks) override {
    DistEnv sub = env_;
    sub.rank = -1;
    sub.worldSize = static_cast<int>(ranks.size());
    for (size_t i = 0; i < ranks.size(); ++i)
      if (ranks[i] == env_.rank) sub.rank = static_cast<int>(i);
    PIPEFB_ASSERT(sub.rank >= 0, "rank " << env_.rank << " is not in subgroup " << name);
    auto g = std::make_shared<C10dGroup>(sub, timeout_, store_, name + "/", spec_);
    g->processes_ = processes_;
    for (int r : ranks) g->worldRanks_.push_back(worldRanks_.at(r));
    return g;
  }

  ~C10dGroup() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (reaper_.joinable()) reaper_.join();
  }

  int rank() const override { return env_.rank; }
  int size() const override { return env_.worldSize; }
  std::string backend() const override { return spec_.name; }

  void send(std::vector<at::Tensor> tensors, int dst, int64_t tag) override {
    PIPEFB_ASSERT(!tensors.empty(), "c10d send of no tensors");
    PIPEFB_ASSERT(tag >= 0 && tag < (int64_t(1) << 30), "c10d tag " << tag << " out of range");
    raiseSendError();
    int64_t dataBytes = 0;
    for (const auto& t : tensors) dataBytes += static_cast<int64_t>(t.nbytes());
    // Note [One message, one operation]
    const bool inlined = inlines() && dataBytes <= kInlineBytes;
    auto header = torch::zeros({kHeader + (inlined ? (dataBytes + 7) / 8 : 0)}, torch::kInt64);
    auto* h = header.data_ptr<int64_t>();
    int64_t pos = 0;
    h[pos++] = inlined ? kMagicInline : kMagic;
    h[pos++] = static_cast<int64_t>(tensors[0].scalar_type());
    h[pos++] = static_cast<int64_t>(tensors.size());
    std::vector<at::Tensor> flat;
    auto* inlineAt = reinterpret_cast<char*>(h + kHeader);
    for (const auto& t : tensors) {
      PIPEFB_ASSERT(t.scalar_type() == tensors[0].scalar_type(), "c10d message mixes dtypes");
      PIPEFB_ASSERT(pos + 1 + t.dim() < kHeader, "c10d message header overflows");
      h[pos++] = t.dim();
      for (int64_t d : t.sizes()) h[pos++] = d;
      if (inlined) {
        const at::Tensor c = t.detach().contiguous();
        std::memcpy(inlineAt, c.data_ptr(), c.nbytes());
        inlineAt += c.nbytes();
      } else {
        flat.push_back(t.detach().reshape({-1}));
      }
    }
    header = header.to(spec_.device);
    std::vector<at::Tensor> bufs{header};  // slots 2*tag, then 2*tag+1 unless inlined
    if (!inlined) bufs.push_back(torch::cat(flat));
    std::vector<PendingSend> posted;
    for (size_t i = 0; i < bufs.size(); ++i) {
      std::vector<at::Tensor> v{bufs[i]};
      posted.push_back({p2p_->send(v, dst, static_cast<int>(2 * tag + i)), bufs[i], dst, tag});
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& p : posted) sends_.push_back(std::move(p));
    }
    cv_.notify_all();
  }

  std::vector<at::Tensor> recv(int src, int64_t tag) override {
    raiseSendError();
    // Note [One message, one operation]: room for the data after the header.
    const bool inlinable = inlines();
    Staging staging(*this, inlinable);
    at::Tensor header =
        inlinable ? staging.tensor
                  : torch::empty({kHeader}, torch::dtype(torch::kInt64).device(spec_.device));
    receive(header, src, 2 * tag);
    staging.received = true;
    header = header.cpu();
    const auto* h = header.data_ptr<int64_t>();
    PIPEFB_ASSERT(h[0] == kMagic || (inlinable && h[0] == kMagicInline),
                  "c10d message from rank " << src << " tag " << tag << " has no pipefb header");
    const auto dtype = static_cast<c10::ScalarType>(h[1]);
    const int64_t n = h[2];
    std::vector<std::vector<int64_t>> shapes;
    int64_t pos = 3, total = 0;
    for (int64_t i = 0; i < n; ++i) {
      std::vector<int64_t> shape(h + pos + 1, h + pos + 1 + h[pos]);
      pos += 1 + h[pos];
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      total += numel;
      shapes.push_back(std::move(shape));
    }
    auto data = torch::empty({total}, torch::TensorOptions().dtype(dtype).device(spec_.device));
    if (h[0] == kMagicInline)
      std::memcpy(data.data_ptr(), h + kHeader, data.nbytes());
    else
      receive(data, src, 2 * tag + 1);
    std::vector<at::Tensor> out;
    int64_t off = 0;
    for (const auto& shape : shapes) {
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      out.push_back(data.narrow(0, off, numel).view(shape));
      off += numel;
    }
    return out;
  }

  void allreduce(std::vector<at::Tensor>& tensors) override {
    try {
      coll_->allreduce(tensors)->wait();
    } catch (const std::exception& e) {
      throw collectiveError("c10d all-reduce failed (a rank died or timed out after " +
                                seconds(timeout_.count() / 1000.0) + ")",
                            firstLine(e.what()));
    }
  }

  std::shared_ptr<PendingCollective> allreduceAsync(std::vector<at::Tensor> tensors) override {
    // Gloo runs the group's collectives in the order they are started, on its own thread.
    struct Pending final : PendingCollective {
      c10::intrusive_ptr<c10d::Work> work;
      std::vector<at::Tensor> tensors;  // kept alive until done
      std::string what;
      std::shared_ptr<C10dGroup> group;  // a pending bucket may outlive its owner's handle
      void wait() override {
        try {
          work->wait();
        } catch (const std::exception& e) {
          throw group->collectiveError(what, firstLine(e.what()));
        }
      }
    };
    auto p = std::make_shared<Pending>();
    p->group = shared_from_this();
    p->tensors = std::move(tensors);
    p->what = "c10d all-reduce failed (a rank died or timed out after " +
              seconds(timeout_.count() / 1000.0) + ")";
    try {
      p->work = coll_->allreduce(p->tensors);
    } catch (const std::exception& e) {
      throw collectiveError(p->what, firstLine(e.what()));
    }
    return p;
  }

  void barrier() override {
    try {
      coll_->barrier()->wait();
    } catch (const std::exception& e) {
      throw collectiveError("c10d barrier failed", firstLine(e.what()));
    }
  }

  void flush() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return (sends_.empty() && !busy_) || sendError_; });
    lock.unlock();
    raiseSendError();
  }

  void abort() override {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    for (const auto& w : recvs_) w->abort();
  }

 private:
  // Note [One message, one operation]: whether a small message's data rides with its
  // header (a CPU buffer on a backend that completes shorter receives).
  bool inlines() const { return spec_.shortReceives && spec_.device.is_cpu(); }

  struct PendingSend {
    c10::intrusive_ptr<c10d::Work> work;
    at::Tensor tensor;
    int dst;
    int64_t tag;
  };

  // Note [One message, one operation]: a receive buffer of the pool (untracked: plain
  // memory under a tensor that does not own it), back to the pool when done.
  struct Staging {
    static constexpr int64_t kWords = kHeader + kInlineBytes / 8;
    Staging(C10dGroup& g, bool wanted) : group(g) {
      if (!wanted) return;
      {
        std::lock_guard<std::mutex> lock(g.mu_);
        if (!g.staging_.empty()) {
          room = std::move(g.staging_.back());
          g.staging_.pop_back();
        }
      }
      if (!room) room = std::make_unique<int64_t[]>(kWords);
      tensor = torch::from_blob(room.get(), {kWords}, torch::kInt64);
    }
    ~Staging() {
      tensor = at::Tensor();
      if (!room) return;
      // A receive that failed or was aborted may still be posted in gloo: its buffer is
      // never reused (nor freed; the run is ending).
      if (!received) {
        (void)room.release();
        return;
      }
      std::lock_guard<std::mutex> lock(group.mu_);
      group.staging_.push_back(std::move(room));
    }
    Staging(const Staging&) = delete;
    Staging& operator=(const Staging&) = delete;
    C10dGroup& group;
    std::unique_ptr<int64_t[]> room;
    at::Tensor tensor;
    bool received = false;
  };

  void receive(at::Tensor& into, int src, int64_t slot) {
    std::vector<at::Tensor> v{into};
    c10::intrusive_ptr<c10d::Work> w;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_) throw Aborted();
      w = p2p_->recv(v, src, static_cast<int>(slot));
      recvs_.insert(w);
    }
    bool done = false;
    std::string error;
    try {
      done = w->wait(timeout_);
    } catch (const std::exception& e) {
      error = firstLine(e.what());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      recvs_.erase(w);
      if (aborted_ && error.empty() && !done) throw Aborted();
    }
    if (!error.empty()) throw PeerError(peerText(src, error), src);
    if (!done) throw Aborted();
  }

  std::string peerText(int peer, const std::string& gloo) const {
    const bool timedOut =
        gloo.find("imed out") != std::string::npos || gloo.find("imeout") != std::string::npos;
    return "rank " + std::to_string(peer) +
           (timedOut
                ? " did not answer within distributed.timeout " + seconds(timeout_.count() / 1000.0)
                : " is gone (its process died or closed the connection)") +
           " [" + spec_.name + ": " + gloo + "]";
  }

  void raiseSendError() {
    std::lock_guard<std::mutex> lock(mu_);
    if (sendError_) std::rethrow_exception(sendError_);
  }

  // Waits for posted sends in order and releases their buffers.
  void reap() {
    for (;;) {
      PendingSend s;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !sends_.empty(); });
        if (sends_.empty()) return;
        if (stopping_ && (aborted_ || sendError_)) return;  // nobody will take them
        s = sends_.front();
        sends_.pop_front();
        busy_ = true;
      }
      std::exception_ptr error;
      try {
        s.work->wait(timeout_);
      } catch (const std::exception& e) {
        error = std::make_exception_ptr(PeerError(peerText(s.dst, firstLine(e.what())), s.dst));
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        busy_ = false;
        if (error && !sendError_) sendError_ = error;
        if (error) sends_.clear();
      }
      cv_.notify_all();
    }
  }

  // The process groups over store_: two, since point-to-point slots are our tags and
  // collectives use gloo's own.
  // Note [gloo's event loop at the lowest priority]
  // gloo's TCP event loop (one thread per backend) handles a socket's events under the
  // pair's lock, which it only try-locks; when a worker holds it (posting a send or a
  // receive, or writing a message into the socket) the loop returns to its level-triggered
  // epoll_wait, which wakes it again at once: it spins until the lock is free. On a machine
  // whose cores all run workers, the holder has often lost its core, and the spinning loop
  // is what keeps it off: GPT-2 tiny interleaved-1f1b under pipefb_launch on 2 cores made
  // 877,599 calls of Pair::handleEvents, of which 5,993 found the lock free, and 2.17
  // million epoll_waits in 60 steps (experiments/README.md, peer_pipelining). So the loop
  // threads gloo starts run at nice 19: a spinning loop yields to the workers, and an idle
  // core still runs it at once. Measured there: 253.8, 253.4, 226.9, 227.7 samples/s
  // without, 316.3, 331.0, 310.4, 275.6 with (alternated runs). Not for NCCL, whose threads
  // are not a spinning loop; without spare cores to compete for, the nice value changes
  // nothing.
  static std::set<long> threadIds() {
    std::set<long> out;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task"))
      out.insert(std::stol(e.path().filename().string()));
    return out;
  }

  // The threads that appeared since `before`, but for ProcessGroupGloo's collective workers
  // (named pt_gloo_runloop), at nice 19.
  static void lowerNewLoopThreads(const std::set<long>& before) {
    for (long tid : threadIds()) {
      if (before.count(tid)) continue;
      std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/comm");
      std::string comm;
      std::getline(in, comm);
      if (comm == "pt_gloo_runloop") continue;
      if (::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), 19) != 0)
        spdlog::debug("distributed: could not lower thread {}'s priority", tid);
    }
  }

  void connect(const std::string& prefix) {
    const auto before = threadIds();
    try {
      p2p_ = spec_.make(c10::make_intrusive<c10d::PrefixStore>(prefix + "p2p", store_), env_.rank,
                        env_.worldSize, timeout_);
      coll_ = spec_.make(c10::make_intrusive<c10d::PrefixStore>(prefix + "coll", store_), env_.rank,
                         env_.worldSize, timeout_);
      awaitConnected(prefix);
    } catch (const std::exception& e) {
      // Note [Gone ranks]: a rank that dies while the mesh connects resets it. That is the
      // job failing (exit 1, naming the rank), not a setting to change.
      const std::string what = "rendezvous: rank " + std::to_string(env_.rank) + " of group '" +
                               prefix + "' could not connect the c10d " + spec_.name + " mesh";
      const auto gone = goneRanks();
      if (!gone.empty()) throw collectiveError(what, firstLine(e.what()));
      throw UserError(what + " within distributed.timeout " + seconds(timeout_.count() / 1000.0) +
                      ": " + firstLine(e.what()));
    }
    if (spec_.name == "gloo") lowerNewLoopThreads(before);  // Note [gloo's event loop at ...]
    reaper_ = std::thread([this] { reap(); });
  }

  // Note [Mesh barrier]
  // gloo connects the full mesh pair by pair, and each pair waits up to the timeout for its
  // peer. A rank that starts its schedule as soon as its own pairs are up can fail (or be
  // killed) while another rank is still connecting; that rank then waits out the timeout
  // pair after pair (Dist.KilledRankZeroIsNamedByAllOthersOfFour: rank 0 killed at its 9th
  // action, one rank still connecting 60 s later, in 2 of 8 runs on a loaded machine). So
  // no rank leaves connect() before every rank of the group has connected both meshes: the
  // store counts them, and the wait stops early when a rank of this host is gone (Note
  // [Gone ranks]) or the store went with rank 0.
  void awaitConnected(const std::string& prefix) {
    const std::string key = prefix + "pipefb/connected";
    store_->add(key, 1);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      const int64_t n = store_->add(key, 0);
      if (n >= env_.worldSize) return;
      if (!goneRanks().empty()) throw std::runtime_error("a rank left while the mesh connected");
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("only " + std::to_string(n) + " of " +
                                 std::to_string(env_.worldSize) + " ranks connected");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  void rendezvous(const GroupOptions& options) {
    const std::string at = env_.masterAddr + ":" + std::to_string(env_.masterPort);
    const std::string secs = seconds(options.timeoutSeconds);
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(env_.masterPort);
    so.isServer = env_.rank == 0;
    so.waitWorkers = false;
    so.timeout = timeout_;
    try {
      store_ = c10::make_intrusive<c10d::TCPStore>(env_.masterAddr, so);
    } catch (const std::exception& e) {
      if (env_.rank == 0)
        throw UserError("MASTER_PORT=" + std::to_string(env_.masterPort) +
                        ": rank 0 cannot host the c10d::TCPStore at " + at + " (" +
                        firstLine(e.what()) + "); pick a free port (pipefb_launch --port)");
      throw UserError("MASTER_ADDR/MASTER_PORT=" + at + ": rank " + std::to_string(env_.rank) +
                      " could not reach rank 0's c10d::TCPStore within distributed.timeout " +
                      secs + " (" + firstLine(e.what()) + "); is rank 0 running with this port?");
    }
    try {
      const std::string ws = std::to_string(env_.worldSize);
      if (env_.rank == 0)
        store_->set("pipefb/world_size", std::vector<uint8_t>(ws.begin(), ws.end()));
      if (store_->add("pipefb/rank/" + std::to_string(env_.rank), 1) != 1)
        throw UserError(
            "RANK=" + std::to_string(env_.rank) +
            ": two processes claim this rank; each rank in [0, WORLD_SIZE) exactly once");
      auto got = store_->get("pipefb/world_size");
      const std::string theirs(got.begin(), got.end());
      if (theirs != ws)
        throw UserError("WORLD_SIZE=" + ws + " on rank " + std::to_string(env_.rank) +
                        " but rank 0 has WORLD_SIZE=" + theirs +
                        "; every rank must be started with the same WORLD_SIZE");
      // Note [Gone ranks]: where each rank's process runs, to tell later which ones died.
      const std::string me = hostName() + " " + std::to_string(::getpid());
      store_->set("pipefb/process/" + std::to_string(env_.rank),
                  std::vector<uint8_t>(me.begin(), me.end()));
      store_->add("pipefb/arrived", 1);
      const auto deadline = std::chrono::steady_clock::now() + timeout_;
      for (;;) {
        const int64_t n = store_->add("pipefb/arrived", 0);
        if (n == env_.worldSize) break;
        if (n > env_.worldSize)
          throw UserError("WORLD_SIZE=" + ws + ": " + std::to_string(n) +
                          " processes joined the rendezvous at " + at);
        if (std::chrono::steady_clock::now() > deadline)
          throw UserError("rendezvous at " + at + ": only " + std::to_string(n) +
                          " of WORLD_SIZE=" + ws + " ranks arrived within distributed.timeout " +
                          secs + "; start every rank (pipefb_launch -n " + ws +
                          ") with the same MASTER_PORT");
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      auto procs = std::make_shared<std::vector<std::string>>();
      for (int r = 0; r < env_.worldSize; ++r) {
        auto v = store_->get("pipefb/process/" + std::to_string(r));
        procs->emplace_back(v.begin(), v.end());
      }
      processes_ = procs;
      for (int r = 0; r < env_.worldSize; ++r) worldRanks_.push_back(r);
    } catch (const UserError&) {
      throw;
    } catch (const std::exception& e) {
      throw UserError("rendezvous at " + at + " failed within distributed.timeout " + secs + ": " +
                      firstLine(e.what()));
    }
  }

  // Note [Gone ranks]
  // Every rank writes "<host> <pid>" to the store at the rendezvous and reads everyone's
  // once all arrived (the store dies with rank 0, so it is read early). After a failed
  // collective, which rank failed is not in gloo's message; a rank on this host whose
  // process is gone (no /proc/<pid>, or a zombie) is named instead. Ranks on other hosts
  // cannot be checked this way and are not named.
  static std::string hostName() {
    char buf[256] = {0};
    if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
    return buf;
  }
  static bool processGone(int pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    if (!in) return true;
    std::string line;
    std::getline(in, line);
    const auto close = line.rfind(')');
    return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
  }

 public:
  std::vector<int> goneRanks() override {
    std::vector<int> out;
    if (!processes_) return out;
    const std::string host = hostName();
    for (int w : worldRanks_) {
      const std::string& p = (*processes_)[w];
      const auto sp = p.rfind(' ');
      if (sp == std::string::npos || p.substr(0, sp) != host) continue;
      const int pid = std::atoi(p.c_str() + sp + 1);
      if (pid > 0 && pid != ::getpid() && processGone(pid)) out.push_back(w);
    }
    return out;
  }

 private:
  // A collective failed: PeerError naming the gone ranks of this host, if any.
  PeerError collectiveError(const std::string& what, const std::string& gloo) {
    const auto gone = goneRanks();
    if (gone.empty()) return PeerError(what + ": " + gloo, -1);
    std::string names;
    for (int r : gone) names += (names.empty() ? "rank " : ", rank ") + std::to_string(r);
    return PeerError(what + ": " + names + (gone.size() > 1 ? " are" : " is") +
                         " gone (the process exited) [" + spec_.name + ": " + gloo + "]",
                     gone.front());
  }

  DistEnv env_;
  std::shared_ptr<const std::vector<std::string>> processes_;  // per world rank
  std::vector<int> worldRanks_;                                // this group's ranks as world ranks
  std::chrono::milliseconds timeout_;
  detail::BackendSpec spec_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<detail::C10dBackend> p2p_, coll_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<PendingSend> sends_;
  std::vector<std::unique_ptr<int64_t[]>> staging_;  // guarded by mu_
  bool busy_ = false;
  bool stopping_ = false;
  bool aborted_ = false;
  std::exception_ptr sendError_;
  std::set<c10::intrusive_ptr<c10d::Work>> recvs_;
  std::thread reaper_;
};

}  // namespace

std::optional<DistEnv> envFromTorchrun() {
  const char* ws = std::getenv("WORLD_SIZE");
  if (ws == nullptr || *ws == 0) return std::nullopt;
  const char* hint = "torchrun's variables (pipefb_launch sets them)";
  DistEnv env;
  env.worldSize = envInt("WORLD_SIZE", 1, 1 << 16, hint);
  env.rank = envInt("RANK", 0, env.worldSize - 1, "RANK must be below WORLD_SIZE");
  const char* lr = std::getenv("LOCAL_RANK");
  env.localRank = lr && *lr ? envInt("LOCAL_RANK", 0, 1 << 16, hint) : env.rank;
  const char* addr = std::getenv("MASTER_ADDR");
  if (addr == nullptr || *addr == 0)
    throw UserError(std::string("MASTER_ADDR is not set; ") + hint);
  env.masterAddr = addr;
  env.masterPort = envInt("MASTER_PORT", 1, 65535, hint);
  return env;
}

namespace detail {
std::shared_ptr<ProcessGroup> makeC10dGroup(const DistEnv& env, const GroupOptions& options,
                                            BackendSpec spec) {
  return std::make_shared<C10dGroup>(env, options, std::move(spec));
}
}  // namespace detail

std::shared_ptr<ProcessGroup> makeGlooGroup(const DistEnv& env, const GroupOptions& options) {
  detail::BackendSpec gloo;
  gloo.name = "gloo";
  const bool loopback = env.masterAddr == "127.0.0.1" || env.masterAddr == "localhost";
  gloo.make = [loopback](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         std::chrono::milliseconds timeout) {
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    else if (loopback)
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    else
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    opts->threads = 1;
    return c10::intrusive_ptr<detail::C10dBackend>(
        c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts));
  };
  gloo.shortReceives = true;  // Note [One message, one operation]
  return detail::makeC10dGroup(env, options, std::move(gloo));
}

}  // namespace pipefb::dist
