#pragma once
// How many messages can wait on a device (Note [Waiting messages]).
#include <array>
#include <vector>

#include "pipefb/schedules/Schedule.h"

namespace pipefb::schedules {

/// Note [Waiting messages]
/// Channels copy a message into the receiver's memory when it is sent (comm_buffers),
/// and the receiver holds it until the action that consumes it. A sender that runs ahead
/// of its receiver therefore leaves messages waiting there. Devices run their lists
/// freely, ordered only by what they wait for, so a message can be waiting when a
/// compute action c of its receiver starts if its consumer comes after c on that device
/// and its producer does not have to wait for c (it is not reachable from c through
/// device order and the waits: activations F(s-1,m) -> F(s,m), gradients B/I(s+1,m) ->
/// B/I(s,m), the output and the stash F(s,m) -> B/I(s,m), SW -> RW, and for schedules
/// that step per microbatch the feed of an iteration once the last stage's backwards of
/// the previous one started: each computes its loss first, PipelineEngine::step). The counts are
/// upper bounds over the compute starts of the schedule's compute-only lists; how many do wait
/// depends on timing. The counts at the backward starts alone are kept apart: a device that runs a
/// stage's F and B peaks in B, and gpipe's activations, for one, wait only at forward starts.
struct WaitingMessages {
  std::vector<int> activations;  // per stage s: inputs of F(s) waiting on its forward device
  std::vector<int> gradients;    // per stage s: output gradients waiting on its backward device
  // the same two counts, over the starts of B (or I) on that device only
  std::vector<int> activationsAtBackward, gradientsAtBackward;
  // outputs of F(S-1) waiting on the last stage's backward device; none are sent to a B that
  // recomputes (Note [Recomputed last output]), so the planner counts them only for the rest,
  // and none wait on a backward-only device fed by a forward-only one (Note [Message
  // rendezvous]): they count on folded and mixed placements only
  int outputs = 0;
  // of those, the most that can wait while a B(S-1) (or I) takes its loss: the outputs of
  // its own iteration only (Note [Outputs at the loss])
  int outputsAtLoss = 0;
  // iteration inputs waiting on stage 0's forward device at its B (or I) starts: fed at
  // the iteration's start, or once the last stage's backwards of the one before ran
  int inputsAtBackward = 0;
  /// Note [Messages held together]: per device, the (activations, gradients, outputs)
  /// that can wait there together at one compute start, summed over stages: the
  /// combinations not dominated by another, over all its compute starts (`together`) and
  /// over its B (or I) starts alone (`togetherAtBackward`).
  using Held = std::array<int, 3>;
  std::vector<std::vector<Held>> together, togetherAtBackward;
};

/// Note [Messages held together]
/// The counts above are each the most over a device's compute starts, one stage and kind
/// at a time. A folded device receives two stages' messages, activations for its F and
/// gradients (or the last stage's outputs) for its B, and their worst starts differ: at
/// the first F of an iteration the next forwards' activations can be waiting, but no
/// gradient, which needs that F to have run; at the last F the gradients can be, and no
/// activation. Summed, the two counts charged pipefb-sync folded S=3 M=4 six messages
/// where three can wait together (mlp pipefb-sync-checkpoint, PlanRunsTest seed 1
/// instance 22: the device of F2 and B0 measured 10.2% below its plan, 12 KiB of its
/// 24 KiB of comm buffers never there). The cost model charges a folded device the most
/// bytes of any one combination (foldedDeviceMemory).

/// Note [Outputs at the loss]
/// An output of the next iteration cannot wait beside the loss of a B(S-1,m) (or I) that
/// reads a copy of its output (Note [Recomputed last output]): step() feeds an iteration
/// only once the losses of the one before are known (PipelineEngine::step; every kind,
/// asynchronous ones included), and that B reports its loss only after it took the
/// loss's gradient, the peak of its loss (startBackward). So of the outputs waiting at
/// B(S-1,m)'s start only those of m's own iteration are there at that peak; the others
/// can arrive during the rest of B, which the cost model charges them beside (on a folded
/// device, which runs forwards too, they are charged beside everything as before). Charged
/// beside the loss as well, gpt2-tiny pipefb-async-keep S=3 M=1 (2S form; PlanRunsTest
/// seed 1 instance 14) had the head's backward device 10.5% below its plan: one logits
/// at its peak (the one B read) where two were charged.
WaitingMessages waitingMessages(const Schedule& schedule);

/// Note [Message rendezvous]
/// In PipeFB (pipefb-sync, pipefb-async), an activation sent from one device that runs only
/// forwards to another such device, or a gradient from one that runs only backwards to
/// another (the ranges of the 2S form or of a decoupled placement, Note [Decoupled
/// partitions] in Placement.h), is sent only once its receiver waits for it (the runtime's
/// SA or SG waits for the matching RA or RG): none waits on the receiver. Such a message was
/// otherwise up to M - 1 messages early (2M - 1 in pipefb-async, whose backward devices
/// run an iteration behind), counted at every compute start of the receiver (Note [Waiting
/// messages]) and charged beside its fullest F or B, where on virtual devices none ever
/// waited at the peak (resnet50/8 pipefb-sync: 3 of layer2.0's input gradients on the first
/// backward range, 768 KiB of a 3.6 MiB plan, device 31% below it; 3 of layer2.2's inputs on
/// the second forward range, 384 KiB, 15% below; pipefb-async, decoupled 1 + 3 devices: 7
/// of layer3.1's output gradients, 448 KiB, first backward range 20% below it). The sender
/// holds the message while it waits, as it did from the end of the F or B that made it:
/// within that action's peak.
/// So does the last stage's output (the logits) from a forward-only device to a backward-only
/// one: SA(S-1, m) waits for RA(S-1, m), which the lowering puts right before B(S-1, m), so the
/// head's backward device holds only the output its B reads. On the sender SA(S-1, m) comes right
/// after F(S-1, m) and its OFF; its thread runs nothing while it waits, nothing arrives there
/// meanwhile (its activations are sent at their receive too, and an RW takes its weights at the
/// RW), and its copy engine only frees stashes: the output is held there within F(S-1, m)'s peak.
/// Sent when made, up to M - 1 outputs could wait beside the loss (2M - 1 in pipefb-async) and
/// were charged there, a bound over timing that the runtime rarely reached (gpt2-tiny
/// pipefb-sync-offload S=3 M=4, PlanRunsTest seed 4 instance 32: 3 logits of 64 KiB charged, the
/// head's backward device 17.5% below its plan; now +0.0%).
/// Deadlock-free: a forward-only device waits only for forwards before it, for the last stage's
/// backward device to reach the RA of an output made before, and, in pipefb-async, for RW(s, k),
/// which follows F(s, (k + 1)M) (or later) and needs B(s, kM + M - 1): the backwards of
/// iterations the forwards before it finished. A backward-only device waits only for backwards
/// after it, for stashes and outputs, whose forwards come before its receive's in every forward
/// device's list, and, in pipefb-async, for the RW its STEP waits for, which follows forwards
/// whose outputs it received. The receiver reaches its receive through messages sent before this
/// one. The validator runs the sends so (validate()), over every generated shape and every
/// decoupled placement of 3 and 4 stages on 3 devices.
/// 1f1b, gpipe and pipedream (one stage per device, F and B on it) send their gradients
/// the same way: B(s+1, m)'s gradient goes out when stage s waits for it at RG(s, m). The
/// sender holds it meanwhile, as it would have; the receiver holds nothing early. Stage s
/// reaches RG only through sends to stages below it (stage 0 sends none) and activations,
/// which are sent when made, so the waits cannot close a cycle. Before, every gradient
/// that can wait was charged at the receiver's B (resnet50/8 1f1b and gpipe at their
/// smallest budgets, 64 px: device 0 charged 3 of layer1.1's input gradients, 768 KiB,
/// where none waited at its peak: 17.8% below the plan). gpipe sends its activations at
/// their receive too: SA(s, m) waits for RA(s+1, m), which stage s+1 reaches after F(s+1,
/// m-1) and its own send; the last stage sends none, so the waits run down a chain and
/// cannot close a cycle, and its forward phase waits on no backward (sent when made, up to M
/// - 1 activations could wait at a receiver beside its F, charged there, where on virtual
/// devices none did when the sender was slower: PlanRunsTest seed 4 instance 33, mlp
/// gpipe-offload, 3 of the last stage's 4 KiB inputs charged, its device 12.4% below the plan,
/// 24.7% once linear layers added their weight gradients into .grad). The sender holds the
/// activation while it waits, within F's peak; a faster sender would only have finished its
/// forwards earlier, and its backwards wait for the stage above anyway. 1f1b and pipedream
/// keep sending activations when made: their forwards run beside backwards, and a stage
/// waiting to send would hold up the backward its receiver's gradient needs. Per device: 1
/// when it runs only forwards, 2 only backwards, 3 for 1f1b and pipedream, 4 for gpipe, 0
/// otherwise.
/// The simulator models the wait (Note [Rendezvous in the simulator], src/sim/Simulator.cpp).
std::vector<int> rendezvousPasses(const Schedule& schedule);

/// What a message between two devices carries: an activation F(s) -> F(s+1), a gradient
/// B/I(s+1) -> B/I(s), or the last stage's output F(S-1) -> B(S-1).
enum class MessageKind { Activation, Gradient, Output };
/// The kind of the message an SA/RA/SG/RG moves in a schedule of `numStages` stages.
inline MessageKind messageKind(const Action& a, int numStages) {
  if (a.type == ActionType::SendGrad || a.type == ActionType::RecvGrad)
    return MessageKind::Gradient;
  return a.stage + 1 == numStages ? MessageKind::Output : MessageKind::Activation;
}
/// Whether a message from device `from` to device `to` is sent at its receive.
inline bool rendezvous(const std::vector<int>& passes, int from, int to, MessageKind kind) {
  switch (kind) {
    case MessageKind::Activation:
      return (passes[from] == 1 && passes[to] == 1) || (passes[from] == 4 && passes[to] == 4);
    case MessageKind::Gradient:
      return (passes[from] == 2 && passes[to] == 2) ||
             (passes[from] >= 3 && passes[from] == passes[to]);
    case MessageKind::Output:
      return passes[from] == 1 && passes[to] == 2;
  }
  return false;
}

}  // namespace pipefb::schedules
