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

  std::vector<std::vector<int>> next(N);
  auto edge = [&](int a, int b) {
    if (a >= 0 && b >= 0) next[a].push_back(b);
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
  std::vector<int> indegree(N, 0), order;
  for (int u = 0; u < N; ++u)
    for (int v : next[u]) ++indegree[v];
  for (int u = 0; u < N; ++u)
    if (indegree[u] == 0) order.push_back(u);
  for (size_t i = 0; i < order.size(); ++i)
    for (int v : next[order[i]])
      if (--indegree[v] == 0) order.push_back(v);
  std::vector<int> last(static_cast<size_t>(N) * D, -1);
  for (int u : order) {
    int* lu = &last[static_cast<size_t>(u) * D];
    lu[deviceOf[u]] = std::max(lu[deviceOf[u]], posOf[u]);
    for (int v : next[u]) {
      int* lv = &last[static_cast<size_t>(v) * D];
      for (int d = 0; d < D; ++d) lv[d] = std::max(lv[d], lu[d]);
    }
  }

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
    const int from = last[static_cast<size_t>(msg.producer) * D + d] + 1, to = posOf[msg.consumer];
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
    const int from = last[static_cast<size_t>(msg.producer) * D + d] + 1, to = posOf[msg.consumer];
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
        if (b >= 0) from = std::max(from, last[static_cast<size_t>(b) * D + d] + 1);
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
      schedule.kind == toString(ScheduleKind::GPipe) ||
      schedule.kind == toString(ScheduleKind::PipeDream)) {
    std::fill(out.begin(), out.end(), 3);
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
