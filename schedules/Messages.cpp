// Note [Waiting messages] (Messages.h).
#include "pipefb/schedules/Messages.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>

#include "pipefb/schedules/Lowering.h"

namespace pipefb::schedules {

namespace {
enum class Node : int { F, InputBackward, Sync, Recv };

struct Message {
  int producer, consumer;
  int kind;  // 0 activation, 1 gradient, 2 output
  int stage;
};
}  // namespace

WaitingMessages waitingMessages(const Schedule& schedule) {
  const int S = schedule.numStages, M = schedule.numMicrobatches;
  const int D = schedule.numDevices();
  std::vector<int> offset(D + 1, 0), deviceOf, posOf;
  for (int d = 0; d < D; ++d) {
    offset[d + 1] = offset[d] + static_cast<int>(schedule.devices[d].size());
    for (size_t p = 0; p < schedule.devices[d].size(); ++p) {
      deviceOf.push_back(d);
      posOf.push_back(static_cast<int>(p));
    }
  }
  const int N = offset[D];
  std::map<std::tuple<Node, int, int>, int> find;
  for (int d = 0; d < D; ++d)
    for (size_t p = 0; p < schedule.devices[d].size(); ++p) {
      const Action& a = schedule.devices[d][p];
      const int id = offset[d] + static_cast<int>(p);
      if (a.type == ActionType::Forward) find[{Node::F, a.stage, a.index}] = id;
      if (a.isInputBackward()) find[{Node::InputBackward, a.stage, a.index}] = id;
      if (a.type == ActionType::SyncWeights) find[{Node::Sync, a.stage, a.index}] = id;
      if (a.type == ActionType::RecvWeights) find[{Node::Recv, a.stage, a.index}] = id;
    }
  auto node = [&](Node n, int s, int m) {
    auto it = find.find({n, s, m});
    return it == find.end() ? -1 : it->second;
  };

  std::vector<std::vector<int>> next(N);
  auto edge = [&](int a, int b) {
    if (a >= 0 && b >= 0) next[a].push_back(b);
  };
  for (int d = 0; d < D; ++d)
    for (int id = offset[d]; id + 1 < offset[d + 1]; ++id) edge(id, id + 1);
  std::vector<Message> messages;
  const int total = schedule.totalMicrobatches();
  for (int m = 0; m < total; ++m) {
    for (int s = 0; s < S; ++s) {
      const int f = node(Node::F, s, m), b = node(Node::InputBackward, s, m);
      edge(f, b);  // the stash, and for the last stage its output
      if (s > 0) {
        const int from = node(Node::F, s - 1, m);
        edge(from, f);
        if (from >= 0 && f >= 0 && deviceOf[from] != deviceOf[f])
          messages.push_back({from, f, 0, s});
      }
      if (s + 1 < S) {
        const int from = node(Node::InputBackward, s + 1, m);
        edge(from, b);
        if (from >= 0 && b >= 0 && deviceOf[from] != deviceOf[b])
          messages.push_back({from, b, 1, s});
      }
      // Note [Recomputed last output]
      if (s == S - 1 && f >= 0 && b >= 0 &&
          lastOutputTravels(deviceOf[f] != deviceOf[b],
                            schedule.devices[deviceOf[b]][posOf[b]].recompute))
        messages.push_back({f, b, 2, s});
    }
    // An iteration's inputs are fed once the last stage's backwards of the one before ran.
    if (m >= M)
      for (int j = (m / M - 1) * M; j < (m / M) * M; ++j)
        edge(node(Node::InputBackward, S - 1, j), node(Node::F, 0, m));
  }
  for (const auto& [key, id] : find)
    if (std::get<0>(key) == Node::Sync)
      edge(id, node(Node::Recv, std::get<1>(key), std::get<2>(key)));

  // reach[u]: every node that has to wait for u (a DAG: the validator refuses deadlocks).
  std::vector<int> indegree(N, 0), order;
  for (int u = 0; u < N; ++u)
    for (int v : next[u]) ++indegree[v];
  for (int u = 0; u < N; ++u)
    if (indegree[u] == 0) order.push_back(u);
  for (size_t i = 0; i < order.size(); ++i)
    for (int v : next[order[i]])
      if (--indegree[v] == 0) order.push_back(v);
  const size_t words = (static_cast<size_t>(N) + 63) / 64;
  std::vector<std::vector<std::uint64_t>> reach(N, std::vector<std::uint64_t>(words, 0));
  for (size_t i = order.size(); i-- > 0;) {
    const int u = order[i];
    for (int v : next[u]) {
      reach[u][v / 64] |= std::uint64_t(1) << (v % 64);
      for (size_t w = 0; w < words; ++w) reach[u][w] |= reach[v][w];
    }
  }
  auto reaches = [&](int u, int v) { return (reach[u][v / 64] >> (v % 64)) & 1; };

  // Only messages to c's own device, consumed after c, can wait at c: per device, by consumer.
  std::vector<std::vector<const Message*>> toDevice(D);
  for (const Message& msg : messages) toDevice[deviceOf[msg.consumer]].push_back(&msg);
  WaitingMessages out;
  out.activations.assign(S, 0);
  out.gradients.assign(S, 0);
  std::vector<int> acts(S, 0), grads(S, 0);
  for (int c = 0; c < N; ++c) {
    const Action& a = schedule.devices[deviceOf[c]][posOf[c]];
    if (!a.isCompute()) continue;
    std::fill(acts.begin(), acts.end(), 0);
    std::fill(grads.begin(), grads.end(), 0);
    int outs = 0;
    for (const Message* m : toDevice[deviceOf[c]]) {
      const Message& msg = *m;
      if (posOf[msg.consumer] <= posOf[c]) continue;
      if (msg.producer == c || reaches(c, msg.producer)) continue;
      if (msg.kind == 0) ++acts[msg.stage];
      if (msg.kind == 1) ++grads[msg.stage];
      if (msg.kind == 2) ++outs;
    }
    for (int s = 0; s < S; ++s) {
      out.activations[s] = std::max(out.activations[s], acts[s]);
      out.gradients[s] = std::max(out.gradients[s], grads[s]);
    }
    out.outputs = std::max(out.outputs, outs);
  }
  return out;
}

}  // namespace pipefb::schedules
