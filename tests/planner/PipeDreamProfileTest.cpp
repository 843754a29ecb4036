// PipeDream's profiles (Note [PipeDream profiles]): the vendored graph.txt files import with
// the numbers they hold, plan like-for-like to PipeDream's own optimizer's answer, and bad
// files exit 2 naming the file and line.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "TestUtil.h"
#include "pipefb/common/Error.h"
#include "pipefb/planner/PipeDreamProfile.h"
#include "pipefb/planner/ProfileFile.h"
#include "pipefb/planner/Solver.h"

namespace fs = std::filesystem;
using namespace pipefb::planner;

namespace {

std::string dataFile(const std::string& model) {
  return std::string(PIPEFB_SOURCE_DIR) + "/tests/data/pipedream/" + model + "/graph.txt";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Profile vendored(const std::string& model, int states = 1) {
  PipeDreamImport imp;
  imp.optimizer = OptimizerMemory{states, 0};
  imp.device = "v100-16g";
  return importPipeDreamProfile(slurp(dataFile(model)), dataFile(model), imp);
}

TEST(PipeDreamProfile, Vgg16ImportsItsNumbers) {
  const std::string text = slurp(dataFile("vgg16"));
  EXPECT_TRUE(isPipeDreamGraph(text));
  Profile own = vendored("vgg16");
  EXPECT_FALSE(isPipeDreamGraph(profileToYaml(own)));
  EXPECT_EQ(own.model, "pipedream vgg16");
  EXPECT_EQ(own.source, "pipedream");
  // 41 nodes less the Input, whose 77,070,336 bytes are 128 images of 3x224x224 fp32.
  EXPECT_EQ(own.numLayers(), 40);
  EXPECT_EQ(own.microbatch, 128);
  EXPECT_EQ(own.inputBytes, 77070336);
  double total = 0;
  std::int64_t params = 0;
  for (const auto& l : own.layers) {
    total += l.forward + l.backward;
    params += l.paramBytes;
    EXPECT_EQ(l.optimizerBytes, l.paramBytes);  // SGD with momentum: one state
  }
  EXPECT_NEAR(total, 0.672535, 1e-9);  // the file's times, Input excluded, in seconds
  EXPECT_EQ(params, 553430176);        // VGG16's 138.4M fp32 parameters
  // The first node, node2 Conv2d(3, 64): 7 KB of parameters, its 1.6 GB output (the ReLU alone
  // reads it).
  EXPECT_EQ(own.layers[0].name, "node2 Conv2d");
  EXPECT_EQ(own.layers[0].paramBytes, 7168);
  EXPECT_EQ(own.layers[0].outputBytes, 1644167168);
  EXPECT_EQ(vendored("vgg16", 2).layers[0].optimizerBytes, 2 * 7168);  // Adam: two
}

// The like-for-like case of experiments/pipedream_optimizer.sh: a straight pipeline with no
// transfer cost, no memory limit, PipeDream's schedule keeping every stash, one microbatch
// of 128. PipeDream's optimizer (optimizer_graph_hierarchical.py --straight_pipeline -n 4,
// run here) answers 0.21645 s per minibatch for VGG16.
TEST(PipeDreamProfile, Vgg16LikeForLikeEqualsPipeDreamsOptimizer) {
  const Profile p = vendored("vgg16");
  CostModel m(p, Cluster::uniform(4, 1.0, -1, Link{}, Link{}));
  SolverOptions o;
  o.batch = 128;
  o.microbatches = 1;
  o.simulateTop = 0;
  o.schedules = {parseScheduleFamily("pipedream-keep")};
  const SolveResult r = solve(m, o);
  ASSERT_TRUE(r.feasible);
  EXPECT_EQ(r.best.shape.stages, 4);
  EXPECT_NEAR(r.best.iterationTime, 0.21645, 1e-9);
}

TEST(PipeDreamProfile, BranchyGraphsCutAcrossSeveralTensors) {
  for (const std::string model : {"resnet50", "inception_v3"}) {
    const Profile p = vendored(model);
    EXPECT_EQ(p.microbatch, 128) << model;
    // Some cut of the order carries more than the node before it made: a skip or a
    // parallel branch crosses it too.
    int wider = 0;
    const PipeDreamGraph g = parsePipeDreamGraph(slurp(dataFile(model)), model);
    const auto order = topologicalOrder(g.dag, model);
    for (int i = 0; i + 1 < p.numLayers(); ++i)
      wider += p.layers[i].outputBytes > g.dag.nodes[order[i]].outputBytes;
    EXPECT_GT(wider, 10) << model;
  }
  EXPECT_EQ(vendored("inception_v3").numLayers(), 325);  // 326 nodes less the Input
}

TEST(PipeDreamProfile, BatchIsGivenOrInferred) {
  const std::string text = slurp(dataFile("vgg16"));
  PipeDreamImport imp;
  imp.batch = 64;
  EXPECT_EQ(importPipeDreamProfile(text, "vgg16.txt", imp).microbatch, 64);
  // An Input of 1000 bytes is no whole number of images: the batch must be given.
  const std::string odd =
      "node1 -- Input -- forward_compute_time=0.000, backward_compute_time=0.000, "
      "activation_size=1000.0, parameter_size=0.000\n"
      "node2 -- Linear -- forward_compute_time=1.0, backward_compute_time=2.0, "
      "activation_size=10.0, parameter_size=40.0\n"
      "\tnode1 -- node2\n";
  try {
    importPipeDreamProfile(odd, "odd.txt", PipeDreamImport{});
    FAIL() << "an odd Input was accepted";
  } catch (const pipefb::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("odd.txt: cannot infer the profiling batch"),
              std::string::npos);
    EXPECT_NE(std::string(e.what()).find("--profile-batch"), std::string::npos);
  }
  imp.batch = 10;
  const Profile p = importPipeDreamProfile(odd, "odd.txt", imp);
  EXPECT_EQ(p.numLayers(), 1);
  EXPECT_EQ(p.inputBytes, 1000);
}

// pipefb_plan on a malformed graph.txt: exit 2, one line naming the file and the line.
TEST(PipeDreamCli, MalformedGraphExits2NamingFileAndLine) {
  const std::string good = slurp(dataFile("vgg16"));
  const std::string cfg = std::string(PIPEFB_SOURCE_DIR) + "/configs/pipedream-sgd.yaml";
  const fs::path dir = fs::temp_directory_path() / ("pipedream-bad-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  struct Case {
    std::string text, expect;
  };
  // Line 3 of the file is a node line; the edges start after the 41 node lines.
  auto lineReplaced = [&](int lineNo, const std::string& with) {
    std::istringstream in(good);
    std::string out, line;
    for (int i = 1; std::getline(in, line); ++i) out += (i == lineNo ? with : line) + "\n";
    return out;
  };
  const std::vector<Case> cases = {
      {lineReplaced(3,
                    "node13 -- ReLU(inplace) -- forward_compute_time=fast, "
                    "backward_compute_time=1.380, activation_size=411041792.000, "
                    "parameter_size=0.000"),
       ":3: forward_compute_time must be a number >= 0, got 'fast'"},
      {lineReplaced(44, "\tnode2 -- node99"), ":44: edge to or from 'node99'"},
      {lineReplaced(5, "node15 -- ReLU(inplace) -- forward_compute_time=1.640"),
       ":5: the metadata has 4"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const fs::path f = dir / ("bad" + std::to_string(i) + ".txt");
    std::ofstream(f) << cases[i].text;
    const auto r = pipefb::test::runProgram("pipefb_plan --config " + cfg +
                                            " --cluster 4x-v100-pcie --profile " + f.string() +
                                            " -o " + (dir / "plan.yaml").string());
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_EQ(pipefb::test::countLines(r.out), 1u) << r.out;
    EXPECT_NE(r.out.find(f.string() + cases[i].expect), std::string::npos) << r.out;
  }
  // The vendored file plans, and the plan file names the profile.
  const auto ok = pipefb::test::runProgram(
      "pipefb_plan -q --config " + cfg + " --cluster 4x-v100-pcie --budget 8GB --profile " +
      dataFile("vgg16") + " -o " + (dir / "plan.yaml").string());
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(slurp((dir / "plan.yaml").string()).find("profile: \"pipedream " + dataFile("vgg16")),
            std::string::npos)
      << slurp((dir / "plan.yaml").string());
  // pipefb_sweep reads it the same way: at 4e9 bytes, where PipeDream's optimizer finds no
  // plan, pipedream with microbatches still fits at PipeDream's unconstrained time.
  const auto sweep = pipefb::test::runProgram(
      "pipefb_sweep --config " + cfg + " --cluster 4x-v100-pcie --budgets 4GB:8GB:2 --profile " +
      dataFile("vgg16") + " -o " + (dir / "sweep").string());
  ASSERT_EQ(sweep.code, 0) << sweep.out;
  const std::string csv = slurp((dir / "sweep" / "sweep.csv").string());
  EXPECT_NE(csv.find("\npipedream,4000000000,"), std::string::npos) << csv;
  const size_t row = csv.find("\npipedream,4000000000,");
  const std::string line = csv.substr(row + 1, csv.find('\n', row + 1) - row - 1);
  EXPECT_NE(line.find(",1,pipedream,4,"), std::string::npos) << line;  // feasible, 4 stages
  EXPECT_NE(line.find(",0.21645,"), std::string::npos) << line;
  fs::remove_all(dir);
}

}  // namespace
