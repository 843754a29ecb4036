// devices.bind: none against cores (printed, not asserted; experiments/README.md,
// "Binding"). VGG16 width 1/4, batch 32, Fashion-MNIST shapes (1x32x32, 10 classes), the
// planner's partition as pipefb_train takes it; two engines of the same pipeline, one
// per policy, stepped in alternating blocks of `iters` iterations, `rounds` times, so a
// change of machine load hits both alike.
// Usage: bind_bench [schedule=1f1b] [stash=keep] [microbatches=4] [iters=10] [rounds=4]
#include <chrono>
#include <cstdio>

#include "../BenchSetup.h"
#include "pipefb/memory/TrackingAllocator.h"
#include "pipefb/planner/Setup.h"
#include "pipefb/planner/TrainPlan.h"
#include "pipefb/runtime/PipelineEngine.h"
#include "pipefb/topology/Topology.h"

using namespace pipefb;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  const std::string sched = argc > 1 ? argv[1] : "1f1b";
  const std::string stash = argc > 2 ? argv[2] : "keep";
  const int M = argc > 3 ? std::atoi(argv[3]) : 4;
  const int iters = argc > 4 ? std::atoi(argv[4]) : 10;
  const int rounds = argc > 5 ? std::atoi(argv[5]) : 4;
  const int warm = 2;
  memory::installTrackingAllocator();
  config::Config c = test::benchConfig(sched, stash, M, sched.rfind("pipefb", 0) == 0 ? 4 : 2);
  test::usePlannerPartition(c);
  std::printf("%s, %s, %d devices, M=%d, on %s\n", sched.c_str(), stash.c_str(),
              static_cast<int>(c.devices.count), M, topology::machine().summary().c_str());

  torch::manual_seed(0);
  data::Batch batch{torch::randn({32, 1, 32, 32}), torch::randint(10, {32}, torch::kLong)};
  runtime::EngineOptions o;
  o.iterations = warm + rounds * iters;
  o.recordMemoryEvents = false;
  o.log = false;
  config::Config none = c, cores = c;
  none.devices.bind = "none";
  cores.devices.bind = "cores";
  auto m1 = model::buildModel(c.model), m2 = model::buildModel(c.model);
  runtime::PipelineEngine eNone(*m1, none, o), eCores(*m2, cores, o);
  at::set_num_threads(1);
  for (int i = 0; i < warm; ++i) eNone.step(batch), eCores.step(batch);
  double sumNone = 0, sumCores = 0;
  for (int r = 0; r < rounds; ++r) {
    // Alternate which policy goes first.
    auto block = [&](runtime::PipelineEngine& e) {
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) e.step(batch);
      return std::chrono::duration<double>(Clock::now() - t0).count() / iters;
    };
    double n, k;
    if (r % 2 == 0) {
      n = block(eNone);
      k = block(eCores);
    } else {
      k = block(eCores);
      n = block(eNone);
    }
    std::printf("round %d: none %.2f ms, cores %.2f ms, cores/none %.3f\n", r, 1e3 * n, 1e3 * k,
                k / n);
    sumNone += n;
    sumCores += k;
  }
  eNone.finish();
  eCores.finish();
  std::printf("mean: none %.2f ms, cores %.2f ms per iteration, cores/none %.3f\n",
              1e3 * sumNone / rounds, 1e3 * sumCores / rounds, sumCores / sumNone);
  return 0;
}
