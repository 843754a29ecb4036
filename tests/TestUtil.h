#pragma once
// Helpers shared by the tests that run programs (pipefb_train, pipefb_sim,
// the build's python, build/pipefb-python) the way a user does.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace pipefb::test {

/// temp_directory_path() / "pipefb_<name>_<pid>": this process's own scratch path, so that
/// test runs at the same time (two build folders, ctest -j) never share files.
inline std::filesystem::path scratchPath(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         ("pipefb_" + name + "_" + std::to_string(::getpid()));
}

/// scratchPath(name) as an empty, existing folder.
inline std::string freshDir(const std::string& name) {
  const std::filesystem::path p = scratchPath(name);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

struct CommandResult {
  int code = -1;    // exit code, or 128 + signal
  std::string out;  // stdout and stderr, interleaved
};

/// "pid: command line" of every process whose command line contains `marker` and, if
/// `program` is not empty, `program` (with `exceptProgram`, those without it instead).
inline std::vector<std::string> processesMatching(const std::string& marker,
                                                  const std::string& program = "",
                                                  bool exceptProgram = false) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = e.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "cmdline");
    std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    for (auto& c : cmd)
      if (c == 0) c = ' ';
    if (cmd.find(marker) == std::string::npos) continue;
    if (!program.empty() && (cmd.find(program) != std::string::npos) == exceptProgram) continue;
    out.push_back(pid + ": " + cmd);
  }
  return out;
}

/// Runs `command` through the shell with stderr folded into stdout.
inline CommandResult runCommand(const std::string& command) {
  CommandResult r;
  FILE* f = popen((command + " 2>&1").c_str(), "r");
  if (f == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  int status = pclose(f);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

/// Runs build/<program-and-args>.
/// PIPEFB_TEST_BINARY_DIR, when set, names another folder holding the programs (a copy of
/// this build's, to run a long test against them while the build changes).
inline CommandResult runProgram(const std::string& programAndArgs) {
  const char* other = std::getenv("PIPEFB_TEST_BINARY_DIR");
  const std::string dir = other && *other ? other : PIPEFB_BINARY_DIR;
  return runCommand(dir + "/" + programAndArgs);
}

/// Number of '\n' in `s`.
inline size_t countLines(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace pipefb::test
