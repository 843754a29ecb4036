// Planner speed (issue 6, "Speed"): plan 1000 layers x 64 devices (< 2 s), and a
// 16-budget sweep of VGG16 without --measure (< 10 s). Prints the times and exits 1 when
// a target is missed.
//   build/bench_planner [--layers 1000] [--devices 64] [--optimizer-offload per-stage]
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <random>

#include "pipefb/common/Size.h"
#include "pipefb/planner/AnalyticProfile.h"
#include "pipefb/planner/DeviceSpec.h"
#include "pipefb/planner/Sweep.h"

using namespace pipefb;
using namespace pipefb::planner;

int main(int argc, char** argv) {
  CLI::App app{"bench_planner: solver and sweep speed"};
  int layers = 1000, devices = 64;
  std::string optimizer = "none";
  app.add_option("--layers", layers, "layers of the synthetic model (1000)");
  app.add_option("--devices", devices, "identical devices (64)");
  app.add_option("--optimizer-offload", optimizer,
                 "none | host | per-stage: the optimizer placements planned (none)");
  CLI11_PARSE(app, argc, argv);
  OptimizerOffload offload;
  try {
    offload = parseOptimizerOffload(optimizer, "--optimizer-offload");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_planner: %s\n", e.what());
    return 2;
  }
  bool ok = true;

  // 1000 layers with varied costs (a transformer-like body with heavier ends), 64 devices
  // of 16 GiB over 10 GB/s links, every schedule and policy, batch 512.
  {
    std::mt19937 rng(1);
    std::uniform_real_distribution<double> u(0.5, 1.5);
    Profile p;
    p.model = "synthetic";
    p.microbatch = 1;
    p.inputBytes = 1 << 20;
    for (int l = 0; l < layers; ++l) {
      LayerCost c;
      c.name = "l" + std::to_string(l);
      c.forward = 1e-3 * u(rng);
      c.backward = 2 * c.forward;
      c.recompute = c.forward;
      c.step = 1e-4;
      c.outputBytes = std::int64_t(4 << 20);
      c.savedBytes = std::int64_t(16 << 20) * u(rng);
      c.workingBytes = 8 << 20;
      c.paramBytes = c.gradBytes = std::int64_t(32 << 20) * u(rng);
      c.optimizerBytes = 2 * c.paramBytes;
      p.layers.push_back(c);
    }
    Cluster c = Cluster::uniform(devices, 1.0, std::int64_t(16) << 30, Link{10e9, 10e-6},
                                 Link{12e9, 10e-6});
    CostModel m(p, c);
    SolverOptions o;
    o.batch = 512;
    o.simulateTop = 4;
    o.optimizerOffload = offload;  // Note [Optimizer placement search]
    auto t0 = std::chrono::steady_clock::now();
    SolveResult r = solve(m, o);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "plan %d layers x %d devices: %.3f s (target < 2 s), %ld of %ld shapes solved, "
        "best %s S=%d M=%d iteration %.3f s%s\n",
        layers, devices, s, r.shapesSolved, r.shapesTotal, r.feasible ? r.best.family.c_str() : "-",
        r.best.shape.stages, r.best.shape.microbatches, r.best.iterationTime,
        r.feasible ? "" : " (infeasible)");
    // A tight budget makes memory bind, so the DP cannot stop early on compute alone.
    o.budget = std::int64_t(3) << 30;
    t0 = std::chrono::steady_clock::now();
    SolveResult r2 = solve(m, o);
    double s2 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "plan %d layers x %d devices, budget 3 GiB: %.3f s (target < 2 s), %ld of %ld "
        "shapes solved, %s\n",
        layers, devices, s2, r2.shapesSolved, r2.shapesTotal,
        r2.feasible ? (r2.best.family + " S=" + std::to_string(r2.best.shape.stages) +
                       " M=" + std::to_string(r2.best.shape.microbatches))
                          .c_str()
                    : "infeasible");
    ok = ok && s < 2 && s2 < 2;
  }
  // VGG16 (width 1/4, 224 px) on 4 virtual devices, 16 budgets x 7 families, analytic.
  {
    model::ModelOptions mo;
    mo.name = "vgg16";
    mo.width = 0.25;
    mo.input_size = 224;
    mo.channels = 3;
    mo.num_classes = 1000;
    DeviceSpec cpu;
    cpu.name = "cpu";
    cpu.peakFlops = 1e11;
    cpu.memory = std::int64_t(1) << 40;
    cpu.hbmBandwidth = 20e9;
    cpu.pcieBandwidth = 8e9;
    cpu.efficiency = 0.3;
    auto t0 = std::chrono::steady_clock::now();
    Profile p = analyticProfile(modelWork(mo), 1, cpu, optimizerMemory("adam", 0, 0));
    CostModel m(p, uniformClusterSpec(cpu, 4, Link{8e9, 2e-6}).toCluster({}));
    SolverOptions o;
    o.batch = 64;
    o.simulateTop = 0;
    o.optimizerOffload = offload;
    SweepResult r = runSweep(m, o, parseBudgets("64MiB:4GiB:16"), defaultSweepFamilies());
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "sweep vgg16 (width 0.25, 224 px), 16 budgets x %zu families: %.3f s (target < "
        "10 s)\n",
        r.families.size(), s);
    ok = ok && s < 10;
  }
  return ok ? 0 : 1;
}
