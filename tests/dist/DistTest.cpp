// One process per device on c10d (issue 8): gradients across processes against the
// single-process reference, a dead or silent rank, and bad rendezvous. Every rank is a
// dist_worker process (dist_worker.cpp) on loopback, started by pipefb_launch or, where
// a test needs each rank's own exit, by a shell.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "DistCase.h"
#include "TestUtil.h"
#include "pipefb/dist/ProcessGroup.h"
#include "pipefb/schedules/DataParallel.h"
#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/Placement.h"
#include "pipefb/schedules/StashPolicy.h"
#include "pipefb/schedules/Validator.h"
#include "pipefb/train/Optimizer.h"

using namespace pipefb;
namespace fs = std::filesystem;

namespace {

int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

fs::path workDir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("pipefb_dist_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Processes whose command line mentions `marker` (our work folder): none may outlive a test.
std::vector<std::string> survivors(const std::string& marker) {
  return test::processesMatching(marker, "dist_worker");
}

struct DistCase {
  std::string model, schedule, stash;
  int S, M, ranks;
  int replicas = 1;      // pipeline.replicas: ranks = devices x replicas
  double bucketMb = 25;  // distributed.bucket_mb (Note [Gradient buckets])
  bool overlap = true;   // distributed.overlap
};

// What a case's ranks wrote: every parameter's gradient, and the launcher's output.
struct DistRun {
  std::map<std::string, torch::Tensor> grads;
  std::string out;
};

// The single-process reference: gradient accumulation over the same microbatches.
std::map<std::string, torch::Tensor> referenceGrads(const config::Config& c, double* loss) {
  auto model = test::buildSeeded(c.model);
  auto b = test::makeBatch(*model, c.training.batch, c.model.num_classes, 100);
  auto xs = b.input.chunk(c.pipeline.microbatches, 0);
  auto ts = b.target.chunk(c.pipeline.microbatches, 0);
  *loss = 0;
  for (size_t m = 0; m < xs.size(); ++m) {
    auto l = model->loss(model->forward(xs[m]), ts[m]) *
             (static_cast<double>(xs[m].size(0)) / static_cast<double>(b.input.size(0)));
    l.backward();
    *loss += l.item<double>();
  }
  std::map<std::string, torch::Tensor> g;
  for (auto& [name, p] : model->namedParameters()) g[name] = p.grad().clone();
  return g;
}

DistRun checkAcrossProcesses(const DistCase& c) {
  DistRun run;
  SCOPED_TRACE(c.model + " " + c.schedule + " " + c.stash + " S=" + std::to_string(c.S) + " on " +
               std::to_string(c.ranks) + " processes");
  auto cfg = test::distConfig(c.model, c.schedule, c.S, c.M, c.stash, 8);
  EXPECT_EQ(cfg.devices.count * c.replicas, c.ranks);
  if (cfg.devices.count * c.replicas != c.ranks) return run;
  const fs::path dir = workDir(c.schedule + std::to_string(c.ranks));
  auto r = test::runCommand(
      std::string("timeout 120 ") + PIPEFB_LAUNCH + " -n " + std::to_string(c.ranks) + " -- " +
      DIST_WORKER + " --model " + c.model + " --schedule " + c.schedule + " --stages " +
      std::to_string(c.S) + " --microbatches " + std::to_string(c.M) + " --stash " + c.stash +
      " --replicas " + std::to_string(c.replicas) + " --timeout 20 --bucket-mb " +
      std::to_string(c.bucketMb) + " --overlap " + (c.overlap ? "true" : "false") + " --out " +
      dir.string());
  run.out = r.out;
  EXPECT_EQ(r.code, 0) << r.out;
  if (r.code != 0) return run;
  for (int k = 0; k < c.ranks; ++k)
    EXPECT_NE(r.out.find("[rank " + std::to_string(k) + "] rank " + std::to_string(k) + " done"),
              std::string::npos)
        << r.out;
  double wantLoss = 0;
  auto want = referenceGrads(cfg, &wantLoss);
  std::map<std::string, torch::Tensor> got;
  std::map<std::string, int> copies;  // each replica's ranks hold the averaged gradients
  for (int k = 0; k < c.ranks; ++k) {
    torch::serialize::InputArchive a;
    a.load_from((dir / ("rank" + std::to_string(k) + ".pt")).string());
    torch::Tensor losses;
    a.read("__losses__", losses);
    EXPECT_NEAR(losses[0].item<double>(), wantLoss, 1e-5 * std::max(1.0, std::abs(wantLoss)))
        << "rank " << k << "'s loss (all-reduced from the last stage's rank)";
    for (const auto& key : a.keys()) {
      if (key.rfind("__", 0) == 0) continue;  // __losses__, __weight_sums__
      torch::Tensor t;
      a.read(key, t);
      if (++copies[key] > 1) {  // another replica's: the same all-reduced gradient
        EXPECT_TRUE(torch::equal(got[key], t)) << key << " differs between replicas";
        continue;
      }
      got[key] = t;
    }
  }
  EXPECT_EQ(got.size(), want.size()) << "every parameter's gradient comes from a rank";
  for (const auto& [name, n] : copies) EXPECT_EQ(n, c.replicas) << name;
  for (const auto& [name, w] : want) {
    EXPECT_TRUE(got.count(name)) << name;
    if (!got.count(name)) continue;
    const double scale = w.abs().max().item<double>();
    const double err = (got[name] - w).abs().max().item<double>() / std::max(scale, 1e-30);
    EXPECT_LE(err, 1e-5) << "gradient of " << name;
  }
  fs::remove_all(dir);
  run.grads = std::move(got);
  return run;
}

// "rank R buckets N started-during-backward K" lines of dist_worker: per rank (N, K).
std::map<int, std::pair<int, int>> bucketLines(const std::string& out) {
  std::map<int, std::pair<int, int>> m;
  std::regex re(R"(rank (\d+) buckets (\d+) started-during-backward (\d+))");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it)
    m[std::stoi((*it)[1])] = {std::stoi((*it)[2]), std::stoi((*it)[3])};
  return m;
}

}  // namespace

