// Device chains: the distinct orders of a cluster's devices a shape is tried on.
#include <algorithm>
#include <functional>
#include <set>
#include <vector>

#include "SolverDetail.h"
#include "pipefb/planner/Solver.h"

namespace pipefb::planner {

using detail::kInf;

namespace {

bool interchangeable(const Cluster& c, int a, int b) {
  const auto &da = c.devices[a], &db = c.devices[b];
  if (da.speed != db.speed || da.capacity != db.capacity || !(da.host == db.host)) return false;
  if (!(c.links[a][b] == c.links[b][a])) return false;
  for (int x = 0; x < c.numDevices(); ++x) {
    if (x == a || x == b) continue;
    if (!(c.links[a][x] == c.links[b][x]) || !(c.links[x][a] == c.links[x][b])) return false;
    // Note [Devices and processes]: which pairs share a process is part of the cost.
    if (c.sameProcess(a, x) != c.sameProcess(b, x)) return false;
  }
  return true;
}

}  // namespace

std::vector<std::vector<int>> distinctChains(const Cluster& c, int length, int maxChains,
                                             bool* heuristic) {
  if (heuristic) *heuristic = false;
  const int D = c.numDevices();
  if (length > D || length < 1) return {};
  // Classes of interchangeable devices (transpositions that are automorphisms of the
  // cost structure; their closure is a group, so comparing with a representative works).
  std::vector<std::vector<int>> classes;
  for (int d = 0; d < D; ++d) {
    bool placed = false;
    for (auto& cl : classes)
      if (interchangeable(c, cl.front(), d)) {
        cl.push_back(d);
        placed = true;
        break;
      }
    if (!placed) classes.push_back({d});
  }
  std::vector<std::vector<int>> out;
  std::vector<int> used(classes.size(), 0), chain;
  bool overflow = false;
  // Depth-first over class sequences; the concrete device is the class's next free one.
  std::function<void()> dfs = [&]() {
    if (overflow) return;
    if (static_cast<int>(chain.size()) == length) {
      out.push_back(chain);
      if (static_cast<int>(out.size()) > maxChains) overflow = true;
      return;
    }
    for (size_t k = 0; k < classes.size(); ++k) {
      if (used[k] == static_cast<int>(classes[k].size())) continue;
      chain.push_back(classes[k][used[k]++]);
      dfs();
      --used[k];
      chain.pop_back();
    }
  };
  dfs();
  if (overflow) {
    if (heuristic) *heuristic = true;
    return greedyChains(c, length);
  }
  return out;
}

std::vector<std::vector<int>> greedyChains(const Cluster& c, int length) {
  const int D = c.numDevices();
  std::set<std::vector<int>> seen;
  std::vector<std::vector<int>> out;
  auto add = [&](std::vector<int> ch) {
    ch.resize(length);
    if (seen.insert(ch).second) out.push_back(ch);
  };
  auto bw = [&](int a, int b) {
    double x = c.link(a, b).bandwidth;
    return x <= 0 ? kInf : x;
  };
  for (int start = 0; start < D; ++start) {
    std::vector<int> ch{start};
    std::vector<bool> used(D, false);
    used[start] = true;
    while (static_cast<int>(ch.size()) < D) {
      int best = -1;
      for (int x = 0; x < D; ++x) {
        if (used[x]) continue;
        if (best < 0 || bw(ch.back(), x) > bw(ch.back(), best) ||
            (bw(ch.back(), x) == bw(ch.back(), best) && c.devices[x].speed > c.devices[best].speed))
          best = x;
      }
      used[best] = true;
      ch.push_back(best);
    }
    add(ch);
  }
  std::vector<int> ident(D);
  for (int i = 0; i < D; ++i) ident[i] = i;
  add(ident);
  std::stable_sort(ident.begin(), ident.end(),
                   [&](int a, int b) { return c.devices[a].speed > c.devices[b].speed; });
  add(ident);
  return out;
}

std::vector<int> replicaCounts(const Cluster& c, const SolverOptions& o) {
  std::vector<int> out{1};
  bool uniform = c.cores == 0;
  for (int d = 1; d < c.numDevices() && uniform; ++d) uniform = interchangeable(c, 0, d);
  if (!uniform) return out;
  for (int R = 2; R <= std::min(o.maxReplicas, c.numDevices()); ++R)
    if (o.batch % R == 0) out.push_back(R);
  return out;
}

}  // namespace pipefb::planner
