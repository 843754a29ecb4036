// DAG partitions (Note [DAG partitions], LayerDag.h): the space searched is contiguous ranges
// of one topological order, with every tensor that crosses a cut charged at that cut.
// On >= 200 random small DAGs: the order is topological, every cut's bytes in the chain
// equal a direct count over the DAG's edges, and the solver's optimum on the chain equals
// exhaustive search over every contiguous partition of that order (x schedules,
// microbatches, device chains and stash policies).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "PlannerTestUtil.h"
#include "pipefb/common/Error.h"
#include "pipefb/planner/BruteForce.h"
#include "pipefb/planner/LayerDag.h"

using namespace pipefb::planner;

namespace {

LayerCost node(const std::string& name, std::int64_t out) {
  LayerCost c;
  c.name = name;
  c.forward = 1;
  c.outputBytes = out;
  return c;
}

// The model input feeds a and c; a -> b, a -> c, b -> d, c -> d.
LayerDag diamond() {
  LayerDag g;
  g.nodes = {node("a", 10), node("b", 20), node("c", 40), node("d", 80)};
  g.successors = {{1, 2}, {3}, {3}, {}};
  g.inputBytes = 5;
  g.inputConsumers = {0, 2};
  return g;
}

TEST(DagPartition, CutsOfADiamondChargeEveryCrossingTensorOnce) {
  const LayerDag g = diamond();
  const auto order = topologicalOrder(g, "diamond");
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  Profile p = linearize(g, order, Profile{});
  ASSERT_EQ(p.numLayers(), 4);
  EXPECT_EQ(p.inputBytes, 5);
  EXPECT_EQ(p.layers[0].outputBytes, 10 + 5);       // a (to b and c), the input (to c)
  EXPECT_EQ(p.layers[1].outputBytes, 10 + 20 + 5);  // a (to c), b (to d), the input (to c)
  EXPECT_EQ(p.layers[2].outputBytes, 20 + 40);      // b, c (both to d)
  EXPECT_EQ(p.layers[3].outputBytes, 80);           // the model's output, to the loss
  EXPECT_EQ(crossingBytes(g, {true, true, false, false}), 35);
}

TEST(DagPartition, NodeListNotInTopologicalOrderAndCycles) {
  LayerDag g = diamond();
  // Renumber so that the list is not topological: d, c, b, a.
  LayerDag r;
  r.nodes = {g.nodes[3], g.nodes[2], g.nodes[1], g.nodes[0]};
  r.successors = {{}, {0}, {0}, {2, 1}};
  r.inputConsumers = {3, 1};
  EXPECT_EQ(topologicalOrder(r, "r"), (std::vector<int>{3, 1, 2, 0}));  // a, c, b, d
  r.successors[0] = {3};                                                // d -> a closes a cycle
  try {
    topologicalOrder(r, "graph.txt");
    FAIL() << "a cycle was accepted";
  } catch (const pipefb::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("graph.txt: the graph has a cycle"), std::string::npos)
        << e.what();
  }
}

LayerDag randomDag(std::mt19937& rng, int n) {
  auto pick = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); };
  // Edges go forward in a hidden order `rank`; node indices are a shuffle of it.
  std::vector<int> rank(n);
  for (int i = 0; i < n; ++i) rank[i] = i;
  std::shuffle(rank.begin(), rank.end(), rng);
  LayerDag g;
  g.successors.assign(n, {});
  for (int i = 0; i < n; ++i) {
    g.nodes.push_back(pipefb::planner::testing::randomLayer(rng));
    g.nodes.back().name = "n" + std::to_string(i);
  }
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (rank[a] < rank[b] && pick(0, 2) == 0) g.successors[a].push_back(b);
  g.inputBytes = pick(1, 300);
  for (int v = 0; v < n; ++v)
    if (rank[v] == 0 || pick(0, 3) == 0) g.inputConsumers.push_back(v);
  return g;
}

bool sameValue(double a, double b) {
  return std::fabs(a - b) <= 1e-9 * std::max(1.0, std::fabs(b));
}

TEST(DagPartition, SolverEqualsBruteForceOverContiguousRangesOf250RandomDags) {
  std::mt19937 rng(20261124);
  int feasible = 0, branchy = 0;
  const std::vector<std::string> families = {"gpipe",       "1f1b",      "pipedream",
                                             "pipefb-sync", "1f1b-keep", "1f1b-checkpoint"};
  for (int id = 0; id < 250; ++id) {
    const int n = std::uniform_int_distribution<int>(2, 7)(rng);
    const LayerDag g = randomDag(rng, n);
    const auto order = topologicalOrder(g, "random");
    // The order is topological and complete.
    std::vector<int> pos(n, -1);
    for (int i = 0; i < static_cast<int>(order.size()); ++i) pos[order[i]] = i;
    ASSERT_EQ(static_cast<int>(order.size()), n);
    for (int u = 0; u < n; ++u)
      for (int v : g.successors[u]) ASSERT_LT(pos[u], pos[v]) << "instance " << id;
    Profile p;
    p.model = "dag" + std::to_string(id);
    p = linearize(g, order, p);
    // Every cut of the order carries exactly what crosses it in the DAG.
    bool several = false;
    for (int cut = 1; cut < n; ++cut) {
      std::vector<bool> prefix(n, false);
      for (int i = 0; i < cut; ++i) prefix[order[i]] = true;
      ASSERT_EQ(p.layers[cut - 1].outputBytes, crossingBytes(g, prefix))
          << "instance " << id << " cut " << cut;
      int tensors = 0;
      for (int u = 0; u < n; ++u)
        if (prefix[u] && std::any_of(g.successors[u].begin(), g.successors[u].end(),
                                     [&](int v) { return !prefix[v]; }))
          ++tensors;
      several = several || tensors > 1;
    }
    branchy += several;
    // The search over that chain equals exhaustive search.
    const int D = std::uniform_int_distribution<int>(1, 4)(rng);
    Cluster cl = Cluster::uniform(
        D, 1.0, std::uniform_int_distribution<int>(3000, 12000)(rng),
        Link{std::uniform_real_distribution<double>(100, 3000)(rng), 0.01}, Link{2000, 0});
    SolverOptions o;
    o.batch = std::vector<int>{1, 2, 4}[id % 3];
    o.maxMicrobatches = 4;
    o.simulateTop = 0;
    o.keepTop = 1;
    o.schedules = {parseScheduleFamily(families[id % families.size()])};
    if (id % 4 == 0) o.budget = std::uniform_int_distribution<int>(1500, 6000)(rng);
    CostModel m(p, cl);
    SolveResult dp = solve(m, o);
    BruteForceResult bf = bruteForce(m, o);
    ASSERT_EQ(dp.feasible, bf.feasible) << "instance " << id;
    if (!bf.feasible) continue;
    ++feasible;
    ASSERT_TRUE(sameValue(dp.best.iterationTime, bf.objective))
        << "instance " << id << ": dp " << dp.best.iterationTime << " vs brute force "
        << bf.objective;
  }
  // The table is not degenerate: most instances plan, and many have cuts crossing several
  // tensors.
  // (145 since the cost model charges the messages that can wait on a device, Note
  // [Waiting messages]; 150 before.)
  EXPECT_GE(feasible, 140);
  EXPECT_GE(branchy, 100);
}

}  // namespace
