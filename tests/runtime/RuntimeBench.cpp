// Benchmark of issue 4 (printed, not asserted):
//  1. VGG16 width 1/4, batch 32, Fashion-MNIST shapes (1x32x32, 10 classes): a 2-device
//     1f1b pipeline (one intra-op thread per device) against plain LibTorch with 2
//     intra-op threads, in one run.
//  2. The measured iteration time against the simulator's, from the measured per-action
//     costs of the same run.
//  3. Issue 5: peak device memory (max over devices), and per device the data-transfer
//     counters (bytes, copy time, overlap with compute, stall).
// Usage: runtime_bench [microbatches=4] [iterations=20] [schedule=1f1b] [stash=keep]
//                      [devices=2, or 4 for pipefb] [partition=planner|params|cuts e.g. 9]
//                      [rounds=3]
// The default partition is the one pipefb_train uses: the planner's, on the measured
// profile (cached in profiles/, measured on first use; Note [Planner partition in
// pipefb_train]).
#include <chrono>
#include <cstdio>
#include <map>

#include "../BenchSetup.h"
#include "pipefb/memory/TrackingAllocator.h"
#include "pipefb/planner/Setup.h"
#include "pipefb/planner/TrainPlan.h"
#include "pipefb/runtime/PipelineEngine.h"
#include "pipefb/sim/Simulator.h"
#include "pipefb/train/Optimizer.h"

