// pipefb_launch on plain shell commands: torchrun's environment, rank-prefixed output,
// the first failure's exit code with the other ranks stopped, signal forwarding, and
// no process left behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "TestUtil.h"

namespace fs = std::filesystem;

namespace {

// Processes whose command line contains `marker`.
int countProcesses(const std::string& marker) {
  return static_cast<int>(pipefb::test::processesMatching(marker, "pipefb_launch", true).size());
}

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST(Launch, SetsTorchrunVariablesAndPrefixesEachLine) {
  auto r = pipefb::test::runCommand(
      std::string(PIPEFB_LAUNCH) +
      " -n 3 --port 29123 -- sh -c "
      "'echo \"$RANK/$WORLD_SIZE/$LOCAL_RANK $MASTER_ADDR:$MASTER_PORT\"; echo err$RANK >&2'");
  EXPECT_EQ(r.code, 0) << r.out;
  for (int k = 0; k < 3; ++k) {
    const std::string rank = std::to_string(k);
    EXPECT_NE(r.out.find("[rank " + rank + "] " + rank + "/3/" + rank + " 127.0.0.1:29123\n"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("[rank " + rank + "] err" + rank + "\n"), std::string::npos) << r.out;
  }
}

TEST(Launch, FirstFailureStopsTheOthersAndIsTheExitCode) {
  const std::string marker = "pfbl_fail_" + std::to_string(getpid());
  const auto t0 = std::chrono::steady_clock::now();
  auto r = pipefb::test::runCommand(std::string("timeout 60 ") + PIPEFB_LAUNCH +
                                    " -n 3 --grace 2 -- sh -c 'if [ $RANK = 1 ]; then sleep 0.5; "
                                    "exit 3; fi; sh -c \"sleep 40; : " +
                                    marker + "\"; true'");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("pipefb_launch: rank 1 exited with code 3"), std::string::npos) << r.out;
  EXPECT_LT(secondsSince(t0), 20) << r.out;
  EXPECT_EQ(countProcesses(marker), 0);
}

TEST(Launch, ForwardsSigintAndLeavesNoProcess) {
  const std::string marker = "pfbl_int_" + std::to_string(getpid());
  // The forwarded SIGINT reaches each rank's process group: the inner sh goes too.
  const std::string cmd = std::string(PIPEFB_LAUNCH) +
                          " -n 2 --grace 2 -- sh -c 'echo up; sh -c \"sleep 40; : " + marker +
                          "\"; true' > /dev/null 2>&1 & echo $!";
  auto started = pipefb::test::runCommand(cmd);
  const pid_t launcher = std::stoi(started.out);
  for (int i = 0; i < 100 && countProcesses(marker) < 4; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(countProcesses(marker), 4);  // two ranks' sh and the sh each started
  const auto t0 = std::chrono::steady_clock::now();
  kill(launcher, SIGINT);
  while (kill(launcher, 0) == 0 && secondsSince(t0) < 20)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_LT(secondsSince(t0), 10);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(countProcesses(marker), 0);
}

TEST(Launch, BadFlagsExitTwo) {
  auto r = pipefb::test::runCommand(std::string(PIPEFB_LAUNCH) + " -n 0 -- true");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(pipefb::test::countLines(r.out), 1u) << r.out;
  r = pipefb::test::runCommand(std::string(PIPEFB_LAUNCH) + " -n 2");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("command"), std::string::npos) << r.out;
  r = pipefb::test::runCommand(std::string(PIPEFB_LAUNCH) + " -n 1 -- /nonexistent/prog");
  EXPECT_EQ(r.code, 127) << r.out;
  EXPECT_NE(r.out.find("[rank 0] pipefb_launch: cannot run /nonexistent/prog"), std::string::npos)
      << r.out;
}
