// pipefb_sim: a schedule playground. Generates (or loads) a schedule, lowers it, validates it,
// simulates it on a cost table and prints the timeline and the numbers (docs/pipefb_sim.md).
#include <CLI/CLI.hpp>
#include <iostream>
#include <sstream>

#include "pipefb/common/Error.h"
#include "pipefb/common/Program.h"
#include "pipefb/common/Suggest.h"
#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/Validator.h"
#include "pipefb/sim/CostTable.h"
#include "pipefb/sim/SimReport.h"
#include "pipefb/sim/Simulator.h"
#include "pipefb/sim/Timeline.h"

namespace ps = pipefb::schedules;
namespace sim = pipefb::sim;

namespace {

std::vector<ps::StashPolicy> parsePolicies(const std::string& text) {
  std::vector<ps::StashPolicy> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(ps::parseStashPolicy(item));
  if (out.empty()) out.push_back(ps::StashPolicy::Keep);
  return out;
}

int run(int argc, char** argv) {
  CLI::App app{"pipefb_sim: generate, lower, validate and simulate a pipeline schedule"};
  std::string kind = "1f1b", costsArg = "uniform", policyArg = "keep", loadPath, placementArg;
  int stages = 4, microbatches = 8, iterations = 1, lookahead = 1, width = 100, virtualStages = 2;
  int asyncLag = -1;
  bool json = false, printSchedule = false, noActions = false, noMemory = false;
  app.add_option("--schedule", kind, pipefb::joinAllowed(ps::scheduleKindNames()))
      ->capture_default_str();
  app.add_option("--stages", stages, "number of stages S")->capture_default_str();
  app.add_option("--virtual-stages", virtualStages,
                 "interleaved-1f1b, interleaved-zb: stages per device v (devices = stages / v)")
      ->capture_default_str();
  app.add_option("--microbatches", microbatches, "microbatches per iteration M")
      ->capture_default_str();
  app.add_option("--iterations", iterations, "iterations K (use >= 3 for steady state)")
      ->capture_default_str();
  app.add_option("--costs", costsArg, "cost file (JSON) or 'uniform'")->capture_default_str();
  app.add_option("--policy", policyArg,
                 "keep | offload | checkpoint | checkpoint-offload, or one per stage, "
                 "comma-separated")
      ->capture_default_str();
  app.add_option("--lookahead", lookahead, "compute actions between PRE and its B")
      ->capture_default_str();
  app.add_option("--async-lag", asyncLag,
                 "pipefb-async: forwards of an iteration before RW of the previous one "
                 "(pipeline.async_lag; -1 = microbatches)")
      ->capture_default_str();
  app.add_option("--placement", placementArg,
                 "forward/backward device per stage, e.g. \"0/5 1/4 2/3\" (default: by kind)");
  app.add_option("--load", loadPath, "simulate a schedule text file instead (already lowered)");
  app.add_option("--width", width, "timeline columns")->capture_default_str();
  app.add_flag("--json", json, "print the JSON report instead of text");
  app.add_flag("--no-actions", noActions, "JSON: leave out the per-action spans");
  app.add_flag("--no-memory-timeline", noMemory, "JSON: leave out the memory timelines");
  app.add_flag("--print-schedule", printSchedule, "print the lowered schedule in text form");
  return pipefb::runProgram("pipefb_sim", app, argc, argv, [&] {
    ps::SchedulePlan plan;
    bool haveContract = false;
    if (!loadPath.empty()) {
      plan.schedule = ps::loadSchedule(loadPath);
    } else {
      const bool looped =
          ps::info(ps::parseScheduleKind(kind)).placement == ps::DefaultPlacement::Looped;
      ps::Placement placement = looped ? ps::Placement::looped(std::max(stages, 1), virtualStages)
                                       : ps::Placement::defaultFor(kind, std::max(stages, 1));
      if (!placementArg.empty()) {
        std::string text = "stages " + std::to_string(stages) + "\nmicrobatches 1\nplacement " +
                           placementArg + "\n";
        placement = ps::parseSchedule(text, "--placement").placement;
      }
      // Note [Simulation size limit]: actions grow as stages x microbatches x iterations
      // (about 4 to 10 per pair once lowered). 1f1b at S=100, M=10000 took 19 s and 1 GB;
      // pipedream with checkpoint-offload at the limit below takes about 9 s and 0.5 GB
      // on a busy 2-core machine. Refuse sizes past it rather than run for minutes.
      constexpr int64_t kMaxPairs = 250000;
      const int64_t pairs =
          int64_t{std::max(stages, 1)} * std::max(microbatches, 1) * std::max(iterations, 1);
      if (pairs > kMaxPairs)
        throw pipefb::UserError(
            "--stages x --microbatches x --iterations: " + std::to_string(stages) + " x " +
            std::to_string(microbatches) + " x " + std::to_string(iterations) + " = " +
            std::to_string(pairs) + " (stage, microbatch) pairs; the limit is " +
            std::to_string(kMaxPairs) + " (the schedule would not fit in memory or would take " +
            "minutes); lower one of them");
      if (lookahead < 0)
        throw pipefb::UserError("--lookahead must be >= 0, got " + std::to_string(lookahead));
      auto policies = ps::policiesPerStage(parsePolicies(policyArg), std::max(stages, 1));
      plan =
          ps::lower(ps::makeSchedule(kind, stages, microbatches, placement, iterations, asyncLag),
                    policies, lookahead);
      haveContract = true;
    }
    const ps::MemoryContract* contract = haveContract ? &plan.contract : nullptr;
    ps::validate(plan.schedule, contract);
    const ps::Schedule& s = plan.schedule;
    sim::CostTable costs = costsArg == "uniform" ? sim::CostTable::uniform(s.numStages)
                                                 : sim::CostTable::load(costsArg, s.numStages);
    sim::SimResult r = sim::simulate(s, costs);
    if (json) {
      sim::SimReportOptions opt;
      opt.policy = loadPath.empty() ? policyArg : "from-file";
      opt.lookahead = lookahead;
      opt.costs = costsArg;
      opt.includeActions = !noActions;
      opt.includeMemory = !noMemory;
      std::cout << sim::simReportJson(s, contract, r, opt);
      return 0;
    }
    if (printSchedule) std::cout << ps::toText(s) << "\n";
    std::cout << sim::renderTimeline(s, r, width) << "\n" << sim::simSummaryText(s, contract, r);
    return 0;
  });
}

}  // namespace

int main(int argc, char** argv) { return run(argc, argv); }
