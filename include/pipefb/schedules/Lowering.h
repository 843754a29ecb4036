#pragma once
// Lowering passes: turn a compute-only schedule into one a runtime can execute
// (like PyTorch's _add_send_recv). Each pass is a pure function and can be tested alone.
//
// Note [PipeFB hand-off]
// When F(s) != B(s) two things must reach the backward device:
//  * for the last stage, the OUTPUT of F(S-1,m): an ordinary SA(S-1).m>B(S-1) /
//    RA(S-1).m<F(S-1) pair (addCommunication); B(S-1) computes the loss from it;
//  * for every split stage, the stash of F(s,m): it always travels through the host pool,
//    OFF s.m on F(s) right after F and PRE s.m on B(s) before B (addOffload). A stash
//    cannot stay on a device that does not run the backward, so for split stages keep
//    acts as offload and checkpoint as checkpoint-offload (effectivePolicy()).
#include <vector>

#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/Schedule.h"
#include "pipefb/schedules/StashPolicy.h"

namespace pipefb::schedules {

/// Inserts a send right after the producer and the matching (blocking) receive right
/// before the consumer, wherever producer and consumer devices differ:
///  * activations F(s) -> F(s+1):          SA s.m>F(s+1) / RA s.m<F(s)
///  * last-stage output F(S-1) -> B(S-1):  SA (S-1).m>B(S-1) / RA (S-1).m<F(S-1)
///  * gradients B(s) -> B(s-1):            SG s.m>B(s-1) / RG s.m<B(s)
/// Existing send/receive actions are kept; pairs already present are not duplicated.
Schedule addCommunication(const Schedule& schedule);

/// Per stage policy (one entry, or one per stage). For offloaded stages inserts OFF s.m
/// right after F(s,m) and PRE s.m on the backward device `lookahead` compute actions
/// (F or B) before B(s,m), in front of the receives that precede that compute action so the
/// copy is issued before the device blocks (never before its own OFF on the same device).
/// Checkpoint kinds mark B as recompute (BR).
/// `lookahead`: one value, or one per stage (pipeline.lookahead).
Schedule addOffload(const Schedule& schedule, const std::vector<StashPolicy>& policies,
                    const std::vector<int>& lookahead);
Schedule addOffload(const Schedule& schedule, const std::vector<StashPolicy>& policies,
                    int lookahead);

/// The contract after addOffload: offloaded stages have 0 resident on a forward device
/// that is not the backward device, and at most lookahead+1 resident on the backward
/// device.
MemoryContract offloadContract(const MemoryContract& contract, const Placement& placement,
                               const std::vector<StashPolicy>& policies,
                               const std::vector<int>& lookahead);
MemoryContract offloadContract(const MemoryContract& contract, const Placement& placement,
                               const std::vector<StashPolicy>& policies, int lookahead);

/// addCommunication, then addOffload, with the contract updated.
SchedulePlan lower(const SchedulePlan& plan, const std::vector<StashPolicy>& policies,
                   const std::vector<int>& lookahead);
SchedulePlan lower(const SchedulePlan& plan, const std::vector<StashPolicy>& policies,
                   int lookahead);

/// Expands one lookahead to one per stage; a vector of the wrong size or a negative entry is
/// a UserError naming pipeline.lookahead.
std::vector<int> lookaheadPerStage(const std::vector<int>& lookahead, int S);

/// Expands one policy to one per stage; a vector of the wrong size is a UserError.
std::vector<StashPolicy> policiesPerStage(const std::vector<StashPolicy>& policies, int S);

}  // namespace pipefb::schedules
