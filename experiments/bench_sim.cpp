// bench_sim: how long the simulator takes on a big schedule (goal: 64 stages x 512
// microbatches in well under 1 s). Prints one line per schedule kind.
//   build/bench_sim [--stages 64] [--microbatches 512] [--repeat 3]
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/Validator.h"
#include "pipefb/sim/Simulator.h"

namespace ps = pipefb::schedules;
namespace sim = pipefb::sim;

namespace {
double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_sim: simulator speed"};
  int S = 64, M = 512, repeat = 3;
  app.add_option("--stages", S)->capture_default_str();
  app.add_option("--microbatches", M)->capture_default_str();
  app.add_option("--repeat", repeat, "best of N")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  struct Case {
    const char* kind;
    ps::StashPolicy policy;
  };
  const Case cases[] = {{"1f1b", ps::StashPolicy::Keep},
                        {"gpipe", ps::StashPolicy::Keep},
                        {"1f1b", ps::StashPolicy::CheckpointOffload},
                        {"pipefb-sync", ps::StashPolicy::Offload},
                        {"pipefb-async", ps::StashPolicy::Offload}};
  std::printf("%-14s %-19s %7s %9s %10s %10s %12s\n", "schedule", "policy", "actions", "lower_s",
              "validate_s", "simulate_s", "bubble");
  double worst = 0;
  for (const Case& c : cases) {
    auto t0 = std::chrono::steady_clock::now();
    ps::SchedulePlan plan = ps::lower(ps::makeSchedule(c.kind, S, M), {c.policy}, 1);
    double lowerS = secondsSince(t0);
    t0 = std::chrono::steady_clock::now();
    ps::validate(plan.schedule, &plan.contract);
    double validateS = secondsSince(t0);
    double best = 1e30;
    sim::SimResult r;
    sim::CostTable costs = sim::CostTable::uniform(S);
    costs.defaultLink = {10e9, 5e-6};
    costs.defaultHostLink = {12e9, 10e-6};
    for (int i = 0; i < repeat; ++i) {
      t0 = std::chrono::steady_clock::now();
      r = sim::simulate(plan.schedule, costs);  // with the full memory timeline
      best = std::min(best, secondsSince(t0));
    }
    worst = std::max(worst, best);
    std::printf("%-14s %-19s %7zu %9.3f %10.3f %10.3f %12.4f\n", c.kind, ps::toString(c.policy),
                plan.schedule.numActions(), lowerS, validateS, best, r.bubbleFraction);
  }
  std::printf("simulate %d stages x %d microbatches: worst %.3f s (goal < 1 s)\n", S, M, worst);
  return 0;
}
