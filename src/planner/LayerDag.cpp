// DAG of layers -> the solver's chain (LayerDag.h, Note [DAG partitions]).
#include "pipefb/planner/LayerDag.h"

#include <functional>
#include <queue>

#include "pipefb/common/Error.h"

namespace pipefb::planner {

std::vector<int> topologicalOrder(const LayerDag& dag, const std::string& source) {
  const int n = dag.size();
  std::vector<int> indegree(n, 0);
  for (const auto& succ : dag.successors)
    for (int v : succ) ++indegree[v];
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (int v = 0; v < n; ++v)
    if (indegree[v] == 0) ready.push(v);
  std::vector<int> order;
  order.reserve(n);
  while (!ready.empty()) {
    const int u = ready.top();
    ready.pop();
    order.push_back(u);
    for (int v : dag.successors[u])
      if (--indegree[v] == 0) ready.push(v);
  }
  if (static_cast<int>(order.size()) != n) {
    for (int v = 0; v < n; ++v)
      if (indegree[v] > 0)
        throw UserError(source + ": the graph has a cycle through node '" + dag.nodes[v].name +
                        "'; a model graph must be acyclic");
  }
  return order;
}

std::int64_t crossingBytes(const LayerDag& dag, const std::vector<bool>& inPrefix) {
  std::int64_t bytes = 0;
  for (int v : dag.inputConsumers)
    if (!inPrefix[v]) {
      bytes += dag.inputBytes;
      break;
    }
  for (int u = 0; u < dag.size(); ++u) {
    if (!inPrefix[u]) continue;
    for (int v : dag.successors[u])
      if (!inPrefix[v]) {
        bytes += dag.nodes[u].outputBytes;
        break;
      }
  }
  return bytes;
}

Profile linearize(const LayerDag& dag, const std::vector<int>& order, Profile base) {
  const int n = dag.size();
  base.inputBytes = dag.inputBytes;
  base.layers.clear();
  // Sweep the order keeping, per node, how many of its consumers are still after the cut;
  // `live` is the crossing bytes after each step (crossingBytes() for every prefix at once).
  std::vector<int> pendingConsumers(n, 0);
  for (int u = 0; u < n; ++u) pendingConsumers[u] = static_cast<int>(dag.successors[u].size());
  std::vector<std::vector<int>> predecessors(n);
  for (int u = 0; u < n; ++u)
    for (int v : dag.successors[u]) predecessors[v].push_back(u);
  std::vector<bool> isInputConsumer(n, false);
  int inputPending = 0;
  for (int v : dag.inputConsumers)
    if (!isInputConsumer[v]) {
      isInputConsumer[v] = true;
      ++inputPending;
    }
  std::int64_t live = inputPending > 0 ? dag.inputBytes : 0;
  for (int v : order) {
    if (isInputConsumer[v] && --inputPending == 0) live -= dag.inputBytes;
    for (int u : predecessors[v])
      if (--pendingConsumers[u] == 0) live -= dag.nodes[u].outputBytes;
    if (pendingConsumers[v] > 0) live += dag.nodes[v].outputBytes;
    LayerCost c = dag.nodes[v];
    c.outputBytes = live;
    base.layers.push_back(c);
  }
  // After the last node nothing is left to consume a tensor but the loss: the chain's last
  // layer hands on the model's outputs (the sinks), as a zoo chain's last layer hands on
  // its logits.
  if (!base.layers.empty()) {
    std::int64_t outputs = 0;
    for (int u = 0; u < n; ++u)
      if (dag.successors[u].empty()) outputs += dag.nodes[u].outputBytes;
    base.layers.back().outputBytes = outputs;
  }
  return base;
}

}  // namespace pipefb::planner