using namespace pipefb;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  const int M = argc > 1 ? std::atoi(argv[1]) : 4;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 20;
  const std::string sched = argc > 3 ? argv[3] : "1f1b";
  const std::string stash = argc > 4 ? argv[4] : "keep";
  const int warm = 3;
  memory::installTrackingAllocator();
  config::Config c = test::benchConfig(sched, stash, M,
                                       argc > 5                        ? std::atoi(argv[5])
                                       : sched.rfind("pipefb", 0) == 0 ? 4
                                                                       : 2);
  c.training.lr = 0.01;
  const std::string partition = argc > 6 ? argv[6] : "planner";
  if (partition == "planner") {
    test::usePlannerPartition(c);
  } else if (partition != "params") {
    c.pipeline.partition.clear();
    for (size_t at = 0; at < partition.size();) {
      size_t comma = partition.find(',', at);
      if (comma == std::string::npos) comma = partition.size();
      c.pipeline.partition.push_back(std::stoll(partition.substr(at, comma - at)));
      at = comma + 1;
    }
  }
  torch::manual_seed(0);
  auto x = torch::randn({32, 1, 32, 32});
  auto y = torch::randint(10, {32}, torch::kLong);
  data::Batch batch{x, y};

  // Plain LibTorch (2 intra-op threads, whole batch) and the pipeline (one intra-op thread
  // per device) run in alternating blocks of `iters` iterations, `rounds` times, so that a
  // change of machine load hits both alike.
  const int rounds = argc > 7 ? std::atoi(argv[7]) : 3;
  auto plainModel = model::buildModel(c.model);
  auto opt = train::makeOptimizer(c.training, plainModel->parameters());
  auto plainStep = [&] {
    opt->zero_grad();
    plainModel->loss(plainModel->forward(x), y).backward();
    opt->step();
  };
  auto m = model::buildModel(c.model);
  runtime::EngineOptions o;
  o.iterations = warm + rounds * iters;
  o.recordMemoryEvents = false;
  runtime::PipelineEngine e(*m, c, o);
  at::set_num_threads(2);
  for (int i = 0; i < warm; ++i) plainStep();
  at::set_num_threads(1);
  for (int i = 0; i < warm; ++i) e.step(batch);
  double plainTotal = 0, pipedTotal = 0;
  for (int r = 0; r < rounds; ++r) {
    at::set_num_threads(2);
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) plainStep();
    const double p = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
    at::set_num_threads(1);
    t0 = Clock::now();
    for (int i = 0; i < iters; ++i) e.step(batch);
    const double q = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
    std::printf("round %d: plain %.2f ms, pipeline %.2f ms, speed-up %.3fx\n", r, 1e3 * p, 1e3 * q,
                p / q);
    plainTotal += p;
    pipedTotal += q;
  }
  e.finish();
  const double plain = plainTotal / rounds, piped = pipedTotal / rounds;

  // Simulator from the measured per-action costs (steady-state iterations only). The
  // runtime copies on the sender's compute thread, so SA/SG time is added to F/B and
  // links are free.
  const auto& s = e.schedule();
  const auto recs = e.records();
  const int S = s.numStages;
  std::vector<double> f(S), b(S), st(S), sa(S), sg(S);
  std::vector<int> nf(S), nb(S), nst(S), nsa(S), nsg(S);
  for (size_t d = 0; d < recs.size(); ++d)
    for (size_t j = 0; j < recs[d].size(); ++j) {
      const auto& r = recs[d][j];
      const auto& a = s.devices[d][j];
      const int mb = a.index;
      const bool steady = (a.type == schedules::ActionType::Step ? a.index : mb / M) >= warm;
      if (!steady) continue;
      const double t = r.seconds();
      switch (a.type) {
        case schedules::ActionType::Forward:
          f[a.stage] += t;
          ++nf[a.stage];
          break;
        case schedules::ActionType::Backward:
          b[a.stage] += t;
          ++nb[a.stage];
          break;
        case schedules::ActionType::Step:
          st[a.stage] += t;
          ++nst[a.stage];
          break;
        case schedules::ActionType::SendAct:
          sa[a.stage] += t;
          ++nsa[a.stage];
          break;
        case schedules::ActionType::SendGrad:
          sg[a.stage] += t;
          ++nsg[a.stage];
          break;
        default:
          break;
      }
    }
  auto mean = [](double v, int n) { return n ? v / n : 0.0; };
  sim::CostTable costs = sim::CostTable::uniform(S);
  for (int i = 0; i < S; ++i) {
    costs.stages[i].forward = mean(f[i], nf[i]) + mean(sa[i], nsa[i]);
    costs.stages[i].backward = mean(b[i], nb[i]) + mean(sg[i], nsg[i]);
    costs.stages[i].recompute = 0;  // BR's measured time already includes it
    costs.stages[i].step = mean(st[i], nst[i]);
    std::printf("stage %d: F %.2f ms, B %.2f ms, SA %.3f ms, SG %.3f ms, STEP %.2f ms\n", i,
                1e3 * mean(f[i], nf[i]), 1e3 * mean(b[i], nb[i]), 1e3 * mean(sa[i], nsa[i]),
                1e3 * mean(sg[i], nsg[i]), 1e3 * mean(st[i], nst[i]));
  }
  auto simr = sim::simulate(s, costs);
  std::printf(
      "vgg16 w=0.25 batch 32 1x32x32, %s %d stages x %d microbatches, stash %s, "
      "partition %s (%s)\n",
      sched.c_str(), S, M, stash.c_str(), runtime::toString(e.partition()).c_str(),
      partition.c_str());
  std::printf("plain LibTorch (2 intra-op threads): %.2f ms/iteration, %.1f samples/s\n",
              1e3 * plain, 32 / plain);
  std::printf("pipeline (%d devices, 1 thread each):   %.2f ms/iteration, %.1f samples/s\n",
              e.numDevices(), 1e3 * piped, 32 / piped);
  std::printf("speed-up pipeline / plain: %.3fx (goal >= 1.15x)\n", plain / piped);
  std::printf("simulated iteration time from measured costs: %.2f ms (bubble %.3f)\n",
              1e3 * simr.iterationTime, simr.bubbleFraction);
  std::printf("measured / simulated: %.3fx (goal <= 1.10x)\n", piped / simr.iterationTime);
  int64_t peak = 0;
  auto stats = e.deviceStats();
  for (size_t d = 0; d + 1 < stats.size(); ++d) {
    peak = std::max(peak, stats[d].peak);
    std::printf("%s peak %.2f MiB (stash %.2f MiB)\n", stats[d].name.c_str(),
                stats[d].peak / 1048576.0,
                stats[d].peakByCategory[index(MemoryCategory::Stash)] / 1048576.0);
  }
  double copy = 0, hidden = 0, stall = 0;
  for (const auto& t : e.transferStats()) {
    copy += t.copySeconds;
    hidden += t.hiddenSeconds;
    stall += t.stallSeconds;
    if (t.offloads + t.prefetches > 0)
      std::printf("%s: D2H %.2f MiB, H2D %.2f MiB, copy %.1f ms, hidden %.1f ms, stall %.1f ms\n",
                  t.name.c_str(), t.bytesD2H / 1048576.0, t.bytesH2D / 1048576.0,
                  1e3 * t.copySeconds, 1e3 * t.hiddenSeconds, 1e3 * t.stallSeconds);
  }
  std::printf(
      "RESULT %s-%s devices %d: peak device memory %.2f MiB, %.1f samples/s, overlap %.1f%%, "
      "stall %.1f ms/iteration, host pool peak %.2f MiB (%s)\n",
      sched.c_str(), stash.c_str(), e.numDevices(), peak / 1048576.0, 32 / piped,
      copy > 0 ? 100.0 * hidden / copy : 0.0, 1e3 * stall / (warm + iters),
      e.hostPool().peakBytes / 1048576.0, e.hostPool().kind.c_str());
  return 0;
}
