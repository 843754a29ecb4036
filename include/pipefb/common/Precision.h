#pragma once
// Training precision (training.precision; issue 36). Torch-free: the planner, the
// simulator and the runtime share it.
//
// Note [Half-precision training]
// What a device holds at bf16 or fp16, as the analytic planner charges it (the half-copy
// model of Megatron's and DeepSpeed's bf16). The runtime runs autocast instead (Note
// [Autocast] in model/Model.h), so pipefb_train refuses a plan made on this model; a plan
// on a profile measured at bf16 runs:
//  - weights: the fp32 master copy (4 bytes a parameter) and a half copy that F and B run
//    on (2 bytes), made from the master after each step. A split stage's forward device
//    holds the half copy only; with the optimizer in the host pool a backward device holds
//    the half copy and half gradients, the host the rest (Note [Half-precision weights on
//    a device] in planner/CostModel.h);
//  - .grad: fp32 (4 bytes a parameter), where each microbatch's half gradient is added;
//    B's fresh gradients are half (2 bytes);
//  - optimizer states and the step's temporaries: fp32, as at fp32;
//  - activations, saved tensors, stashes and messages between stages: half (2 bytes an
//    element), but for what stays at its width: int64 indices and token ids, the model's
//    input as the data loader gives it (fp32 images), and the loss: the head's
//    log-softmax and its gradient are fp32 (as torch.autocast runs log_softmax and
//    cross-entropy).
// FLOPs run at the device spec's bf16_flops or fp16_flops (tensor cores); a device
// without one cannot plan at that precision.
#include <optional>
#include <string>

#include "pipefb/common/Error.h"

namespace pipefb {

enum class Precision { FP32, BF16, FP16 };

inline const char* toString(Precision p) {
  switch (p) {
    case Precision::FP32:
      return "fp32";
    case Precision::BF16:
      return "bf16";
    case Precision::FP16:
      return "fp16";
  }
  return "fp32";
}

inline std::optional<Precision> parsePrecision(const std::string& s) {
  if (s == "fp32") return Precision::FP32;
  if (s == "bf16") return Precision::BF16;
  if (s == "fp16") return Precision::FP16;
  return std::nullopt;
}

/// A file's `precision:` value; a UserError naming `source` and the allowed values otherwise.
inline Precision precisionIn(const std::string& text, const std::string& source) {
  const auto p = parsePrecision(text);
  if (!p) throw UserError(source + ": precision: '" + text + "'; allowed: fp32, bf16, fp16");
  return *p;
}

/// Note [Loss scaling] (train/LossScaler.h): the UserError text for fp16 on a pipeline whose
/// stages cannot agree on each step before any takes it, or "" when they can.
inline std::string fp16Refusal(const std::string& source, bool async, const std::string& schedule) {
  if (!async) return "";
  const std::string why =
      "pipeline.schedule " + schedule + " steps each stage once per microbatch, on its own";
  return source +
         ": training.precision: fp16 needs every stage to agree on a step before any "
         "stage takes it (Note [Loss scaling]), and " +
         why + "; agreeing there is not built yet; allowed with it: fp32, bf16";
}

/// Bytes of one activation element (Note [Half-precision training]).
inline int activationBytes(Precision p) { return p == Precision::FP32 ? 4 : 2; }

}  // namespace pipefb