TEST(Dist, GradientsAcrossTwoProcessesMatchTheReference) {
  checkAcrossProcesses({"mlp", "1f1b", "checkpoint-offload", 2, 4, 2});
  checkAcrossProcesses({"mlp", "pipefb-sync", "checkpoint-offload", 1, 4, 2});
  checkAcrossProcesses({"vgg16", "1f1b", "checkpoint-offload", 2, 2, 2});
  checkAcrossProcesses({"vgg16", "pipefb-sync", "checkpoint-offload", 1, 2, 2});
}

TEST(Dist, GradientsAcrossFourProcessesMatchTheReference) {
  checkAcrossProcesses({"mlp", "1f1b", "checkpoint-offload", 4, 4, 4});
  checkAcrossProcesses({"mlp", "pipefb-sync", "checkpoint-offload", 2, 4, 4});
}

// Hybrid data + pipeline parallelism: 2 stages x 2 replicas on 4 processes; each replica
// runs half the batch and AR averages the stage gradients before STEP.
TEST(Dist, TwoStagesTimesTwoReplicasMatchTheReference) {
  checkAcrossProcesses({"mlp", "1f1b", "checkpoint-offload", 2, 2, 4, 2});
  checkAcrossProcesses({"mlp", "pipefb-sync", "checkpoint-offload", 1, 2, 4, 2});
}

