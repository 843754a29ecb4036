#pragma once
// A NaN or Inf in a loss, an activation or a gradient (training.check_numerics).
//
// Note [Numerics check]
// `loss` (the default) checks each microbatch's loss: the trainer reads it as a double
// anyway, so the check costs nothing, and almost every blow-up reaches the loss within
// the same step. `all` also checks every stage output of F and every gradient of B
// (one isfinite pass over each tensor, about one extra read of the activations and
// gradients), which names the first stage that went bad instead of the last one.
// `off` checks nothing. The error names the stage, the microbatch and the step; the
// trainer adds the last good checkpoint, which it never overwrites afterwards.
#include <cstdint>
#include <stdexcept>
#include <string>

namespace pipefb {

class NumericalError : public std::runtime_error {
 public:
  /// what: "loss", "activation", "gradient of <name>"; value: "nan", "inf" or "-inf".
  /// step is 1-based (the optimizer step being computed), microbatch 0-based within it.
  NumericalError(std::string what, std::string value, int64_t step, int stage, int microbatch,
                 int microbatches, std::string hint = "")
      : std::runtime_error(format(what, value, step, stage, microbatch, microbatches, hint)),
        what_(std::move(what)),
        value_(std::move(value)),
        step_(step),
        stage_(stage),
        microbatch_(microbatch) {}

  const std::string& kind() const { return what_; }
  const std::string& value() const { return value_; }
  int64_t step() const { return step_; }
  int stage() const { return stage_; }
  int microbatch() const { return microbatch_; }

  static std::string format(const std::string& what, const std::string& value, int64_t step,
                            int stage, int microbatch, int microbatches, const std::string& hint) {
    return "non-finite " + what + " (" + value + ") at step " + std::to_string(step) + ", stage " +
           std::to_string(stage) + ", microbatch " + std::to_string(microbatch) + " of " +
           std::to_string(microbatches) +
           (hint.empty() ? std::string("; lower training.lr or check the data") : "; " + hint);
  }

 private:
  std::string what_;
  std::string value_;
  int64_t step_;
  int stage_;
  int microbatch_;
};

}  // namespace pipefb
