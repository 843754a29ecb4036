#pragma once
// Per-stage stash policy (DESIGN.md, "stash policy").
#include <string>
#include <vector>

namespace pipefb::schedules {

enum class StashPolicy {
  Keep,               // autograd graph stays on the device that ran F
  Offload,            // saved tensors go to the host pool and come back before B
  Checkpoint,         // only the stage input is kept; B recomputes F
  CheckpointOffload,  // the stage input goes to the host pool; B recomputes F
};

const char* toString(StashPolicy p);
/// "keep" | "offload" | "checkpoint" | "checkpoint-offload"; otherwise a UserError.
StashPolicy parseStashPolicy(const std::string& text);
std::vector<std::string> stashPolicyNames();

bool isCheckpoint(StashPolicy p);
bool isOffloaded(StashPolicy p);

/// The policy actually used for a stage. When F(s) != B(s) the stash cannot stay on
/// the forward device, so keep -> offload and checkpoint -> checkpoint-offload
/// (the PipeFB hand-off goes through the host pool, Note [PipeFB hand-off]).
StashPolicy effectivePolicy(StashPolicy p, bool splitStage);

}  // namespace pipefb::schedules
