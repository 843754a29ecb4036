#pragma once
// One step of a schedule, and its short text form.
//
// Note [Action text form]
// Every action prints as a short token and parses back (parseAction(toString(a)) == a):
//
//   F1.3        forward of stage 1, microbatch 3
//   B1.3        backward of stage 1, microbatch 3 (stash is the autograd graph)
//   BR1.3       backward that first recomputes the forward from a checkpoint stash
//   I1.3        input-gradient half of B1.3 (Note [Split backward]); IR1.3 recomputes first
//   W1.3        weight-gradient half of B1.3, after I1.3 on the same device
//   SA1.3>4     send the OUTPUT activation of stage 1, mb 3, to device 4
//   RA1.3<2     receive the output activation of stage 1, mb 3, from device 2
//   SG1.3>0     send the gradient w.r.t. the INPUT of stage 1, mb 3, to device 0
//   RG1.3<5     receive that gradient from device 5
//   OFF1.3      offload the activation stash of (1,3) to the host pool
//   PRE1.3      prefetch the activation stash of (1,3) from the host pool
//   DROP1.3     release the activation stash of (1,3) without consuming it
//   OFFW1.2 PREW1.2 DROPW1.2   the same for weight version 2 of stage 1
//   STEP1.0     optimizer step number 0 of stage 1 (weights become version 1)
//   SW1.0>3     SyncWeights: send the weights made by step 0 of stage 1 to device 3
//   RW1.0<7     receive the weights made by step 0 of stage 1 from device 7
//   AR1.0       all-reduce of stage 1's gradients before step 0 (data parallelism)
//
// A send and its receive carry the same (stage, index): the stage is always the
// stage that PRODUCED the data (SA: its output; SG: the gradient of its input).
//
// Note [Split backward]
// B(s,m) is the fused backward. A zero-bubble schedule splits it (Qi et al. 2023):
//  * I(s,m) computes the gradient w.r.t. the stage input (what SG sends upstream) and
//    consumes what the stash holds beyond the W inputs;
//  * W(s,m) computes the weight gradients later, on the device that ran I(s,m), from the
//    saved inputs of the stage's weight layers and their output gradients, and accumulates
//    into .grad. Until W runs those stay on the device: the stash of (s,m) is in flight
//    from the end of F until the end of W (MemoryContract::deferredW counts the ones
//    whose I already ran). I takes B's place for SG/RG, PRE and recompute (IR); W needs
//    only I. A (stage, microbatch) has either B, or I and W.
#include <cstdint>
#include <string>

namespace pipefb::schedules {

/// The runtime dispatches on this with one exhaustive switch (-Werror=switch).
enum class ActionType : std::uint8_t {
  Forward,      // F
  Backward,     // B / BR
  SendAct,      // SA
  RecvAct,      // RA
  SendGrad,     // SG
  RecvGrad,     // RG
  Offload,      // OFF / OFFW
  Prefetch,     // PRE / PREW
  Drop,         // DROP / DROPW
  Step,         // STEP
  SyncWeights,  // SW: the backward device sends updated weights to the forward device
  RecvWeights,  // RW: the receiving half of SyncWeights, on the forward device
  AllReduce,    // AR
  InputGrad,    // I / IR (Note [Split backward])
  WeightGrad,   // W
};

inline constexpr int kNumActionTypes = 15;

/// What an Offload/Prefetch/Drop moves.
enum class StashKind : std::uint8_t {
  Activation,  // the stash of (stage, microbatch): saved tensors or a checkpoint
  Weights,     // a weight version of a stage; `index` is the version number
};

/// One action. 12 bytes, copied freely.
///  * `index` is the microbatch for F/B/SA/RA/SG/RG and activation stashes (global over
///    iterations: iteration k, microbatch j has index k*M + j); the version for weight
///    stashes; the step number for STEP/SW/RW/AR.
///  * `peer` is the other device of a send/receive, -1 otherwise.
///  * `recompute` only for Backward and InputGrad: the stash is a checkpoint, re-run F first.
struct Action {
  ActionType type = ActionType::Forward;
  StashKind stash = StashKind::Activation;
  bool recompute = false;
  std::int32_t stage = 0;
  std::int32_t index = 0;
  std::int32_t peer = -1;

  bool operator==(const Action& o) const {
    return type == o.type && stash == o.stash && recompute == o.recompute && stage == o.stage &&
           index == o.index && peer == o.peer;
  }
  bool operator!=(const Action& o) const { return !(*this == o); }

  bool isCompute() const {
    return type == ActionType::Forward || type == ActionType::Backward ||
           type == ActionType::InputGrad || type == ActionType::WeightGrad;
  }
  /// B or I: the action that consumes the gradient from downstream, produces the one sent
  /// upstream, and first needs the stash on the device (Note [Split backward]).
  bool isInputBackward() const {
    return type == ActionType::Backward || type == ActionType::InputGrad;
  }
  /// B or W: the action after which the stash of (stage, index) is gone.
  bool endsStash() const { return type == ActionType::Backward || type == ActionType::WeightGrad; }
  bool isSend() const {
    return type == ActionType::SendAct || type == ActionType::SendGrad ||
           type == ActionType::SyncWeights;
  }
  bool isRecv() const {
    return type == ActionType::RecvAct || type == ActionType::RecvGrad ||
           type == ActionType::RecvWeights;
  }
};

// Constructors named like the text form.
Action F(int stage, int mb);
Action B(int stage, int mb, bool recompute = false);
Action I(int stage, int mb, bool recompute = false);
Action W(int stage, int mb);
Action sendAct(int stage, int mb, int peer);
Action recvAct(int stage, int mb, int peer);
Action sendGrad(int stage, int mb, int peer);
Action recvGrad(int stage, int mb, int peer);
Action offload(int stage, int index, StashKind kind = StashKind::Activation);
Action prefetch(int stage, int index, StashKind kind = StashKind::Activation);
Action drop(int stage, int index, StashKind kind = StashKind::Activation);
Action step(int stage, int n);
Action syncWeights(int stage, int n, int peer);
Action recvWeights(int stage, int n, int peer);
Action allReduce(int stage, int n);

/// The matching receive type of a send type and vice versa (SA<->RA, SG<->RG, SW<->RW).
ActionType matchingType(ActionType t);

/// "F", "SA", ... (the prefix of the text form; "B" for Backward, "OFF" for Offload).
const char* typeName(ActionType t);

/// The text form, e.g. "F1.3", "SA1.3>4" (Note [Action text form]).
std::string toString(const Action& a);

/// Parses one token. Throws pipefb::UserError naming the token and the allowed forms.
Action parseAction(const std::string& token);

}  // namespace pipefb::schedules
