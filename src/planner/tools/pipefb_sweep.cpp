// pipefb_sweep --config configs/vgg16.yaml --budgets 256MiB:4GiB:12 [--schedules ...] [--out DIR]
//
// Runs the planner over a range of per-device budgets for each schedule family and
// writes DIR/sweep.csv, DIR/sweep.gp and (with gnuplot) DIR/sweep.png: throughput
// against budget, one line per family, the smallest feasible budget of each marked.
// Prints each family's smallest feasible budget and its ratio to 1f1b-keep's.
// `--measure N` also trains each feasible point's plan for N iterations with
// pipefb_train --plan (a subprocess, next to this program; one run per distinct plan) and
// adds the measured iteration time, throughput and peak per device to sweep.csv, next to
// the predicted ones. Runs land in DIR/measure/<family>-<budget>/ (plan.yaml, train.log,
// run/); a plan the runtime refuses (exit 2, e.g. mixed stash policies) is recorded with
// its error line.
#include <sys/wait.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

#include "pipefb/common/Error.h"
#include "pipefb/common/Program.h"
#include "pipefb/common/Size.h"
#include "pipefb/config/Config.h"
#include "pipefb/planner/Explain.h"
#include "pipefb/planner/PlanFile.h"
#include "pipefb/planner/Setup.h"
#include "pipefb/planner/SetupFlags.h"
#include "pipefb/planner/Sweep.h"

using namespace pipefb;
using namespace pipefb::planner;

