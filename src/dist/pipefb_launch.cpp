// pipefb_launch -n N [--port P] [--addr A] -- pipefb_train --config ...
//
// Starts N local processes of the command, one per rank, with torchrun's environment
// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; pipefb/dist/ProcessGroup.h),
// prefixes every line they print with "[rank r] " (stdout to stdout, stderr to stderr),
// and forwards SIGINT/SIGTERM to them. When one exits non-zero (or dies from a signal:
// 128 + signal), the others get SIGTERM and, --grace seconds later, SIGKILL; the launcher
// exits with that first failure's code. Each rank runs in its own process group, which
// is killed when the rank exits (nothing it started outlives it), and ranks die with the
// launcher (PR_SET_PDEATHSIG).
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "pipefb/common/Program.h"

namespace {

int sigPipe[2] = {-1, -1};

void onSignal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = write(sigPipe[1], &b, 1);
}

// A free TCP port on the loopback (the kernel picks it; a race with other programs is
// possible but unlikely, and then rank 0 fails with a clear MASTER_PORT error).
int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error(std::string("cannot find a free port: ") + std::strerror(errno));
  close(fd);
  return ntohs(a.sin_port);
}

struct Stream {
  int fd = -1;
  int rank = 0;
  FILE* out = nullptr;
  std::string partial;
};

struct Child {
  pid_t pid = -1;
  bool running = false;
  int code = 0;
};

void emit(Stream& s, const char* data, size_t n) {
  s.partial.append(data, n);
  size_t start = 0, nl;
  while ((nl = s.partial.find('\n', start)) != std::string::npos) {
    std::fprintf(s.out, "[rank %d] %.*s\n", s.rank, static_cast<int>(nl - start),
                 s.partial.data() + start);
    start = nl + 1;
  }
  s.partial.erase(0, start);
  std::fflush(s.out);
}

int run(int n, int port, const std::string& addr, double grace,
        const std::vector<std::string>& command) {
  if (port == 0) port = freePort();
  if (pipe2(sigPipe, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error("pipe failed");
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGCHLD, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  std::vector<Child> children(n);
  std::vector<Stream> streams;
  const pid_t launcher = getpid();
  for (int r = 0; r < n; ++r) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
      throw std::runtime_error("pipe failed");
    pid_t pid = fork();
    if (pid < 0) throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
    if (pid == 0) {
      setpgid(0, 0);  // its own process group: signals reach what the rank started too
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(1);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      std::signal(SIGINT, SIG_DFL);
      std::signal(SIGTERM, SIG_DFL);
      std::signal(SIGPIPE, SIG_DFL);
      dup2(out[1], 1);
      dup2(err[1], 2);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("MASTER_ADDR", addr.c_str(), 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      std::vector<char*> argv;
      for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      std::fprintf(stderr, "pipefb_launch: cannot run %s: %s\n", argv[0], std::strerror(errno));
      _exit(127);
    }
    setpgid(pid, pid);
    close(out[1]);
    close(err[1]);
    children[r] = {pid, true, 0};
    streams.push_back({out[0], r, stdout, ""});
    streams.push_back({err[0], r, stderr, ""});
  }
  std::fprintf(stderr, "pipefb_launch: %d ranks of '%s', MASTER_ADDR=%s MASTER_PORT=%d\n", n,
               command[0].c_str(), addr.c_str(), port);

  using Clock = std::chrono::steady_clock;
  int exitCode = 0;
  bool stopping = false;
  Clock::time_point killAt{};
  auto signalAll = [&](int sig) {
    for (auto& c : children)
      if (c.running) kill(-c.pid, sig);
  };
  auto stopAll = [&](int sig) {
    if (!stopping) {
      stopping = true;
      killAt = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(grace * 1000));
    }
    signalAll(sig);
  };
  int running = n;
  size_t open = streams.size();
  while (running > 0 || open > 0) {
    std::vector<pollfd> fds;
    fds.push_back({sigPipe[0], POLLIN, 0});
    for (auto& s : streams)
      if (s.fd >= 0) fds.push_back({s.fd, POLLIN, 0});
    int timeoutMs = 200;
    poll(fds.data(), fds.size(), timeoutMs);
    if (fds[0].revents & POLLIN) {
      unsigned char sig;
      while (read(sigPipe[0], &sig, 1) == 1) {
        if (sig == SIGINT || sig == SIGTERM) {
          std::fprintf(stderr, "pipefb_launch: got %s, forwarding it to the ranks\n",
                       sig == SIGINT ? "SIGINT" : "SIGTERM");
          if (exitCode == 0) exitCode = 128 + sig;
          stopAll(sig);
        }
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      for (auto& s : streams) {
        if (s.fd != fds[i].fd) continue;
        char buf[65536];
        ssize_t k = read(s.fd, buf, sizeof buf);
        if (k > 0) {
          emit(s, buf, static_cast<size_t>(k));
        } else if (k == 0 || (errno != EINTR && errno != EAGAIN)) {
          if (!s.partial.empty()) emit(s, "\n", 1);
          close(s.fd);
          s.fd = -1;
          --open;
        }
      }
    }
    // Reap.
    for (int r = 0; r < n; ++r) {
      Child& c = children[r];
      if (!c.running) continue;
      int status = 0;
      if (waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.running = false;
      --running;
      kill(-c.pid, SIGKILL);  // whatever the rank left in its process group goes with it
      c.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (c.code != 0 && exitCode == 0) {
        exitCode = c.code;
        std::fprintf(stderr,
                     "pipefb_launch: rank %d %s %d; stopping the other ranks (SIGTERM, SIGKILL "
                     "after %g s)\n",
                     r, WIFEXITED(status) ? "exited with code" : "was killed by signal",
                     WIFEXITED(status) ? c.code : WTERMSIG(status), grace);
        stopAll(SIGTERM);
      }
    }
    if (stopping && running > 0 && Clock::now() >= killAt) {
      signalAll(SIGKILL);
      killAt = Clock::now() + std::chrono::hours(1);
    }
    // Children are gone but something else holds a pipe open: stop reading soon.
    if (running == 0 && open > 0) {
      static Clock::time_point drainUntil = Clock::now() + std::chrono::seconds(2);
      if (Clock::now() > drainUntil) break;
    }
  }
  return exitCode;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pipefb_launch: start N local ranks of a command with torchrun's environment"};
  int n = 0, port = 0;
  double grace = 5.0;
  std::string addr = "127.0.0.1";
  std::vector<std::string> command;
  app.add_option("-n,--nproc", n, "number of processes (ranks)")
      ->required()
      ->check(CLI::Range(1, 1024));
  app.add_option("--port", port, "MASTER_PORT (0: a free port)")->check(CLI::Range(0, 65535));
  app.add_option("--addr", addr, "MASTER_ADDR");
  app.add_option("--grace", grace, "seconds between SIGTERM and SIGKILL when a rank failed")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("command", command, "the program and its arguments, after --")->required();
  return pipefb::runProgram("pipefb_launch", app, argc, argv,
                            [&] { return run(n, port, addr, grace, command); });
}
