// Profile files (ProfileFile.h; format in docs/planner.md, "Profile files").
#include "pipefb/planner/ProfileFile.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "pipefb/common/AtomicFile.h"
#include "pipefb/common/Error.h"

namespace pipefb::planner {

// Note [Profile method]: what the profiler measures changes now and then (the loss in the
// last layer's working set, B's fresh parameter gradients, B accumulating them into .grad
// in place as the runtime's B on the master does, and gathered beside, since method 3; the
// output bytes the layer's own graph keeps, since method 4; the input bytes it keeps,
// since method 5; the loss a recomputing last stage's B takes in its graph,
// recomputed_loss_bytes, since method 6; each pass's fixed time, from a second
// microbatch size, since method 7, Note [Microbatch scaling] in LayerCost.h; the part of
// B's working sets that does not scale, working_fixed_bytes and
// gathered_working_fixed_bytes, and every byte at the other microbatch sizes, bytes_at,
// since method 8, Notes [Parameter-sized working sets], [Bytes at every microbatch]; B
// adding linear layers' weight gradients straight into .grad, no longer in the working
// sets' fixed part, since method 9, Note [Weight gradients into .grad] in model/Model.h;
// what a split backward's I keeps for its W, kept_grad_bytes, since method 10); a
// profile cached by an older
// pipefb_profile would then plan on other numbers. The method's number
// is part of the cache key, so a cached profile of an older method is measured again. Raise it
// whenever measureProfile changes what a field holds.
constexpr int kProfileMethod = 10;

LayerBytes bytesOf(const LayerCost& c) {
  LayerBytes b;
  b.outputBytes = c.outputBytes;
  b.savedBytes = c.savedBytes;
  b.savedOutputBytes = c.savedOutputBytes;
  b.savedInputBytes = c.savedInputBytes;
  b.workingBytes = c.workingBytes;
  b.gatheredWorkingBytes = c.gatheredWorkingBytes;
  b.forwardWorkingBytes = c.forwardWorkingBytes;
  b.noGradForwardBytes = c.noGradForwardBytes;
  b.keptGradBytes = c.keptGradBytes;
  return b;
}

std::optional<Profile> profileAt(const Profile& p, std::int64_t microbatch) {
  if (microbatch == p.microbatch) return p;
  const auto e = std::find_if(p.bytesAt.begin(), p.bytesAt.end(),
                              [&](const MeasuredBytes& m) { return m.microbatch == microbatch; });
  if (e == p.bytesAt.end()) return std::nullopt;
  Profile q = p;
  q.bytesAt.clear();
  q.microbatch = microbatch;
  q.inputBytes = e->inputBytes;
  q.targetBytes = e->targetBytes;
  q.lossWorkingBytes = e->lossWorkingBytes;
  q.recomputedLossBytes = e->recomputedLossBytes;
  const double f = static_cast<double>(microbatch) / static_cast<double>(p.microbatch);
  for (size_t l = 0; l < q.layers.size(); ++l) {
    LayerCost& c = q.layers[l];
    const LayerBytes& b = e->layers.at(l);
    // The times as ever (Note [Microbatch scaling]); B after a step keeps its excess, which
    // is parameter-sized (Note [Backward after a step] in CostModel.h).
    const double backward = scaledTime(c.backward, c.backwardFixed, f);
    if (c.backwardAfterStep > 0) c.backwardAfterStep += backward - c.backward;
    c.forward = scaledTime(c.forward, c.forwardFixed, f);
    c.backward = backward;
    c.recompute = scaledTime(c.recompute, c.recomputeFixed, f);
    c.outputBytes = b.outputBytes;
    c.savedBytes = b.savedBytes;
    c.savedOutputBytes = b.savedOutputBytes;
    c.savedInputBytes = b.savedInputBytes;
    c.workingBytes = b.workingBytes;
    c.gatheredWorkingBytes = b.gatheredWorkingBytes;
    c.forwardWorkingBytes = b.forwardWorkingBytes;
    c.noGradForwardBytes = b.noGradForwardBytes;
    c.keptGradBytes = b.keptGradBytes;
    c.workingFixedBytes = std::min(c.workingFixedBytes, c.workingBytes);
    c.gatheredWorkingFixedBytes =
        std::min(c.gatheredWorkingFixedBytes,
                 c.gatheredWorkingBytes >= 0 ? c.gatheredWorkingBytes : c.workingBytes);
  }
  return q;
}

std::string profileKey(const Profile& p) {
  return p.model + " | microbatch=" + std::to_string(p.microbatch) + " | device=" + p.device +
         " | method=" + std::to_string(kProfileMethod);
}

std::string profileToYaml(const Profile& p) {
  std::ostringstream o;
  o << std::setprecision(9);
  o << "# pipefb profile: per layer at `microbatch` samples; times in seconds (medians after\n"
       "# warm-up when measured), bytes per microbatch (states per model).\n";
  o << "key: \"" << profileKey(p) << "\"\n";
  o << "model: \"" << p.model << "\"\n";
  o << "device: \"" << p.device << "\"\n";
  o << "source: " << p.source << "\n";
  if (p.precision != Precision::FP32) o << "precision: " << toString(p.precision) << "\n";
  o << "microbatch: " << p.microbatch << "\n";
  o << "input_bytes: " << p.inputBytes << "\n";
  o << "target_bytes: " << p.targetBytes << "\n";
  o << "loss_working_bytes: " << p.lossWorkingBytes << "\n";
  o << "recomputed_loss_bytes: " << p.recomputedLossBytes << "\n";
  o << "layers:\n";
  for (const auto& l : p.layers) {
    o << "  - {name: \"" << l.name << "\", forward: " << l.forward << ", backward: " << l.backward
      << ", recompute: " << l.recompute << ", forward_fixed: " << l.forwardFixed
      << ", backward_fixed: " << l.backwardFixed << ", recompute_fixed: " << l.recomputeFixed
      << ", step: " << l.step << ", output_bytes: " << l.outputBytes
      << ", saved_bytes: " << l.savedBytes << ", saved_output_bytes: " << l.savedOutputBytes
      << ", saved_input_bytes: " << l.savedInputBytes << ", working_bytes: " << l.workingBytes
      << ", gathered_working_bytes: " << l.gatheredWorkingBytes
      << ", working_fixed_bytes: " << l.workingFixedBytes
      << ", gathered_working_fixed_bytes: " << l.gatheredWorkingFixedBytes
      << ", param_bytes: " << l.paramBytes << ", grad_bytes: " << l.gradBytes
      << ", optimizer_bytes: " << l.optimizerBytes << ", step_working_bytes: " << l.stepWorkingBytes
      << ", backward_after_step: " << l.backwardAfterStep << ", snapshot: " << l.snapshot
      << ", forward_working_bytes: " << l.forwardWorkingBytes
      << ", no_grad_forward_bytes: " << l.noGradForwardBytes << ", buffer_bytes: " << l.bufferBytes;
    if (l.halfCopyBytes > 0) o << ", half_copy_bytes: " << l.halfCopyBytes;
    if (l.keptGradBytes >= 0) o << ", kept_grad_bytes: " << l.keptGradBytes;
    o << "}\n";
  }
  // Note [Bytes at every microbatch] in LayerCost.h.
  if (!p.bytesAt.empty()) o << "bytes_at:\n";
  for (const MeasuredBytes& m : p.bytesAt) {
    o << "  - microbatch: " << m.microbatch << "\n    input_bytes: " << m.inputBytes
      << "\n    target_bytes: " << m.targetBytes
      << "\n    loss_working_bytes: " << m.lossWorkingBytes
      << "\n    recomputed_loss_bytes: " << m.recomputedLossBytes << "\n    layers:\n";
    for (const LayerBytes& b : m.layers)
      o << "      - {output_bytes: " << b.outputBytes << ", saved_bytes: " << b.savedBytes
        << ", saved_output_bytes: " << b.savedOutputBytes
        << ", saved_input_bytes: " << b.savedInputBytes << ", working_bytes: " << b.workingBytes
        << ", gathered_working_bytes: " << b.gatheredWorkingBytes
        << ", forward_working_bytes: " << b.forwardWorkingBytes
        << ", no_grad_forward_bytes: " << b.noGradForwardBytes
        << (b.keptGradBytes >= 0 ? ", kept_grad_bytes: " + std::to_string(b.keptGradBytes) : "")
        << "}\n";
  }
  return o.str();
}

Profile parseProfile(const std::string& yaml, const std::string& source) {
  Profile p;
  try {
    YAML::Node n = YAML::Load(yaml);
    p.model = n["model"].as<std::string>();
    p.device = n["device"].as<std::string>();
    p.source = n["source"] ? n["source"].as<std::string>() : "measured";
    if (n["precision"]) {  // Note [Autocast]; absent: fp32
      p.precision = precisionIn(n["precision"].as<std::string>(), source);
    }
    p.microbatch = n["microbatch"].as<std::int64_t>();
    p.inputBytes = n["input_bytes"] ? n["input_bytes"].as<std::int64_t>() : 0;
    p.targetBytes = n["target_bytes"] ? n["target_bytes"].as<std::int64_t>() : 0;
    p.lossWorkingBytes = n["loss_working_bytes"] ? n["loss_working_bytes"].as<std::int64_t>() : 0;
    p.recomputedLossBytes =
        n["recomputed_loss_bytes"] ? n["recomputed_loss_bytes"].as<std::int64_t>() : 0;
    for (const auto& l : n["layers"]) {
      LayerCost c;
      c.name = l["name"].as<std::string>();
      c.forward = l["forward"].as<double>();
      c.backward = l["backward"].as<double>();
      c.recompute = l["recompute"] ? l["recompute"].as<double>() : c.forward;
      // Older profiles (method < 7): 0, every time scales (Note [Microbatch scaling]).
      c.forwardFixed = l["forward_fixed"] ? l["forward_fixed"].as<double>() : 0;
      c.backwardFixed = l["backward_fixed"] ? l["backward_fixed"].as<double>() : 0;
      c.recomputeFixed = l["recompute_fixed"] ? l["recompute_fixed"].as<double>() : 0;
      c.step = l["step"] ? l["step"].as<double>() : 0;
      c.outputBytes = l["output_bytes"].as<std::int64_t>();
      c.savedBytes = l["saved_bytes"].as<std::int64_t>();
      c.savedOutputBytes = l["saved_output_bytes"] ? l["saved_output_bytes"].as<std::int64_t>() : 0;
      c.savedInputBytes = l["saved_input_bytes"] ? l["saved_input_bytes"].as<std::int64_t>() : 0;
      c.workingBytes = l["working_bytes"] ? l["working_bytes"].as<std::int64_t>() : 0;
      c.paramBytes = l["param_bytes"].as<std::int64_t>();
      c.gradBytes = l["grad_bytes"] ? l["grad_bytes"].as<std::int64_t>() : c.paramBytes;
      c.optimizerBytes = l["optimizer_bytes"] ? l["optimizer_bytes"].as<std::int64_t>() : 0;
      c.halfCopyBytes = l["half_copy_bytes"] ? l["half_copy_bytes"].as<std::int64_t>() : 0;
      c.stepWorkingBytes = l["step_working_bytes"] ? l["step_working_bytes"].as<std::int64_t>() : 0;
      c.backwardAfterStep = l["backward_after_step"] ? l["backward_after_step"].as<double>() : 0;
      c.snapshot = l["snapshot"] ? l["snapshot"].as<double>() : 0;
      c.forwardWorkingBytes =
          l["forward_working_bytes"] ? l["forward_working_bytes"].as<std::int64_t>() : -1;
      c.gatheredWorkingBytes =
          l["gathered_working_bytes"] ? l["gathered_working_bytes"].as<std::int64_t>() : -1;
      c.noGradForwardBytes =
          l["no_grad_forward_bytes"] ? l["no_grad_forward_bytes"].as<std::int64_t>() : -1;
      c.keptGradBytes = l["kept_grad_bytes"] ? l["kept_grad_bytes"].as<std::int64_t>() : -1;
      // Older profiles (method < 8): 0, B's working sets scale whole (Note
      // [Parameter-sized working sets] in LayerCost.h).
      c.workingFixedBytes =
          l["working_fixed_bytes"] ? l["working_fixed_bytes"].as<std::int64_t>() : 0;
      c.gatheredWorkingFixedBytes = l["gathered_working_fixed_bytes"]
                                        ? l["gathered_working_fixed_bytes"].as<std::int64_t>()
                                        : 0;
      const std::int64_t gathered =
          c.gatheredWorkingBytes >= 0 ? c.gatheredWorkingBytes : c.workingBytes;
      if (c.workingFixedBytes < 0 || c.workingFixedBytes > c.workingBytes ||
          c.gatheredWorkingFixedBytes < 0 || c.gatheredWorkingFixedBytes > gathered)
        throw UserError(source + ": layer " + c.name +
                        ": working_fixed_bytes and gathered_working_fixed_bytes must be between "
                        "0 and working_bytes and gathered_working_bytes");
      c.bufferBytes = l["buffer_bytes"] ? l["buffer_bytes"].as<std::int64_t>() : 0;
      p.layers.push_back(c);
    }
    for (const auto& m : n["bytes_at"]) {  // Note [Bytes at every microbatch]
      MeasuredBytes mb;
      mb.microbatch = m["microbatch"].as<std::int64_t>();
      mb.inputBytes = m["input_bytes"].as<std::int64_t>();
      mb.targetBytes = m["target_bytes"].as<std::int64_t>();
      mb.lossWorkingBytes = m["loss_working_bytes"].as<std::int64_t>();
      mb.recomputedLossBytes = m["recomputed_loss_bytes"].as<std::int64_t>();
      for (const auto& l : m["layers"]) {
        LayerBytes b;
        b.outputBytes = l["output_bytes"].as<std::int64_t>();
        b.savedBytes = l["saved_bytes"].as<std::int64_t>();
        b.savedOutputBytes = l["saved_output_bytes"].as<std::int64_t>();
        b.savedInputBytes = l["saved_input_bytes"].as<std::int64_t>();
        b.workingBytes = l["working_bytes"].as<std::int64_t>();
        b.gatheredWorkingBytes = l["gathered_working_bytes"].as<std::int64_t>();
        b.forwardWorkingBytes = l["forward_working_bytes"].as<std::int64_t>();
        b.noGradForwardBytes = l["no_grad_forward_bytes"].as<std::int64_t>();
        b.keptGradBytes = l["kept_grad_bytes"] ? l["kept_grad_bytes"].as<std::int64_t>() : -1;
        mb.layers.push_back(b);
      }
      if (mb.microbatch < 1 || mb.layers.size() != p.layers.size())
        throw UserError(source + ": bytes_at: microbatch " + std::to_string(mb.microbatch) +
                        " with " + std::to_string(mb.layers.size()) +
                        " layers; allowed: a microbatch >= 1 and one entry per layer (" +
                        std::to_string(p.layers.size()) + ")");
      p.bytesAt.push_back(std::move(mb));
    }
  } catch (const YAML::Exception& e) {
    throw UserError(source + ": malformed profile file: " + e.what());
  }
  if (p.layers.empty()) throw UserError(source + ": profile file without layers");
  if (p.microbatch < 1) throw UserError(source + ": microbatch must be >= 1");
  return p;
}

void writeProfileFile(const std::string& path, const Profile& p) {
  // Atomic: pipefb_train fills the cache on first use, and tests or ranks may race.
  writeFileAtomically(path, profileToYaml(p));
}

Profile readProfileFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UserError("profile file '" + path + "' cannot be read (does it exist?)");
  std::stringstream ss;
  ss << in.rdbuf();
  return parseProfile(ss.str(), path);
}

}  // namespace pipefb::planner