// Note [Gradient buckets]: with small buckets, the replicas' all-reduces start while the
// B that completes the stage's gradients still runs its autograd call (the old path
// all-reduced one bucket at AR, after that B: overlap false reproduces it and starts
// none early); and the gradients are bitwise those of one bucket started at AR.
TEST(Dist, HybridGradientBucketsStartDuringBackward) {
  for (const char* schedule : {"1f1b", "pipefb-sync"}) {
    const int S = std::string(schedule) == "1f1b" ? 2 : 1;
    DistCase c{"vgg16", schedule, "checkpoint-offload", S, 2, 4, 2};
    c.bucketMb = 0.01;  // ~10 KiB: several buckets per stage of VGG16 at width 1/16
    DistRun early = checkAcrossProcesses(c);
    auto lines = bucketLines(early.out);
    ASSERT_EQ(lines.size(), 4u) << early.out;
    int multi = 0;
    for (const auto& [rank, nk] : lines) {
      if (nk.first == 0) continue;  // a rank with no backward (pipefb-sync's forward device)
      EXPECT_GE(nk.second, 1) << "rank " << rank << ": no bucket started during backward\n"
                              << early.out;
      if (nk.first >= 2 && nk.second >= 2) ++multi;
    }
    EXPECT_GE(multi, 2) << early.out;  // some stage overlapped more than its last bucket
    c.overlap = false;
    c.bucketMb = 1e4;  // one bucket, started at AR: the synchronous path
    DistRun atAr = checkAcrossProcesses(c);
    for (const auto& [rank, nk] : bucketLines(atAr.out))
      EXPECT_EQ(nk.second, 0) << "rank " << rank << "\n" << atAr.out;
    ASSERT_EQ(atAr.grads.size(), early.grads.size());
    for (const auto& [name, g] : early.grads)
      EXPECT_TRUE(torch::equal(g, atAr.grads[name])) << name << ": buckets changed the gradient";
  }
}

TEST(Dist, KeepStashAcrossProcessesIsRejected) {
  // 1f1b's F and B of a stage share a device: keep works across processes.
  checkAcrossProcesses({"mlp", "1f1b", "keep", 2, 4, 2});
  auto r = test::runCommand(std::string("timeout 60 ") + PIPEFB_LAUNCH + " -n 2 -- " + DIST_WORKER +
                            " --schedule pipefb-sync --stages 1 --stash keep");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("pipeline.stash: keep cannot cross processes: stage 0 runs F on rank 0 and "
                       "B on rank 1"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("allowed: checkpoint, checkpoint-offload"), std::string::npos) << r.out;
}

TEST(Dist, DeviceCountMustMatchWorldSize) {
  auto r = test::runCommand(std::string("timeout 60 ") + PIPEFB_LAUNCH + " -n 3 -- " + DIST_WORKER +
                            " --schedule 1f1b --stages 2 --devices 2 --timeout 10");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("devices.count: the schedule runs on 2 devices but WORLD_SIZE=3"),
            std::string::npos)
      << r.out;
}

// Each rank started by the shell, so that each exits on its own (no launcher kills it).
std::string shellRanks(int port, const std::vector<std::string>& ranks) {
  std::string s = "export MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + "; ";
  for (size_t i = 0; i < ranks.size(); ++i)
    s += "( " + ranks[i] + " > r" + std::to_string(i) + ".log 2>&1; echo \"exit " +
         std::to_string(i) + " $?\" ) & ";
  return s + "wait; cat r*.log";
}

