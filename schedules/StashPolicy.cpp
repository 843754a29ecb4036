#include "pipefb/schedules/StashPolicy.h"

#include "pipefb/common/Error.h"
#include "pipefb/common/Suggest.h"

namespace pipefb::schedules {

const char* toString(StashPolicy p) {
  switch (p) {
    case StashPolicy::Keep:
      return "keep";
    case StashPolicy::Offload:
      return "offload";
    case StashPolicy::Checkpoint:
      return "checkpoint";
    case StashPolicy::CheckpointOffload:
      return "checkpoint-offload";
  }
  return "?";
}

std::vector<std::string> stashPolicyNames() {
  return {"keep", "offload", "checkpoint", "checkpoint-offload"};
}

StashPolicy parseStashPolicy(const std::string& text) {
  for (StashPolicy p : {StashPolicy::Keep, StashPolicy::Offload, StashPolicy::Checkpoint,
                        StashPolicy::CheckpointOffload})
    if (text == toString(p)) return p;
  throw UserError("unknown stash policy '" + text + "'" + didYouMean(text, stashPolicyNames()) +
                  "; allowed: " + joinAllowed(stashPolicyNames()));
}

bool isCheckpoint(StashPolicy p) {
  return p == StashPolicy::Checkpoint || p == StashPolicy::CheckpointOffload;
}
bool isOffloaded(StashPolicy p) {
  return p == StashPolicy::Offload || p == StashPolicy::CheckpointOffload;
}

StashPolicy effectivePolicy(StashPolicy p, bool splitStage) {
  if (!splitStage) return p;
  if (p == StashPolicy::Keep) return StashPolicy::Offload;
  if (p == StashPolicy::Checkpoint) return StashPolicy::CheckpointOffload;
  return p;
}

}  // namespace pipefb::schedules
