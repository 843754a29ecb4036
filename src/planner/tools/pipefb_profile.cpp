// pipefb_profile --config configs/vgg16.yaml [--set k=v ...] [--out PATH] [--force] [--repeats N]
//
// Measures every layer of the configured model at the configured microbatch size
// (training.batch / pipeline.microbatches) and writes a profile file (docs/planner.md,
// "Profile files") that `pipefb_plan --profile PATH` and `pipefb_sweep --profile PATH`
// plan from. A profile file with the same key (model, shapes, device) is reused unless
// --force. See Profiler.h.
//
// Exit codes: 0 success; 2 bad input, with one line on stderr; 1 any other failure.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "pipefb/common/Error.h"
#include "pipefb/common/Program.h"
#include "pipefb/config/Config.h"
#include "pipefb/planner/ProfileFile.h"
#include "pipefb/planner/Profiler.h"

using namespace pipefb;
using namespace pipefb::planner;

namespace {

std::string kib(std::int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", bytes / 1024.0);
  return buf;
}

std::string ms(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", s * 1e3);
  return buf;
}

void printTable(const Profile& p) {
  std::printf("%-10s %9s %9s %9s %9s %11s %11s %11s %10s %10s %10s\n", "layer", "F ms", "B ms",
              "R ms", "step ms", "out KiB", "saved KiB", "work KiB", "param KiB", "grad KiB",
              "optim KiB");
  double f = 0, b = 0, r = 0, st = 0;
  std::int64_t saved = 0, param = 0, opt = 0;
  for (const auto& l : p.layers) {
    std::printf("%-10s %9s %9s %9s %9s %11s %11s %11s %10s %10s %10s\n", l.name.c_str(),
                ms(l.forward).c_str(), ms(l.backward).c_str(), ms(l.recompute).c_str(),
                ms(l.step).c_str(), kib(l.outputBytes).c_str(), kib(l.savedBytes).c_str(),
                kib(l.workingBytes).c_str(), kib(l.paramBytes).c_str(), kib(l.gradBytes).c_str(),
                kib(l.optimizerBytes).c_str());
    f += l.forward, b += l.backward, r += l.recompute, st += l.step;
    saved += l.savedBytes, param += l.paramBytes, opt += l.optimizerBytes;
  }
  std::printf("%-10s %9s %9s %9s %9s %11s %11s %11s %10s %10s %10s\n", "total", ms(f).c_str(),
              ms(b).c_str(), ms(r).c_str(), ms(st).c_str(), "", kib(saved).c_str(), "",
              kib(param).c_str(), "", kib(opt).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pipefb_profile: measure per-layer costs for the planner"};
  std::string configPath, out;
  std::vector<std::string> overrides;
  ProfilerOptions opt;
  bool force = false;
  addConfigOptions(app, configPath, overrides);
  app.add_option("--out,-o", out,
                 "profile file (default: profiles/<model>-mb<n>-<device>-<hash>.yaml)");
  app.add_flag("--force,-f", force, "measure even if the profile file has the same key");
  app.add_option("--repeats,-r", opt.repeats, "timed runs per layer; times are medians (5)");
  app.add_option("--warmup", opt.warmup, "unmeasured runs per layer first (2)");
  app.add_option("--threads", opt.threads,
                 "intra-op threads while profiling (1, as pipeline workers; 0 = LibTorch default)");
  app.add_option("--device", opt.device, "name of this device in the profile key (cpu)");
  app.add_option("--times", opt.times,
                 "measured (medians) or analytic: every byte measured, the times from the "
                 "--device spec's roofline, so plans repeat (measured)");
  return runProgram("pipefb_profile", app, argc, argv, [&] {
    opt.validate();
    config::Config cfg = config::loadConfig(configPath, overrides, config::ConfigUse::Plan);
    ProfileResult r = loadOrMeasureProfile(cfg, opt, out, force);
    std::cout << (r.fromCache ? "cached profile " : "measured profile ") << r.path << " ("
              << profileKey(r.profile) << ")"
              << (r.fromCache ? "; same key, not re-measured (--force to measure)" : "") << "\n";
    if (!r.fromCache && opt.times == "analytic")
      std::cout << "bytes measured, times analytic (" << opt.device << "); microbatch "
                << r.profile.microbatch << ", input " << kib(r.profile.inputBytes) << " KiB\n";
    else if (!r.fromCache)
      std::cout << "medians of " << opt.repeats << " runs after " << opt.warmup
                << " warm-ups; microbatch " << r.profile.microbatch << ", input "
                << kib(r.profile.inputBytes) << " KiB\n";
    printTable(r.profile);
    // Note [Bytes at every microbatch] in LayerCost.h.
    if (!r.profile.bytesAt.empty()) {
      std::cout << "bytes also measured at microbatch";
      for (const auto& m : r.profile.bytesAt) std::cout << " " << m.microbatch;
      std::cout << " (every other divisor of the batch that ran), so plans at those sizes "
                   "charge them as measured\n";
    }
    std::cout << "plan from it: pipefb_plan --config " << configPath << " --profile " << r.path
              << "\n";
    return 0;
  });
}
