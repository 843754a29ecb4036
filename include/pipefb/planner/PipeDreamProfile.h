#pragma once
// PipeDream's per-layer profiles (msr-fiddle/pipedream, profiler/.../profiles/<model>/
// graph.txt) as pipefb profiles. Torch-free.
//
// Note [PipeDream profiles]
// A graph.txt has one line per node,
//   node7 -- Conv2d(64, 128, ...) -- forward_compute_time=9.1, backward_compute_time=17.9,
//            activation_size=822083584.0, parameter_size=295424.0[ -- stage_id=N]
// (times in ms, bytes at the profiling batch; activation_size may be a list "[a; b]", which
// counts as its sum) and then one tab-indented line per edge, "\tnode6 -- node7". The
// importer reads it the way PipeDream's optimizer does: Input nodes carry no cost (their
// forward time is the data loader's) and their activation is the model input; unused
// `__getitem__` sinks are dropped. Each other node becomes a layer:
//   forward, backward   = the profiled times (recompute = forward, step = 0: not profiled);
//   saved, working      = activation_size (the output kept for B; its gradient while B runs);
//   param, grad         = parameter_size; optimizer state = states x parameter_size, and
//                         step transients x parameter_size (OptimizerMemory);
// and the DAG is linearized (Note [DAG partitions], LayerDag.h) in node-number order,
// which is the order the profiled forward pass ran in. The profiling batch is the Input
// activation over one 3x224x224 or 3x299x299 fp32 image (the shapes PipeDream profiled),
// or given (--profile-batch).
#include <cstdint>
#include <string>

#include "pipefb/planner/AnalyticProfile.h"
#include "pipefb/planner/LayerCost.h"
#include "pipefb/planner/LayerDag.h"

namespace pipefb::planner {

/// True when `text` reads as a PipeDream graph.txt rather than a pipefb profile (YAML):
/// its first non-blank line is a node line with forward_compute_time=.
bool isPipeDreamGraph(const std::string& text);

struct PipeDreamGraph {
  LayerDag dag;                 // Input nodes removed (dag.inputBytes, inputConsumers)
  std::int64_t inputBytes = 0;  // the Input nodes' activation at the profiling batch
  int inputNodes = 0;
};

/// Parses a graph.txt; a malformed line is a UserError "<source>:<line>: ...".
PipeDreamGraph parsePipeDreamGraph(const std::string& text, const std::string& source);

struct PipeDreamImport {
  std::int64_t batch = 0;  // profiling batch; 0 = infer from the Input node
  /// State tensors per parameter (SGD with momentum: 1) and step transients, as the
  /// analytic profile charges them (optimizerMemory()).
  OptimizerMemory optimizer{1, 0};
  std::string device;  // the reference device the times are taken as measured on
};

/// The whole import: parse, infer the batch, linearize. Profile::source is "pipedream".
Profile importPipeDreamProfile(const std::string& text, const std::string& source,
                               const PipeDreamImport& options);

}  // namespace pipefb::planner
