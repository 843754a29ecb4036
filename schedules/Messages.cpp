// Note [Waiting messages] (Messages.h).
#include "pipefb/schedules/Messages.h"

#include <algorithm>
#include <cstdint>
#include <limits>
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

// Note [Waiting messages speed]
// waitingMessages' table last[u * D + d] (below) is N actions x D devices: for
// bench_planner's 64-stage PipeDream over 3 iterations of 64 microbatches, 37 thousand
// actions x 64. It is filled by pulling, in a topological order, each action's row as the
// maximum of its predecessors' rows (the waits, from flat arrays, not a list per action),
// which writes each row once; and rows of 16-bit positions, half the memory and eight
// lanes to a vector instruction. The maximum does not depend on the order, so the table
// is the one the earlier push over successors filled; an action on a cycle of waits (no
// valid schedule has one) gets, as there, the rows of its ordered predecessors only.
template <typename Pos>
std::vector<Pos> latestWaitedFor(int N, int D, const std::vector<std::pair<int, int>>& edges,
                                 const std::vector<int>& deviceOf, const std::vector<int>& posOf) {
  // Successors (for the order) and predecessors (for the rows), as flat arrays.
  std::vector<int> succStart(N + 1, 0), predStart(N + 1, 0);
  for (const auto& [a, b] : edges) ++succStart[a + 1], ++predStart[b + 1];
  for (int u = 0; u < N; ++u) {
    succStart[u + 1] += succStart[u];
    predStart[u + 1] += predStart[u];
  }
  std::vector<int> succ(edges.size()), pred(edges.size());
  {
    std::vector<int> s(succStart.begin(), succStart.end() - 1);
    std::vector<int> p(predStart.begin(), predStart.end() - 1);
    for (const auto& [a, b] : edges) succ[s[a]++] = b, pred[p[b]++] = a;
  }
  std::vector<int> indegree(N), order;
  order.reserve(N);
  for (int u = 0; u < N; ++u) {
    indegree[u] = predStart[u + 1] - predStart[u];
    if (indegree[u] == 0) order.push_back(u);
  }
  for (size_t i = 0; i < order.size(); ++i)
    for (int j = succStart[order[i]]; j < succStart[order[i] + 1]; ++j)
      if (--indegree[succ[j]] == 0) order.push_back(succ[j]);
  std::vector<Pos> last(static_cast<size_t>(N) * D);
  std::vector<char> ordered(N, 0);
  // Row v = the maximum of its (ordered) predecessors' rows, -1 without any.
  auto pull = [&](int v) {
    Pos* lv = &last[static_cast<size_t>(v) * D];
    bool first = true;
    for (int j = predStart[v]; j < predStart[v + 1]; ++j) {
      if (!ordered[pred[j]]) continue;
      const Pos* lu = &last[static_cast<size_t>(pred[j]) * D];
      if (first)
        std::copy(lu, lu + D, lv);
      else
        for (int d = 0; d < D; ++d) lv[d] = std::max(lv[d], lu[d]);
      first = false;
    }
    if (first) std::fill(lv, lv + D, Pos(-1));
    return lv;
  };
  for (int u : order) {
    Pos* lu = pull(u);
    lu[deviceOf[u]] = std::max<Pos>(lu[deviceOf[u]], static_cast<Pos>(posOf[u]));
    ordered[u] = 1;
  }
  if (static_cast<int>(order.size()) < N)
    for (int v = 0; v < N; ++v)
      if (!ordered[v]) pull(v);
  return last;
}
// Adds h to a set of combinations none of which dominates another (Note [Messages held
// together]), keeping it so.
void addUndominated(std::vector<WaitingMessages::Held>& set, const WaitingMessages::Held& h) {
  auto covers = [](const WaitingMessages::Held& a, const WaitingMessages::Held& b) {
    return a[0] >= b[0] && a[1] >= b[1] && a[2] >= b[2];
  };
  for (const auto& x : set)
    if (covers(x, h)) return;
  set.erase(std::remove_if(set.begin(), set.end(), [&](const auto& x) { return covers(h, x); }),
            set.end());
  set.push_back(h);
}
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
  // find[(n, s, m)]: the id of node n of stage s, microbatch m (-1: none), a flat table.
  const int total = schedule.totalMicrobatches();
  int width = total;  // indices: microbatches, and iterations for SyncWeights/RecvWeights
  for (const auto& list : schedule.devices)
    for (const Action& a : list) width = std::max(width, a.index + 1);
  const int kNodes = 4;
  std::vector<int> find(static_cast<size_t>(kNodes) * S * width, -1);
  auto slot = [&](Node n, int s, int m) {
    return (static_cast<size_t>(n) * S + static_cast<size_t>(s)) * width + static_cast<size_t>(m);
  };
  for (int d = 0; d < D; ++d)
    for (size_t p = 0; p < schedule.devices[d].size(); ++p) {
      const Action& a = schedule.devices[d][p];
      const int id = offset[d] + static_cast<int>(p);
      if (a.type == ActionType::Forward) find[slot(Node::F, a.stage, a.index)] = id;
      if (a.isInputBackward()) find[slot(Node::InputBackward, a.stage, a.index)] = id;
      if (a.type == ActionType::SyncWeights) find[slot(Node::Sync, a.stage, a.index)] = id;
      if (a.type == ActionType::RecvWeights) find[slot(Node::Recv, a.stage, a.index)] = id;
    }
  auto node = [&](Node n, int s, int m) { return find[slot(n, s, m)]; };

  // The waits as a list of edges (a before b), gathered into arrays below.
  std::vector<std::pair<int, int>> edges;
  edges.reserve(3 * static_cast<size_t>(N));
  auto edge = [&](int a, int b) {
    if (a >= 0 && b >= 0) edges.push_back({a, b});
  };
  for (int d = 0; d < D; ++d)
    for (int id = offset[d]; id + 1 < offset[d + 1]; ++id) edge(id, id + 1);
  std::vector<Message> messages;
  std::vector<int> inputs;  // F(0,m) per m: its input waits from its iteration's feed
  const std::vector<int> passes = rendezvousPasses(schedule);
  for (int m = 0; m < total; ++m) {
    for (int s = 0; s < S; ++s) {
      const int f = node(Node::F, s, m), b = node(Node::InputBackward, s, m);
      edge(f, b);  // the stash, and for the last stage its output
      if (s > 0) {
        const int from = node(Node::F, s - 1, m);
        edge(from, f);
        // Note [Message rendezvous]: sent when its receiver waits for it.
        if (from >= 0 && f >= 0 && deviceOf[from] != deviceOf[f] &&
            !rendezvous(passes, deviceOf[from], deviceOf[f], MessageKind::Activation))
          messages.push_back({from, f, 0, s});
      }
      if (s + 1 < S) {
        const int from = node(Node::InputBackward, s + 1, m);
        edge(from, b);
        if (from >= 0 && b >= 0 && deviceOf[from] != deviceOf[b] &&
            !rendezvous(passes, deviceOf[from], deviceOf[b], MessageKind::Gradient))
          messages.push_back({from, b, 1, s});
      }
      // Note [Recomputed last output]; Note [Message rendezvous]: from a forward-only to a
      // backward-only device it is sent at its receive, right before B.
      if (s == S - 1 && f >= 0 && b >= 0 &&
          lastOutputTravels(deviceOf[f] != deviceOf[b],
                            schedule.devices[deviceOf[b]][posOf[b]].recompute) &&
          !rendezvous(passes, deviceOf[f], deviceOf[b], MessageKind::Output))
        messages.push_back({f, b, 2, s});
    }
    inputs.push_back(node(Node::F, 0, m));
    // An iteration's inputs are fed once the losses of the one before are known
    // (PipelineEngine::step): each last-stage backward runs its loss first, so the feed
    // waits for what that backward waits for (the action before it on its device, and
    // its F), not for its end. (Fed after its end here, mlp pipedream-checkpoint S=2 M=1
    // held the next input beside B(1,1), 256 bytes above the plan once B's recompute was
    // charged as held; PlanRunsTest seed 0 instance 38.)
    if (m >= M)
      for (int j = (m / M - 1) * M; j < (m / M) * M; ++j) {
        const int b = node(Node::InputBackward, S - 1, j), f0 = node(Node::F, 0, m);
        if (b < 0) continue;
        if (posOf[b] > 0) edge(b - 1, f0);
        edge(node(Node::F, S - 1, j), f0);
      }
  }
  for (int s = 0; s < S; ++s)
    for (int m = 0; m < width; ++m) edge(node(Node::Sync, s, m), node(Node::Recv, s, m));

  // Every earlier action of a device comes before a later one (device order), so the
  // actions of device d that c has to wait for form a prefix of d's list: last[u * D + d]
  // is the position on d of the latest action u waits for (u itself on its own device),
  // -1 for none. c on d reaches a producer p iff pos(c) <= last[p * D + d]. This is
  // O(edges x D), not the O(N^2 / 64) of a reachability bitset over all actions.
  int longest = 0;
  for (const auto& list : schedule.devices)
    longest = std::max(longest, static_cast<int>(list.size()));
  std::vector<std::int16_t> last16;
  std::vector<int> last32;
  // Note [Waiting messages speed]: positions as 16-bit numbers when every list is short
  // enough (always, for the planner's shapes), else as int.
  const bool narrow = longest < std::numeric_limits<std::int16_t>::max();
  if (narrow)
    last16 = latestWaitedFor<std::int16_t>(N, D, edges, deviceOf, posOf);
  else
    last32 = latestWaitedFor<int>(N, D, edges, deviceOf, posOf);
  auto lastOf = [&](int u, int d) -> int {
    const size_t i = static_cast<size_t>(u) * D + d;
    return narrow ? last16[i] : last32[i];
  };

  // A message (p -> q, on q's device d) waits at the compute starts c of d with
  // last(p, d) < pos(c) < pos(q): +1 over that interval, per (kind, stage) on device d.
  WaitingMessages out;
  out.activations.assign(S, 0);
  out.gradients.assign(S, 0);
  out.activationsAtBackward.assign(S, 0);
  out.gradientsAtBackward.assign(S, 0);
  std::map<std::tuple<int, int, int>, std::vector<int>> diff;  // (device, kind, stage)
  for (const Message& msg : messages) {
    const int d = deviceOf[msg.consumer];
    const int from = lastOf(msg.producer, d) + 1, to = posOf[msg.consumer];
    if (from >= to) continue;
    std::vector<int>& v = diff[{d, msg.kind, msg.stage}];
    if (v.empty()) v.assign(schedule.devices[d].size() + 1, 0);
    ++v[from];
    --v[to];
  }
  // Note [Outputs at the loss]: at a last-stage B (or I), the outputs of its own iteration.
  std::map<std::pair<int, int>, int> atLoss;  // (device, position) -> outputs waiting
  for (const Message& msg : messages) {
    if (msg.kind != 2) continue;
    const int d = deviceOf[msg.consumer];
    const int from = lastOf(msg.producer, d) + 1, to = posOf[msg.consumer];
    const int iteration = schedule.devices[d][to].index / M;
    for (int p = from; p < to; ++p) {
      const Action& c = schedule.devices[d][p];
      if (c.isInputBackward() && c.stage == S - 1 && c.index / M == iteration) {
        const int n = ++atLoss[{d, p}];
        out.outputsAtLoss = std::max(out.outputsAtLoss, n);
      }
    }
  }
  // An input waits on F(0,m)'s device from its iteration's feed (the start, or once the
  // last stage's backwards of the iteration before ran) to F(0,m).
  std::vector<int> fed(schedule.devices.empty() ? 0 : schedule.devices[0].size() + 1, 0);
  int inputDevice = -1;
  for (int m = 0; m < total; ++m) {
    const int f = inputs[m];
    if (f < 0) continue;
    const int d = deviceOf[f];
    if (inputDevice != d) {
      inputDevice = d;
      fed.assign(schedule.devices[d].size() + 1, 0);
    }
    int from = 0;
    if (m >= M)
      for (int j = (m / M - 1) * M; j < (m / M) * M; ++j) {
        const int b = node(Node::InputBackward, S - 1, j);
        if (b >= 0) from = std::max(from, lastOf(b, d) + 1);
      }
    if (from >= posOf[f]) continue;
    ++fed[from];
    --fed[posOf[f]];
  }
  if (inputDevice >= 0)
    for (int p = 0, run = 0; p + 1 < static_cast<int>(fed.size()); ++p) {
      run += fed[p];
      if (schedule.devices[inputDevice][p].isInputBackward())
        out.inputsAtBackward = std::max(out.inputsAtBackward, run);
    }
  // Note [Messages held together]: per device, the kinds summed over stages.
  out.together.assign(D, {});
  out.togetherAtBackward.assign(D, {});
  std::vector<std::array<std::vector<int>, 3>> perDevice(D);
  for (const auto& [key, v] : diff) {
    const auto [d, kind, stage] = key;
    std::vector<int>& sum = perDevice[d][kind];
    if (sum.empty()) sum.assign(v.size(), 0);
    for (size_t p = 0; p < v.size(); ++p) sum[p] += v[p];
  }
  for (int d = 0; d < D; ++d) {
    const int n = static_cast<int>(schedule.devices[d].size());
    WaitingMessages::Held run{0, 0, 0};
    for (int p = 0; p < n; ++p) {
      for (int kind = 0; kind < 3; ++kind)
        if (!perDevice[d][kind].empty()) run[kind] += perDevice[d][kind][p];
      const Action& c = schedule.devices[d][p];
      if (c.isCompute()) addUndominated(out.together[d], run);
      if (c.isInputBackward()) addUndominated(out.togetherAtBackward[d], run);
    }
  }
  for (const auto& [key, v] : diff) {
    const auto [d, kind, stage] = key;
    int most = 0, atBackward = 0;
    for (int p = 0, run = 0; p + 1 < static_cast<int>(v.size()); ++p) {
      run += v[p];
      if (schedule.devices[d][p].isCompute()) most = std::max(most, run);
      if (schedule.devices[d][p].isInputBackward()) atBackward = std::max(atBackward, run);
    }
    // outputs: counted over all stages at once (only the last stage sends them)
    int& slot = kind == 0 ? out.activations[stage] : kind == 1 ? out.gradients[stage] : out.outputs;
    slot = std::max(slot, most);
    if (kind == 0)
      out.activationsAtBackward[stage] = std::max(out.activationsAtBackward[stage], atBackward);
    if (kind == 1)
      out.gradientsAtBackward[stage] = std::max(out.gradientsAtBackward[stage], atBackward);
  }
  return out;
}

std::vector<int> rendezvousPasses(const Schedule& schedule) {
  std::vector<int> out(schedule.devices.size(), 0);
  if (schedule.kind == toString(ScheduleKind::OneFOneB) ||
      schedule.kind == toString(ScheduleKind::PipeDream)) {
    std::fill(out.begin(), out.end(), 3);
    return out;
  }
  if (schedule.kind == toString(ScheduleKind::GPipe)) {  // its activations too
    std::fill(out.begin(), out.end(), 4);
    return out;
  }
  if (schedule.kind != toString(ScheduleKind::PipeFbSync) &&
      schedule.kind != toString(ScheduleKind::PipeFbAsync))
    return out;
  for (size_t d = 0; d < schedule.devices.size(); ++d) {
    bool forward = false, backward = false;
    for (const Action& a : schedule.devices[d]) {
      forward = forward || a.type == ActionType::Forward;
      backward = backward || a.isInputBackward() || a.type == ActionType::WeightGrad;
    }
    out[d] = forward && !backward ? 1 : backward && !forward ? 2 : 0;
  }
  return out;
}

}  // namespace pipefb::schedules
