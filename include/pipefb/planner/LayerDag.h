#pragma once
// Branchy models (Inception, ResNet at operator level, PipeDream's profiled graphs) as a
// DAG of layers, and their reduction to the solver's chain. Torch-free.
//
// Note [DAG partitions]
// The solver (Solver.h) partitions a chain of layers into contiguous stages. A DAG is
// planned in the space of *contiguous ranges of one topological order*: linearize() fixes
// one order (the profile's node order wherever that order is topological, i.e. the order
// the model's forward pass ran in) and sets each chain layer's outputBytes to the bytes
// that cross the cut after it: every tensor made at or before the cut (the model input
// included) that some node after the cut consumes. A tensor with several consumers past
// the cut crosses once; a tensor that skips a stage is relayed through it and so counts on
// every cut it crosses. Since the cost model reads outputBytes only as the bytes at a stage
// boundary (the link transfer out of a stage and the next stage's input, which a checkpoint
// stashes), the chain DP over the linearized profile is exact over that space, with no
// change to the solver (DagPartitionTest checks it against brute force over the same space
// on random DAGs).
// What the space leaves out: a cut must be a prefix of the chosen order, so of two parallel
// branches a stage can end inside the later one only after all of the earlier one. All
// downsets (PipeDream's antichain DP) would also allow ending part-way into both; the
// experiments compare the two on ResNet50 (experiments/README.md, "PipeDream's optimizer").
#include <cstdint>
#include <string>
#include <vector>

#include "pipefb/planner/LayerCost.h"

namespace pipefb::planner {

struct LayerDag {
  /// Per node: its costs. outputBytes is the node's own output tensor (linearize() turns
  /// it into the bytes crossing the cut after the node).
  std::vector<LayerCost> nodes;
  std::vector<std::vector<int>> successors;  // per node, the nodes consuming its output
  std::int64_t inputBytes = 0;               // the model input
  std::vector<int> inputConsumers;           // nodes that read the model input

  int size() const { return static_cast<int>(nodes.size()); }
};

/// A topological order: among the ready nodes, always the lowest index first (so a node
/// list that is already topological is kept as it is). UserError naming `source` on a cycle.
std::vector<int> topologicalOrder(const LayerDag& dag, const std::string& source);

/// Bytes crossing from `inPrefix` (nodes before the cut, closed under predecessors) to the
/// rest: each tensor (a node's output, or the model input, which is always before the cut)
/// with a consumer outside the prefix, once.
std::int64_t crossingBytes(const LayerDag& dag, const std::vector<bool>& inPrefix);

/// The chain the solver plans on (Note [DAG partitions]): the nodes in `order`, each
/// one's outputBytes = crossingBytes after it; inputBytes = the model input. Other fields
/// of `base` (model, device, source, microbatch) are kept.
Profile linearize(const LayerDag& dag, const std::vector<int>& order, Profile base);

}  // namespace pipefb::planner