namespace {

namespace fs = std::filesystem;

std::string shellQuote(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

// What identifies a run: the same plan trains the same way at every budget.
std::string planKey(const Plan& p) {
  std::string k = std::string(toString(p.shape.kind)) + " M" + std::to_string(p.shape.microbatches);
  for (const auto& s : p.stages)
    k += " " + std::to_string(s.first) + "-" + std::to_string(s.last) + ":" +
         schedules::toString(s.policy);
  return k;
}

std::string lastErrorLine(const std::string& log) {
  std::ifstream in(log);
  std::string line, found;
  while (std::getline(in, line))
    if (line.find("error") != std::string::npos) found = line;
  return found;
}

MeasuredRun measurePlan(const std::string& train, const std::string& configPath,
                        const std::vector<std::string>& overrides, const CostModel& model,
                        const Plan& plan, const PlanContext& ctx, const std::string& dir,
                        int iterations) {
  fs::create_directories(dir);
  const std::string planPath = dir + "/plan.yaml", log = dir + "/train.log";
  writePlanFile(planPath, model, plan, ctx);
  std::string cmd = shellQuote(train) + " --config " + shellQuote(configPath);
  std::vector<std::string> sets = overrides;
  for (const char* s : {"training.eval=false", "training.checkpoint=false", "training.log_every=1",
                        "output.progress=false"})
    sets.push_back(s);
  sets.push_back("training.iterations=" + std::to_string(iterations));
  sets.push_back("output.dir=" + dir + "/run");
  for (const auto& s : sets) cmd += " --set " + shellQuote(s);
  cmd += " --plan " + shellQuote(planPath) + " >" + shellQuote(log) + " 2>&1";
  const int status = std::system(cmd.c_str());
  MeasuredRun m;
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  if (code == 0) {
    m = readMeasuredRun(dir + "/run");
    if (m.iterationTime <= 0 && m.throughput > 0)
      m.iterationTime = double(plan.shape.microbatches * plan.shape.microbatchSize) / m.throughput;
  } else {
    m.ran = true;
    m.note = lastErrorLine(log);
  }
  m.exitCode = code;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pipefb_sweep: the planner across memory budgets and schedule families"};
  std::string configPath, budgetsText, out = "sweep";
  std::vector<std::string> overrides, families;
  SetupOptions setup;
  int measure = 0;
  SearchFlags search;
  addConfigOptions(app, configPath, overrides);
  app.add_option("--budgets", budgetsText,
                 "LOW:HIGH:COUNT (geometric) or a list, e.g. 256MiB:4GiB:12")
      ->required();
  std::string defaults;  // the help names them as defaultSweepFamilies() has them
  for (const auto& f : defaultSweepFamilies()) defaults += (defaults.empty() ? "" : ",") + f;
  app.add_option("--schedules", families, "schedule families (default: " + defaults + ")")
      ->delimiter(',');
  addSetupOptions(app, setup);
  addSearchOptions(app, search);
  app.add_option("--measure", measure,
                 "also train each point's plan N iterations (>= 3) with pipefb_train --plan");
  app.add_option("--out,-o", out, "output folder (sweep)");
  return runProgram("pipefb_sweep", app, argc, argv, [&] {
    if (measure < 0 || measure == 1 || measure == 2)
      throw UserError("--measure: " + std::to_string(measure) +
                      " iterations; need at least 3 (the first is warm-up, the iteration time "
                      "is the median step interval after it), or 0 for no training");
    const std::string train =
        (fs::read_symlink("/proc/self/exe").parent_path() / "pipefb_train").string();
    if (measure > 0 && !fs::exists(train))
      throw UserError("--measure: no pipefb_train next to pipefb_sweep (" + train +
                      "); build it: cmake --build <build> --target pipefb_train");
    config::Config cfg = config::loadConfig(configPath, overrides, config::ConfigUse::Plan);
    Planning pl = setupPlanning(cfg, setup);
    SolverOptions o = pl.solver;
    search.applyTo(o);
    if (families.empty()) families = defaultSweepFamilies();
    parseScheduleFamilies(families);  // check names before any work
    const auto budgets = parseBudgets(budgetsText);
    const CostModel& model = *pl.model;
    SweepResult r = runSweep(model, o, budgets, families);
    const std::string title = model.profile().model + " on " + model.cluster().name + ", batch " +
                              std::to_string(o.batch) + " (" + pl.profileText + ")";
    if (measure > 0) {
      std::map<std::string, MeasuredRun> done;  // by planKey
      std::printf("%-14s %-11s %-34s %-21s %-23s %s\n", "family", "budget", "plan",
                  "iteration pred/meas", "peak MiB pred/meas", "status");
      for (SweepPoint& p : r.points) {
        if (!p.feasible) continue;
        const std::string key = planKey(p.plan);
        if (!done.count(key)) {
          PlanContext ctx{configPath, model.profile().model, pl.profileText, model.cluster().name,
                          p.budget,   o.hostBudget};
          const std::string dir =
              out + "/measure/" + p.family + "-" + std::to_string(p.budget >> 20) + "MiB";
          done[key] = measurePlan(train, configPath, overrides, model, p.plan, ctx, dir, measure);
        }
        p.measured = done[key];
        const MeasuredRun& m = p.measured;
        char a[64], b[64];
        std::snprintf(a, sizeof a, "%.3f/%.3f s", p.plan.iterationTime, m.iterationTime);
        std::snprintf(b, sizeof b, "%.1f/%.1f", p.plan.peakMemory / 1048576.0,
                      m.peakMax() / 1048576.0);
        std::printf("%-14s %-11s %-34s %-21s %-23s %s\n", p.family.c_str(),
                    formatBytes(p.budget).c_str(), key.substr(0, 34).c_str(), a, b,
                    m.exitCode == 0
                        ? "ok"
                        : ("exit " + std::to_string(m.exitCode) + ": " + m.note).c_str());
      }
    }
    auto files = writeSweep(r, out, title);
    std::printf("%zu budgets x %zu families in %.3f s (%s)\n", budgets.size(), families.size(),
                r.seconds, title.c_str());
    std::printf("%-16s %-18s %s\n", "family", "smallest budget", "vs 1f1b-keep");
    const auto base = r.minimalBudget.count("1f1b-keep") ? r.minimalBudget.at("1f1b-keep") : -1;
    for (const auto& f : families) {
      const std::int64_t m = r.minimalBudget.at(f);
      std::string ratio = "";
      if (m > 0 && base > 0) {
        char b[64];
        std::snprintf(b, sizeof b, "%.3fx (1f1b-keep / this = %.2f)", double(m) / base,
                      double(base) / m);
        ratio = b;
      }
      std::printf("%-16s %-18s %s\n", f.c_str(), m >= 0 ? formatBytes(m).c_str() : "never fits",
                  ratio.c_str());
    }
    for (const auto& f : files) std::printf("wrote %s\n", f.c_str());
    return 0;
  });
}
