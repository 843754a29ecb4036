#pragma once
// Lowering passes: turn a compute-only schedule into one a runtime can execute
// (like PyTorch's _add_send_recv). Each pass is a pure function and can be tested alone.
//
// Note [PipeFB hand-off]
// When F(s) != B(s) two things must reach the backward device:
//  * for the last stage, the OUTPUT of F(S-1,m): an ordinary SA(S-1).m>B(S-1) /
//    RA(S-1).m<F(S-1) pair (addCommunication); B(S-1) computes the loss from it, unless
//    B(S-1) recomputes (Note [Recomputed last output]);
//  * for every split stage, the stash of F(s,m): it always travels through the host pool,
//    OFF s.m on F(s) right after F and PRE s.m on B(s) before B (addOffload). A stash
//    cannot stay on a device that does not run the backward, so for split stages keep
//    acts as offload and checkpoint as checkpoint-offload (effectivePolicy()).
#include <tuple>
#include <vector>

#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/Schedule.h"
#include "pipefb/schedules/StashPolicy.h"

namespace pipefb::schedules {

/// Note [Recomputed last output]
/// A B(S-1,m) that recomputes (BR or IR: a checkpoint kind) makes the last stage's output
/// again from its stashed input, and the runtime takes the loss from that recomputed
/// output (startBackward, src/runtime/StageCompute.cpp), so the output of F(S-1,m) goes to
/// the backward device only when that device is another one and B does not recompute.
/// On GPT-2 small (1024 tokens, microbatch 8) the output is the logits, 1.53 GiB a
/// microbatch, of which up to 7 could wait on a decoupled head's backward device when sent
/// when made (Note [Waiting messages]; now sent at its receive there, Note [Message
/// rendezvous]). The targets go to the last stage's backward device either way.
/// The lowering (addCommunication), the validator, waitingMessages, the planner's cost
/// model and the runtime's forward (which then keeps no copy of the output) all ask here.
/// Nor does a recomputing last stage's own F keep its output for the loss, split or not
/// (PipelineEngine's buildStage): gpipe-checkpoint-offload on GPT-2 tiny held every
/// waiting microbatch's logits there, 196 KiB more than its plan at the smallest budget.
inline bool lastOutputTravels(bool splitStage, bool recomputes) {
  return splitStage && !recomputes;
}

/// Note [Loss in the recomputed graph]
/// A B(S-1,m) that recomputes (BR; not IR) takes the loss on the recomputed output itself,
/// inside the graph it just built, lets go of the output and runs autograd from the
/// scaled loss (startBackward, src/runtime/StageCompute.cpp). log_softmax saves its result,
/// not its input, and the head's matmul saves its input, so the output's storage is freed
/// once the loss is computed: B then holds the loss's transient (log_softmax's result, its
/// gradient and the output's gradient) and later the output's gradient, without the output
/// beside them. Before, B took the loss on a detached copy, got the output's gradient and
/// then ran the output's graph with it, the output held throughout: on GPT-2 small (1024
/// tokens, microbatch 8) one logits, 1.53 GiB, more at the head's peak, which bound every
/// family's smallest budget (experiments/README.md, "pipefb_memory").
/// An output that is kept (keep, offload: the graph F built) or sent (a split last stage
/// that does not recompute) still goes the old way: the loss reads a detached copy whose
/// gradient then runs through F's graph, and F's graph root (hollowed under offload) or
/// the message holds the output. I (IR, Note [Split backward]) goes the old way too: its
/// graph waits for W, which would otherwise rerun log_softmax's backward. The profiler
/// measures this loss apart (Profile::recomputedLossBytes, the output included until it
/// is let go) and the cost model charges it for exactly these Bs.
inline bool lossInRecomputedGraph(bool recomputes, bool splitBackward) {
  return recomputes && !splitBackward;
}

/// Marks every B and I of a stage whose effective policy (effectivePolicy) is a checkpoint
/// kind as recomputing (BR, IR), and clears the mark elsewhere. `policies`: one, or one per
/// stage. addOffload and lower() run it; addCommunication reads the marks.
Schedule markRecompute(const Schedule& schedule, const std::vector<StashPolicy>& policies);

/// Inserts a send right after the producer and the matching (blocking) receive right
/// before the consumer, wherever producer and consumer devices differ:
///  * activations F(s) -> F(s+1):          SA s.m>F(s+1) / RA s.m<F(s)
///  * last-stage output F(S-1) -> B(S-1):  SA (S-1).m>B(S-1) / RA (S-1).m<F(S-1), unless
///    B(S-1,m) is marked recompute (Note [Recomputed last output])
///  * gradients B(s) -> B(s-1):            SG s.m>B(s-1) / RG s.m<B(s)
/// I takes B's place (Note [Split backward]); W communicates nothing.
/// Existing send/receive actions are kept; pairs already present are not duplicated.
Schedule addCommunication(const Schedule& schedule);

/// Note [Prefetches after the forward phase]
/// A stage whose F and B run on one device and whose every iteration runs all its Fs
/// before its first B (or I) and all its Bs before the next iteration's first F (gpipe;
/// 1f1b where M <= S - s; a flush between the phases) has its PREs issued no earlier
/// than the OFF of the phase's last F (addOffload): lookahead compute actions before
/// B(s,m) would otherwise fall among the last Fs, and the F phase would hold the
/// prefetched stashes beside the one F builds and the copies still going out. So such a
/// stage holds at most 1 + kOffloadsInFlight offloaded stashes in its F phase and
/// lookahead + 1 in its B phase; any other same-device stage lookahead + 1 near B plus
/// the one an F between its Bs is copying out (residentOffloadedStashes, which the
/// planner's cost model charges, Note [Offloads in flight] in planner/CostModel.h).
/// Measured before: seed 0 instance 29 of PlanRunsTest (gpt2-tiny gpipe-offload S=3 M=4)
/// held 2 stashes where lookahead + 2 = 3 were charged, -10.4% and -11.9%.
/// forwardPhaseFirst: per stage, whether it runs so (on the compute order of `schedule`).
std::vector<bool> forwardPhaseFirst(const Schedule& schedule);
/// Offloaded stashes of a same-device stage resident at once: min(n, lookahead + 2), or
/// with the forward phase first min(n, max(lookahead + 1, 1 + kOffloadsInFlight)); plus
/// the `deferred` stashes waiting for their W (Note [Split backward]).
int residentOffloadedStashes(int inFlight, int lookahead, bool forwardPhaseFirst, int deferred);

/// Per stage policy (one entry, or one per stage). For offloaded stages inserts OFF s.m
/// right after F(s,m) and PRE s.m on the backward device `lookahead` compute actions
/// (F or B) before B(s,m), in front of the receives that precede that compute action so the
/// copy is issued before the device blocks (never before its own OFF on the same device).
/// Checkpoint kinds mark B as recompute (BR). I takes B's place (IR; PRE before I); the
/// stash then stays until W (Note [Split backward]). Note [Prefetches after the forward
/// phase] moves some PREs later.
/// `lookahead`: one value, or one per stage (pipeline.lookahead).
Schedule addOffload(const Schedule& schedule, const std::vector<StashPolicy>& policies,
                    const std::vector<int>& lookahead);
Schedule addOffload(const Schedule& schedule, const std::vector<StashPolicy>& policies,
                    int lookahead);

/// Note [Weight-version offload]
/// For each stashed weight version (Note [Stashed weight versions], WeightVersions.h) of a
/// stage whose effective policy is an offload kind, on the device that keeps it:
///  * OFFW s.v right after the action that leaves the copy off the live path: the last F
///    that runs on it (same-device stage; after that F's own OFF), or STEP s.v (split);
///  * PREW s.v `lookahead` compute actions before the first B that needs it, in front of
///    the receives feeding that compute action, as PRE (never before its OFFW);
///  * DROPW s.v right after the last B that needs it (the device copy goes; the schedule,
///    not the last stash, ends the version's life).
/// When no compute action would run between OFFW and PREW the copy would come straight
/// back: neither is emitted and the version stays (only DROPW). That is always the case
/// for pipefb-async, whose stale version is first needed by the first B after the STEP
/// that made it; it is what pipedream's stage S-2 does with lookahead >= 2.
Schedule addWeightOffload(const Schedule& schedule, const std::vector<StashPolicy>& policies,
                          const std::vector<int>& lookahead);

/// Stashed weight versions of an offloaded stage resident on the device that keeps them
/// (at compute starts) when `versions` are stashed at once and weights are offloaded:
/// min(versions, lookahead + 1). The contract's residentWeightVersions (offloadContract)
/// and the planner's cost model both count with it.
int residentStashedVersions(int versions, int lookahead);

/// Note [Versions being copied out]
/// residentStashedVersions counts at compute starts, with a version gone once its OFFW is
/// issued. The device copy goes only when the copy engine has copied it (released as
/// copied, as a same-device stage's stashes, Note [Held offload copies] in
/// offload/TransferManager.h), and that engine also runs the stage's OFFs, PREs and PREWs
/// in order, so a PipeDream stage whose versions move holds one more while an OFFW waits:
/// min(versions, lookahead + 2), the count its stashes take (lookahead + 1 near B plus the
/// one being copied out, residentOffloadedStashes). A device has at most kOffloadsInFlight
/// (1) copies going out, stash or version, so where its stashes are charged that slot the
/// planner's cost model charges a version going out only beyond it: max(0, W - stash).
/// Measured: gpt2-tiny pipedream-offload S=3 M=4 at its smallest budget (analytic times,
/// lookahead 1), the embedding's device held 3 versions at the end of F0.13 (OFFW0.10's
/// copy ran after it), 1116672 bytes where the plan said 1084672 (+3.0%, 2 charged);
/// resnet50/8 pipedream-offload S=3 M=2 held 3 in its drain, before B0.3. (The runtime's
/// own bound, WeightOffloadTest.ResidentVersionsFollowTheLookahead, was lookahead + 2.)
/// The runtime holds that device copy through the device's next compute action, so the
/// B right after an OFFW has it every time (Note [Copies held through the next compute]
/// in src/runtime/WeightVersions.cpp); later, only while the copy lags. A pipedream stage
/// whose versions move is charged its versions, stashes and inputs together instead (Note
/// [Held at a same-device stage's starts]): this per-category bound is what is left for
/// the other cases.
int heldStashedVersions(int versions, int lookahead);

/// Note [Held at a same-device stage's starts]
/// A stage alone on its device with F and B there (pipedream, 1f1b, gpipe) holds, beside
/// its states, activation stashes, stashed weight versions and (stage 0) iteration inputs.
/// Each category's own worst case comes at its own starts: pipedream-offload's stage 0
/// holds lookahead + 1 stashes near B only in its drain, the version an OFFW is copying
/// out beside M - 1 waiting inputs only in its steady state, so their sum is never
/// reached (PlanRunsTest: resnet50/8 pipedream-offload S=3 M=2, seed 2 instance 44, device
/// 0 25.6% below a plan that charged 3 stashes beside 2 versions; it held 2 beside 3 in
/// B0.3 of its drain). This counts the three together at each F, B (or I) and STEP start
/// of the stage on a lowered schedule, as the runtime holds them:
///  * a stash from the end of its F (an F's own is its peak, Note [Forward peak] in
///    planner/CostModel.h) to the end of its B (or W); a version from the F that makes
///    its snapshot (a STEP separates that F from its B) to its DROPW, or to the end of its
///    last B;
///  * OFF and OFFW take one off the device, PRE and PREW bring it back (its tensors are
///    allocated when issued, Note [Planned prefetch destinations] in
///    offload/TransferManager.h); but an offload's device copy goes only once copied, and
///    the device's next offload waits for that (kOffloadsInFlight, Note [Offloads in
///    flight]): the last one the device issued is counted until it issues another, at
///    each start between (the B right after an OFFW holds that version every time, Note
///    [Copies held through the next compute] in src/runtime/WeightVersions.cpp; later
///    starts only while the copy lags: an upper bound over timing);
///  * an iteration's M inputs wait from the device's first action of it (iterationOf in
///    Schedule.h) to their F; an F's own is not counted at it: its first layer saves it
///    (in F's peak, as the cost model charged M - 1 inputs beside an F before).
/// The planner's cost model charges a same-device pipedream stage that moves its versions
/// the most, over these starts, of the bytes they hold beside what each start's action
/// holds (CostModel.cpp).
struct SameDeviceHeld {
  enum class At { Forward, Backward, Step };
  At at = At::Forward;
  int stashes = 0, versions = 0, inputs = 0;
  bool operator<(const SameDeviceHeld& o) const {
    return std::tie(at, stashes, versions, inputs) <
           std::tie(o.at, o.stashes, o.versions, o.inputs);
  }
  bool operator==(const SameDeviceHeld& o) const {
    return at == o.at && stashes == o.stashes && versions == o.versions && inputs == o.inputs;
  }
};
/// Per stage, the distinct counts at its starts (none for a stage that shares its device or
/// runs F and B on two). `stepsPerMicrobatch`: the kind's (ScheduleKind.h).
std::vector<std::vector<SameDeviceHeld>> heldAtSameDeviceStarts(const Schedule& lowered,
                                                                bool stepsPerMicrobatch);
/// Those of stage k of pipedream (S, M) over enough iterations for its steady state and its
/// drain (2S + 2 microbatches, at least 3 iterations), lowered with `lookahead`, its stages
/// offloaded with their versions: counted as stage 0 of pipedream (S - k, M), whose device
/// runs the same list, on that list alone (each lowering pass lowers a same-device stage on
/// its own device), its inputs only for k = 0: the planner asks for every stage of many
/// shapes, and lowering them whole took bench_planner from 4 s to 9-14 s. LoweringTest
/// checks it against the whole lowering.
std::vector<SameDeviceHeld> pipedreamHeld(int S, int k, int M, int lookahead);

/// Note [Stashes at a step]
/// The activation stashes of stage s resident on its backward device when one of its STEPs
/// starts, the most over those STEPs of a lowered schedule (addOffload ran): F(s,m) on that
/// device makes one until its OFF, PRE s.m brings one until B or W of (s,m) ends it. A
/// flushing schedule on its own devices steps with none; a prefetch that the lowering
/// issues before the STEP for the next iteration's first backwards is there beside the
/// step's transient (a folded device's second half, Note [Folded lookahead]: PRE s.m goes
/// lookahead backwards ahead, into the previous iteration). The planner's cost model
/// charges the step transient beside these (Note [Step working set] in
/// planner/CostModel.h).
std::vector<int> stashesAtStep(const Schedule& lowered);

/// Note [Stashes at a backward]
/// The activation stashes of stage s resident on its backward device when one of its B (or
/// I) starts, the one it takes included, the most over them, counted as stashesAtStep
/// counts. A split stage's backward device holds lookahead + 1 there (Note [Resident
/// offloaded stashes]) unless its PREs come later than that: on a folded device (Note
/// [Folded lookahead]) PRE s.m goes behind the OFFs of the device's forwards with a
/// smaller key or of an earlier iteration (Note [Prefetch behind other stages' offloads]),
/// so with M = 1 it follows the next iteration's F of the other stage, after B(s,m-1)
/// ended: one stash at every B. The runtime allocates a prefetch's tensors when its PRE is
/// issued and frees B's stash when B ends (Note [Planned prefetch destinations], Note [The
/// registry's only reference] in src/runtime/Stash.h), so a device holds exactly this
/// count at its B starts; the planner's cost model charges it on folded devices (Note
/// [Folded pace] in planner/CostModel.h). Counted as issued: a flushing kind's PREs for the
/// next iteration count too, though the runtime binds them later (Note [Prefetches across
/// a flush] in src/runtime/Stash.cpp), so there it is only a bound.
std::vector<int> stashesAtBackward(const Schedule& lowered);

/// The contract after addOffload: offloaded stages have 0 resident on a forward device
/// that is not the backward device, and at most lookahead+1 resident on the backward
/// device. With `offloadWeights` (addWeightOffload ran) at most lookahead+1 stashed weight
/// versions of an offloaded stage are resident on the device that keeps them.
MemoryContract offloadContract(const MemoryContract& contract, const Placement& placement,
                               const std::vector<StashPolicy>& policies,
                               const std::vector<int>& lookahead, bool offloadWeights = true);
MemoryContract offloadContract(const MemoryContract& contract, const Placement& placement,
                               const std::vector<StashPolicy>& policies, int lookahead,
                               bool offloadWeights = true);

/// markRecompute, addCommunication, then addOffload, then (offloadWeights: pipeline.offload_weights
/// auto) addWeightOffload, with the contract updated.
///
/// Note [Lowering speed]
/// The planner lowers every candidate it re-scores (simulatePlan in planner/Solver.cpp):
/// bench_planner's 64-stage PipeDream plans over 9 iterations are tens of thousands of
/// actions, lowered several times per solve. So the passes look actions up in flat tables
/// indexed by (stage, index) (addWeightOffload's positions, stashedVersions' versions,
/// addCommunication's messages already there) rather than in ordered maps and sets, and
/// addOffload's set of what is already there holds only the OFFs and PREs, the only keys
/// it looks for. The output is the same action for action.
SchedulePlan lower(const SchedulePlan& plan, const std::vector<StashPolicy>& policies,
                   const std::vector<int>& lookahead, bool offloadWeights = true);
SchedulePlan lower(const SchedulePlan& plan, const std::vector<StashPolicy>& policies,
                   int lookahead, bool offloadWeights = true);

/// Expands one lookahead to one per stage; a vector of the wrong size or a negative entry is
/// a UserError naming pipeline.lookahead.
std::vector<int> lookaheadPerStage(const std::vector<int>& lookahead, int S);

/// Expands one policy to one per stage; a vector of the wrong size is a UserError.
std::vector<StashPolicy> policiesPerStage(const std::vector<StashPolicy>& policies, int S);

}  // namespace pipefb::schedules
