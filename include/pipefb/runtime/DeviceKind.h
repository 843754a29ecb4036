#pragma once
// devices.kind (DESIGN.md, "Devices and memory accounting").
//
// Note [No silent fallback]
// `cpu` runs the pipeline on virtual devices (a thread and a memory domain each).
// `cuda` must run on a GPU or not at all: where this process cannot run it, the run
// stops before it starts, with a UserError (exit 2, one line) that says which of these
// is missing:
//   1. LibTorch's CUDA backend loaded (libtorch_cuda; every build links it, Note [One
//      LibTorch]);
//   2. a visible GPU (CUDA_VISIBLE_DEVICES, the driver);
//   3. the pipeline runtime on CUDA: its backend (src/memory/cuda, offload/cuda,
//      src/dist/cuda) is built and linked, but PipelineEngine does not place its
//      stages on it yet, so a CUDA build refuses too rather than train on the CPU.
// Both the trainer and the engine check, before either makes a run folder or a thread.
#include <string>

namespace pipefb::config {
struct Config;
}

namespace pipefb::runtime {

enum class DeviceKind { Cpu, Cuda };

/// Why devices.kind: cuda cannot run in this process ("" if it can): the first missing
/// piece of Note [No silent fallback].
std::string cudaUnavailableReason();

/// config.devices.kind, checked against this process (Note [No silent fallback]).
/// Throws UserError naming devices.kind when it is cuda and cannot run here.
DeviceKind checkDeviceKind(const config::Config& config);

}  // namespace pipefb::runtime