TEST(Dist, BadRendezvousIsAOneLineError) {
  const fs::path dir = workDir("rendezvous");
  const std::string w = std::string(DIST_WORKER) + " --timeout 2 --out " + dir.string();
  // Ranks that disagree on WORLD_SIZE.
  auto r = test::runCommand(
      "cd " + dir.string() + " && timeout 60 sh -c '" +
      shellRanks(freePort(), {"RANK=0 WORLD_SIZE=2 " + w, "RANK=1 WORLD_SIZE=3 " + w}) + "'");
  EXPECT_NE(r.out.find("exit 1 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dist_worker: error: WORLD_SIZE=3 on rank 1 but rank 0 has WORLD_SIZE=2"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("exit 0 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("only 1 of WORLD_SIZE=2 ranks arrived within distributed.timeout"),
            std::string::npos)
      << r.out;
  // A rank pointed at a port where no rank 0 listens.
  const auto t0 = std::chrono::steady_clock::now();
  r = test::runCommand("cd " + dir.string() +
                       " && RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 "
                       "MASTER_PORT=" +
                       std::to_string(freePort()) + " timeout 60 " + w);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(test::countLines(r.out), 1u) << r.out;
  EXPECT_NE(r.out.find("could not reach rank 0's c10d::TCPStore within distributed.timeout"),
            std::string::npos)
      << r.out;
  EXPECT_LT(secs, 20) << r.out;
  // A bad variable.
  r = test::runCommand("RANK=2 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1234 " + w);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("RANK=2: allowed: an integer in [0, 1]"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

// Issue 8, "Failure": SIGKILL one rank mid-iteration; the others exit non-zero on their
// own within distributed.timeout, naming the dead rank and the action they waited on.
TEST(Dist, KilledRankIsNamedByTheOthers) {
  const fs::path dir = workDir("kill");
  const double timeout = 10;
  const std::string w = std::string(DIST_WORKER) +
                        " --schedule 1f1b --stages 2 --microbatches 4 "
                        "--iterations 3 --timeout 10 --fault-rank 1 --kill-at 7 --out " +
                        dir.string();
  const auto t0 = std::chrono::steady_clock::now();
  auto r = test::runCommand(
      "cd " + dir.string() + " && timeout 60 sh -c '" +
      shellRanks(freePort(), {"RANK=0 WORLD_SIZE=2 " + w, "RANK=1 WORLD_SIZE=2 " + w}) + "'");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.out.find("exit 1 137"), std::string::npos) << r.out;  // SIGKILL
  EXPECT_NE(r.out.find("exit 0 1"), std::string::npos) << r.out;
  EXPECT_LT(secs, timeout) << r.out;
  // e.g. "pipeline 1f1b failed on device 0 (cpu:0) at action RG1.0 (step 5): rank 1 is gone"
  EXPECT_TRUE(
      std::regex_search(r.out, std::regex("failed on device 0 \\(cpu:0\\) at action "
                                          "R[AG][0-9.]+<1 \\(step [0-9]+\\): rank 1 is gone")))
      << r.out;
  EXPECT_TRUE(survivors(dir.string()).empty());
  fs::remove_all(dir);
}

// A rank that stops answering (SIGSTOP): the others give up after distributed.timeout,
// and pipefb_launch kills the stopped one and exits with the first failure's code.
TEST(Dist, SilentRankTimesOutAndTheLauncherLeavesNoProcess) {
  const fs::path dir = workDir("stop");
  const std::string w = std::string(DIST_WORKER) +
                        " --schedule 1f1b --stages 2 --microbatches 4 "
                        "--iterations 3 --timeout 3 --fault-rank 1 --stop-at 7 --out " +
                        dir.string();
  const auto t0 = std::chrono::steady_clock::now();
  auto r = test::runCommand(std::string("timeout 60 ") + PIPEFB_LAUNCH + " -n 2 --grace 1 -- " + w);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("[rank 0] dist_worker: failed: pipeline 1f1b failed on device 0 (cpu:0) at "
                       "action"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("rank 1 did not answer within distributed.timeout 3"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("pipefb_launch: rank 0 exited with code 1"), std::string::npos) << r.out;
  EXPECT_LT(secs, 20) << r.out;
  EXPECT_TRUE(survivors(dir.string()).empty());
  fs::remove_all(dir);
}

namespace {

// pipefb_train on threads (DIR/threads) and under pipefb_launch -n 2 (each rank writes
// DIR/procs/rank<r>); `args` ends in --set output.dir=.
void trainOnThreadsAndUnderTheLauncher(const fs::path& dir, const std::string& args) {
  auto one = test::runCommand(std::string(PIPEFB_BINARY_DIR) + "/pipefb_train" + args +
                              (dir / "threads").string());
  ASSERT_EQ(one.code, 0) << one.out;
  auto two =
      test::runCommand(std::string("timeout 120 ") + PIPEFB_LAUNCH + " -n 2 -- " +
                       PIPEFB_BINARY_DIR + "/pipefb_train" + args + (dir / "procs").string());
  ASSERT_EQ(two.code, 0) << two.out;
}

std::vector<double> lossColumn(const fs::path& csv) {  // metrics.csv's loss column, per step
  std::ifstream in(csv);
  std::string header, line;
  std::getline(in, header);
  std::vector<std::string> names;
  std::stringstream hs(header);
  for (std::string c; std::getline(hs, c, ',');) names.push_back(c);
  const size_t at = std::find(names.begin(), names.end(), "loss") - names.begin();
  std::vector<double> out;
  while (std::getline(in, line)) {
    std::stringstream ls(line);
    std::string c;
    for (size_t i = 0; i <= at && std::getline(ls, c, ','); ++i) {
    }
    out.push_back(std::stod(c));
  }
  return out;
}

// Both ranks' losses are the threaded run's, step by step, over `steps` steps.
void expectRanksLossesMatchTheThreads(const fs::path& dir, size_t steps) {
  const auto want = lossColumn(dir / "threads" / "metrics.csv");
  ASSERT_EQ(want.size(), steps);
  for (int k = 0; k < 2; ++k) {
    const auto got = lossColumn(dir / "procs" / ("rank" + std::to_string(k)) / "metrics.csv");
    ASSERT_EQ(got.size(), want.size()) << "rank " << k;
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-5 * std::max(1.0, std::abs(want[i])))
          << "rank " << k << " step " << i + 1;
  }
}

}  // namespace

// pipefb_train under pipefb_launch: each rank writes OUT/rank<r>, and the run's losses are
// those of the same pipeline on threads (synchronous schedules are exact).
TEST(Dist, PipefbTrainUnderTheLauncherMatchesTheThreadedRun) {
  const fs::path dir = workDir("train");
  const std::string args = std::string(" --config ") + PIPEFB_SOURCE_DIR +
                           "/configs/mlp-tiny.yaml --set pipeline.schedule=pipefb-sync "
                           "--set pipeline.stages=1 --set devices.count=2 --set "
                           "pipeline.microbatches=4 --set training.iterations=6 --set "
                           "pipeline.stash=checkpoint-offload --set training.eval=false "
                           "--set output.progress=false --set output.dir=";
  trainOnThreadsAndUnderTheLauncher(dir, args);
  if (HasFatalFailure()) return;
  expectRanksLossesMatchTheThreads(dir, 6);
  fs::remove_all(dir);
}

// Note [Loss scaling]: fp16 under the launcher. From a scale at which mlp-tiny's gradients
// overflow, doubling after every good step, both ranks (each steps its stage of 1f1b) skip
// the steps the threaded run skips, together: the same losses step by step, and the same
// scale and skipped count in every rank's summary.
TEST(Dist, Fp16RanksSkipTheStepsTheThreadedRunSkips) {
  const fs::path dir = workDir("fp16");
  const std::string args = std::string(" --config ") + PIPEFB_SOURCE_DIR +
                           "/configs/mlp-tiny.yaml --set pipeline.schedule=1f1b "
                           "--set devices.count=2 --set pipeline.microbatches=2 "
                           "--set training.iterations=8 --set training.precision=fp16 "
                           "--set training.loss_scale=2097152 --set training.loss_scale_window=1 "
                           "--set training.eval=false --set output.progress=false "
                           "--set output.dir=";
  trainOnThreadsAndUnderTheLauncher(dir, args);
  if (HasFatalFailure()) return;
  auto summary = [](const fs::path& run) {
    std::ifstream in(run / "summary.json");
    return nlohmann::json::parse(in).at("loss_scale");
  };
  const auto want = summary(dir / "threads");
  EXPECT_GE(want.at("skipped_steps").get<int>(), 3);
  for (int k = 0; k < 2; ++k)
    EXPECT_EQ(summary(dir / "procs" / ("rank" + std::to_string(k))), want) << "rank " << k;
  expectRanksLossesMatchTheThreads(dir, 8);
  fs::remove_all(dir);
}

// Note [All-reduces before the steps]: fp16 with replicas. 1f1b, 2 stages x 2 replicas on 4
// ranks; rank 2 (replica 1's first stage) turns one gradient inf after its all-reduce, at
// iteration 1. Every rank skips that step, replica 0's included, and steps the ones around
// it; every rank's scale halves once.
TEST(Dist, Fp16OverflowInOneReplicaSkipsTheStepInEveryReplica) {
  const fs::path dir = workDir("fp16-replicas");
  auto r =
      test::runCommand(std::string("timeout 120 ") + PIPEFB_LAUNCH + " -n 4 -- " + DIST_WORKER +
                       " --model mlp --schedule 1f1b --stages 2 --microbatches 2 "
                       "--replicas 2 --iterations 3 --fp16 --poison-step 1 "
                       "--fault-rank 2 --timeout 20 --out " +
                       dir.string());
  ASSERT_EQ(r.code, 0) << r.out;
  for (int k = 0; k < 4; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    torch::serialize::InputArchive a;
    a.load_from((dir / ("rank" + std::to_string(k) + ".pt")).string());
    torch::Tensor sums;
    a.read("__weight_sums__", sums);
    ASSERT_EQ(sums.numel(), 4);
    const auto s = [&](int i) { return sums[i].item<double>(); };
    EXPECT_NE(s(0), s(1));  // iteration 0 steps
    EXPECT_EQ(s(1), s(2));  // iteration 1 (the inf on rank 2) skips
    EXPECT_NE(s(2), s(3));  // iteration 2 steps
    EXPECT_NE(r.out.find("rank " + std::to_string(k) + " scale 32768 skipped 1"), std::string::npos)
        << r.out;
  }
  fs::remove_all(dir);
}

namespace {

// 1f1b over 4 ranks (4 stages x 4 microbatches, 3 iterations, distributed.timeout
// kKillTimeoutS) whose rank `victim` is SIGKILLed at its 9th action. Each rank k logs to
// dir/rk.log. The tests check that the survivors stop before that timeout could have fired,
// so the gone rank was detected, not timed out; the timeout is far above a loaded machine's
// start-up of four LibTorch processes (a 10 s timeout failed at 10.2 s with two builds running).
constexpr int kKillTimeoutS = 30;
struct KillRun {
  fs::path dir;
  test::CommandResult r;
  double seconds = 0;
};
KillRun killOneOfFour(const std::string& name, int victim) {
  KillRun k;
  k.dir = workDir(name);
  const std::string w = std::string(DIST_WORKER) +
                        " --schedule 1f1b --stages 4 --microbatches 4 "
                        "--iterations 3 --timeout " +
                        std::to_string(kKillTimeoutS) + " --fault-rank " + std::to_string(victim) +
                        " --kill-at 9 --out " + k.dir.string();
  std::vector<std::string> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back("RANK=" + std::to_string(r) + " WORLD_SIZE=4 " + w);
  const auto t0 = std::chrono::steady_clock::now();
  k.r = test::runCommand("cd " + k.dir.string() + " && timeout 60 sh -c '" +
                         shellRanks(freePort(), ranks) + "'");
  k.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return k;
}

std::string rankLog(const fs::path& dir, int rank) {
  std::ifstream in(dir / ("r" + std::to_string(rank) + ".log"));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

// The same with 4 ranks: rank 3 only sees rank 2 go (rank 2 failed because rank 1 died),
// and names rank 1 through the job's first failure in the rendezvous store, or, when it
// fails before any rank has published one (a loaded machine), as a process gone on this
// host (Note [Gone ranks]).
TEST(Dist, KilledRankIsNamedByAllOthersOfFour) {
  const KillRun k = killOneOfFour("kill4", 1);
  const auto& r = k.r;
  EXPECT_LT(k.seconds, kKillTimeoutS) << r.out;
  EXPECT_NE(r.out.find("exit 1 137"), std::string::npos) << r.out;
  for (int rank : {0, 2, 3}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_NE(r.out.find("exit " + std::to_string(rank) + " 1"), std::string::npos) << r.out;
    const std::string log = rankLog(k.dir, rank);
    EXPECT_TRUE(std::regex_search(log, std::regex("failed on device " + std::to_string(rank) +
                                                  " \\(cpu:" + std::to_string(rank) +
                                                  "\\) at action [A-Z]+[0-9.<>]+ \\(step")))
        << log;
    EXPECT_TRUE(log.find("rank 1 is gone") != std::string::npos ||
                std::regex_search(log, std::regex("gone on this host: (rank [0-9], )*rank 1")))
        << log;
  }
  EXPECT_TRUE(survivors(k.dir.string()).empty());
  fs::remove_all(k.dir);
}

// Note [Gone ranks]: rank 0 hosts the rendezvous store, so when it dies nobody can read the
// job's first failure; every other rank still names rank 0 (its neighbour as the peer it
// waited on, the others from the processes gone on this host).
TEST(Dist, KilledRankZeroIsNamedByAllOthersOfFour) {
  const KillRun k = killOneOfFour("kill0", 0);
  const auto& r = k.r;
  EXPECT_LT(k.seconds, kKillTimeoutS) << r.out;
  EXPECT_NE(r.out.find("exit 0 137"), std::string::npos) << r.out;
  for (int rank : {1, 2, 3}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_NE(r.out.find("exit " + std::to_string(rank) + " 1"), std::string::npos) << r.out;
    const std::string log = rankLog(k.dir, rank);
    EXPECT_TRUE(log.find("rank 0 is gone") != std::string::npos ||
                std::regex_search(log, std::regex("gone on this host: (rank [0-9], )*rank 0")))
        << log;
  }
  EXPECT_TRUE(survivors(k.dir.string()).empty());
  fs::remove_all(k.dir);
}

// The hybrid lowering pass alone: AR(s,n) right before every STEP(s,n), nothing else
// moved, and the result still validates.
TEST(Dist, AddAllReducePutsOneArBeforeEachStep) {
  for (const std::string kind : {"1f1b", "pipefb-sync", "pipedream"}) {
    SCOPED_TRACE(kind);
    const int S = 2, M = 3, K = 2;
    auto raw =
        schedules::makeSchedule(kind, S, M, schedules::Placement::defaultFor(kind, S), K, -1);
    auto plan =
        schedules::lower(raw, schedules::policiesPerStage({schedules::StashPolicy::Checkpoint}, S),
                         schedules::lookaheadPerStage({1}, S));
    const auto before = plan.schedule;
    plan.schedule = schedules::addAllReduce(plan.schedule);
    EXPECT_NO_THROW(schedules::validate(plan.schedule, &plan.contract));
    int steps = 0;
    for (size_t d = 0; d < before.devices.size(); ++d) {
      std::vector<schedules::Action> withoutAr;
      const auto& list = plan.schedule.devices[d];
      for (size_t i = 0; i < list.size(); ++i) {
        if (list[i].type == schedules::ActionType::AllReduce) {
          ASSERT_LT(i + 1, list.size());
          EXPECT_EQ(list[i + 1].type, schedules::ActionType::Step);
          EXPECT_EQ(list[i + 1].stage, list[i].stage);
          EXPECT_EQ(list[i + 1].index, list[i].index);
          continue;
        }
        if (list[i].type == schedules::ActionType::Step) {
          ++steps;
          ASSERT_GT(i, 0u);
          EXPECT_EQ(list[i - 1].type, schedules::ActionType::AllReduce);
        }
        withoutAr.push_back(list[i]);
      }
      EXPECT_EQ(withoutAr, before.devices[d]);
    }
    EXPECT_GT(steps, 0);
  }
}

// Note [gloo's event loop at the lowest priority] (ProcessGroup.cpp): the threads gloo
// starts for its event loops run at nice 19; the caller and the threads that were
// already there keep theirs.
TEST(Dist, GlooLoopThreadsRunAtTheLowestPriority) {
  namespace fs = std::filesystem;
  auto niceOf = [] {
    std::map<long, int> out;
    for (const auto& e : fs::directory_iterator("/proc/self/task")) {
      const long tid = std::stol(e.path().filename().string());
      errno = 0;
      const int n = ::getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
      if (errno == 0) out[tid] = n;
    }
    return out;
  };
  const auto before = niceOf();
  dist::DistEnv env;
  env.masterPort = freePort();
  auto group = dist::makeGlooGroup(env, {30});
  const auto after = niceOf();
  int lowered = 0;
  for (const auto& [tid, n] : after) {
    auto it = before.find(tid);
    if (it != before.end())
      EXPECT_EQ(n, it->second) << "thread " << tid << " was there before the group";
    else if (n == 19)
      ++lowered;
  }
  EXPECT_GE(lowered, 1) << "no thread of the new group runs at nice 19";
  EXPECT_EQ(::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid())), before.at(::gettid()));
}

// Note [One message, one operation] (ProcessGroup.cpp): two ranks in one process. Small
// messages (the data after the header, in one gloo operation) and one of 3 MiB (header,
// then data) arrive whole, in their shapes and dtypes, whatever the order the receiver
// takes them in.
TEST(Dist, MessagesArriveWholeInlineOrNot) {
  const int port = freePort();
  // Made once, before the sender starts (the global generator is not for two threads).
  const auto want = [] {
    torch::manual_seed(11);
    std::vector<std::vector<torch::Tensor>> m;
    m.push_back({torch::randn({4, 5}), torch::randn({3})});    // inline
    m.push_back({torch::randn({768, 1024})});                  // 3 MiB: two operations
    m.push_back({torch::randn({2, 7}).to(torch::kBFloat16)});  // inline, 2-byte dtype
    m.push_back({torch::randint(0, 9, {5}, torch::kLong)});    // inline
    m.push_back({torch::randn({1, 262144 - 1024})});           // the inline limit
    return m;
  }();
  std::thread sender([&] {
    dist::DistEnv env;
    env.rank = 0;
    env.worldSize = 2;
    env.masterPort = port;
    auto g = dist::makeGlooGroup(env, {30});
    for (size_t i = 0; i < want.size(); ++i) g->send(want[i], 1, static_cast<int64_t>(100 + i));
    g->flush();
    g->barrier();
  });
  dist::DistEnv env;
  env.rank = 1;
  env.worldSize = 2;
  env.masterPort = port;
  auto g = dist::makeGlooGroup(env, {30});
  for (const size_t i : {1, 0, 4, 3, 2}) {  // not in the order sent
    const auto got = g->recv(0, static_cast<int64_t>(100 + i));
    ASSERT_EQ(got.size(), want[i].size()) << "message " << i;
    for (size_t j = 0; j < got.size(); ++j) {
      EXPECT_EQ(got[j].sizes(), want[i][j].sizes()) << "message " << i;
      EXPECT_EQ(got[j].scalar_type(), want[i][j].scalar_type()) << "message " << i;
      EXPECT_TRUE(torch::equal(got[j], want[i][j])) << "message " << i;
    }
  }
  g->barrier();
  sender.join();
}
