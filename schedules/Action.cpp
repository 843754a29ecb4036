#include "pipefb/schedules/Action.h"

#include <cctype>
#include <limits>

#include "pipefb/common/Error.h"

namespace pipefb::schedules {

namespace {
Action make(ActionType t, int stage, int index, int peer = -1) {
  Action a;
  a.type = t;
  a.stage = stage;
  a.index = index;
  a.peer = peer;
  return a;
}
Action makeStash(ActionType t, int stage, int index, StashKind kind) {
  Action a = make(t, stage, index);
  a.stash = kind;
  return a;
}
}  // namespace

Action F(int stage, int mb) { return make(ActionType::Forward, stage, mb); }
Action B(int stage, int mb, bool recompute) {
  Action a = make(ActionType::Backward, stage, mb);
  a.recompute = recompute;
  return a;
}
Action I(int stage, int mb, bool recompute) {
  Action a = make(ActionType::InputGrad, stage, mb);
  a.recompute = recompute;
  return a;
}
Action W(int stage, int mb) { return make(ActionType::WeightGrad, stage, mb); }
Action sendAct(int stage, int mb, int peer) { return make(ActionType::SendAct, stage, mb, peer); }
Action recvAct(int stage, int mb, int peer) { return make(ActionType::RecvAct, stage, mb, peer); }
Action sendGrad(int stage, int mb, int peer) { return make(ActionType::SendGrad, stage, mb, peer); }
Action recvGrad(int stage, int mb, int peer) { return make(ActionType::RecvGrad, stage, mb, peer); }
Action offload(int stage, int index, StashKind kind) {
  return makeStash(ActionType::Offload, stage, index, kind);
}
Action prefetch(int stage, int index, StashKind kind) {
  return makeStash(ActionType::Prefetch, stage, index, kind);
}
Action drop(int stage, int index, StashKind kind) {
  return makeStash(ActionType::Drop, stage, index, kind);
}
Action step(int stage, int n) { return make(ActionType::Step, stage, n); }
Action syncWeights(int stage, int n, int peer) {
  return make(ActionType::SyncWeights, stage, n, peer);
}
Action recvWeights(int stage, int n, int peer) {
  return make(ActionType::RecvWeights, stage, n, peer);
}
Action allReduce(int stage, int n) { return make(ActionType::AllReduce, stage, n); }

ActionType matchingType(ActionType t) {
  switch (t) {
    case ActionType::SendAct:
      return ActionType::RecvAct;
    case ActionType::RecvAct:
      return ActionType::SendAct;
    case ActionType::SendGrad:
      return ActionType::RecvGrad;
    case ActionType::RecvGrad:
      return ActionType::SendGrad;
    case ActionType::SyncWeights:
      return ActionType::RecvWeights;
    case ActionType::RecvWeights:
      return ActionType::SyncWeights;
    case ActionType::Forward:
    case ActionType::Backward:
    case ActionType::Offload:
    case ActionType::Prefetch:
    case ActionType::Drop:
    case ActionType::Step:
    case ActionType::AllReduce:
    case ActionType::InputGrad:
    case ActionType::WeightGrad:
      break;
  }
  PIPEFB_ASSERT(false, "matchingType of a non-communication action " << typeName(t));
}

const char* typeName(ActionType t) {
  switch (t) {
    case ActionType::Forward:
      return "F";
    case ActionType::Backward:
      return "B";
    case ActionType::SendAct:
      return "SA";
    case ActionType::RecvAct:
      return "RA";
    case ActionType::SendGrad:
      return "SG";
    case ActionType::RecvGrad:
      return "RG";
    case ActionType::Offload:
      return "OFF";
    case ActionType::Prefetch:
      return "PRE";
    case ActionType::Drop:
      return "DROP";
    case ActionType::Step:
      return "STEP";
    case ActionType::SyncWeights:
      return "SW";
    case ActionType::RecvWeights:
      return "RW";
    case ActionType::AllReduce:
      return "AR";
    case ActionType::InputGrad:
      return "I";
    case ActionType::WeightGrad:
      return "W";
  }
  return "?";
}

std::string toString(const Action& a) {
  std::string out = typeName(a.type);
  if (a.isInputBackward() && a.recompute) out += "R";
  bool stashAction =
      a.type == ActionType::Offload || a.type == ActionType::Prefetch || a.type == ActionType::Drop;
  if (stashAction && a.stash == StashKind::Weights) out += "W";
  out += std::to_string(a.stage) + "." + std::to_string(a.index);
  if (a.isSend()) out += ">" + std::to_string(a.peer);
  if (a.isRecv()) out += "<" + std::to_string(a.peer);
  return out;
}

namespace {

const char* kAllowedForms =
    "allowed: F<s>.<m>, B<s>.<m>, BR<s>.<m>, I<s>.<m>, IR<s>.<m>, W<s>.<m>, SA<s>.<m>><dev>, "
    "RA<s>.<m><<dev>, SG<s>.<m>><dev>, "
    "RG<s>.<m><<dev>, OFF[W]<s>.<i>, PRE[W]<s>.<i>, DROP[W]<s>.<i>, STEP<s>.<n>, "
    "SW<s>.<n>><dev>, RW<s>.<n><<dev>, AR<s>.<n>";

[[noreturn]] void bad(const std::string& token, const std::string& why) {
  throw UserError("bad action '" + token + "': " + why + "; " + kAllowedForms);
}

// Reads a non-negative decimal integer at pos; advances pos.
int readInt(const std::string& token, size_t& pos, const char* what) {
  size_t start = pos;
  long long v = 0;
  while (pos < token.size() && std::isdigit(static_cast<unsigned char>(token[pos]))) {
    v = v * 10 + (token[pos] - '0');
    if (v > std::numeric_limits<int32_t>::max()) bad(token, std::string(what) + " is too large");
    ++pos;
  }
  if (pos == start) bad(token, std::string("expected a number for the ") + what);
  return static_cast<int>(v);
}

}  // namespace

Action parseAction(const std::string& token) {
  // Longest prefixes first: "BR" before "B", "OFFW" before "OFF", ...
  struct Prefix {
    const char* text;
    ActionType type;
    bool recompute;
    StashKind kind;
  };
  static const Prefix prefixes[] = {
      {"OFFW", ActionType::Offload, false, StashKind::Weights},
      {"PREW", ActionType::Prefetch, false, StashKind::Weights},
      {"DROPW", ActionType::Drop, false, StashKind::Weights},
      {"OFF", ActionType::Offload, false, StashKind::Activation},
      {"PRE", ActionType::Prefetch, false, StashKind::Activation},
      {"DROP", ActionType::Drop, false, StashKind::Activation},
      {"STEP", ActionType::Step, false, StashKind::Activation},
      {"BR", ActionType::Backward, true, StashKind::Activation},
      {"SA", ActionType::SendAct, false, StashKind::Activation},
      {"RA", ActionType::RecvAct, false, StashKind::Activation},
      {"SG", ActionType::SendGrad, false, StashKind::Activation},
      {"RG", ActionType::RecvGrad, false, StashKind::Activation},
      {"SW", ActionType::SyncWeights, false, StashKind::Activation},
      {"RW", ActionType::RecvWeights, false, StashKind::Activation},
      {"AR", ActionType::AllReduce, false, StashKind::Activation},
      {"IR", ActionType::InputGrad, true, StashKind::Activation},
      {"I", ActionType::InputGrad, false, StashKind::Activation},
      {"W", ActionType::WeightGrad, false, StashKind::Activation},
      {"F", ActionType::Forward, false, StashKind::Activation},
      {"B", ActionType::Backward, false, StashKind::Activation},
  };
  if (token.empty()) bad(token, "empty token");
  const Prefix* found = nullptr;
  for (const Prefix& p : prefixes) {
    std::string pt = p.text;
    if (token.compare(0, pt.size(), pt) == 0 && token.size() > pt.size() &&
        std::isdigit(static_cast<unsigned char>(token[pt.size()]))) {
      found = &p;
      break;
    }
  }
  if (!found) bad(token, "unknown action type");
  Action a;
  a.type = found->type;
  a.recompute = found->recompute;
  a.stash = found->kind;
  size_t pos = std::string(found->text).size();
  a.stage = readInt(token, pos, "stage");
  if (pos >= token.size() || token[pos] != '.') bad(token, "expected '.' after the stage");
  ++pos;
  a.index = readInt(token, pos, "microbatch/index");
  if (a.isSend() || a.isRecv()) {
    char want = a.isSend() ? '>' : '<';
    if (pos >= token.size() || token[pos] != want)
      bad(token, std::string("expected '") + want + "<device>' after the index");
    ++pos;
    a.peer = readInt(token, pos, "peer device");
  }
  if (pos != token.size()) bad(token, "unexpected trailing text '" + token.substr(pos) + "'");
  return a;
}

}  // namespace pipefb::schedules
