#pragma once
// What a byte of device memory is for. Shared by the tracking allocator
// (pipefb/memory), the simulator and the planner, so it stays free of LibTorch.
// Strings are the config/report spelling: "weights", "optimizer_state", ...
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "pipefb/common/Error.h"

namespace pipefb {

enum class MemoryCategory : unsigned char {
  Weights = 0,     // parameters (and buffers) of the stages a device holds
  Grads,           // parameter gradients
  OptimizerState,  // e.g. Adam's exp_avg / exp_avg_sq, momentum buffers
  Stash,           // what B(s,m) needs from F(s,m): saved activations or stage inputs
  WeightVersions,  // older weight copies kept by asynchronous schedules
  WorkingSet,      // transient tensors of the running action (also the default)
  CommBuffers,     // activations/gradients in flight between devices
};

inline constexpr std::size_t kNumMemoryCategories = 7;

inline constexpr std::array<MemoryCategory, kNumMemoryCategories> kAllMemoryCategories = {
    MemoryCategory::Weights,    MemoryCategory::Grads,          MemoryCategory::OptimizerState,
    MemoryCategory::Stash,      MemoryCategory::WeightVersions, MemoryCategory::WorkingSet,
    MemoryCategory::CommBuffers};

/// Bytes per category, indexed by index(MemoryCategory): the tracking allocator's live and
/// peak bytes, the simulator's samples and the planner's estimates all use this one type.
using CategoryBytes = std::array<std::int64_t, kNumMemoryCategories>;

inline constexpr std::size_t index(MemoryCategory c) { return static_cast<std::size_t>(c); }

inline const char* toString(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::Weights:
      return "weights";
    case MemoryCategory::Grads:
      return "grads";
    case MemoryCategory::OptimizerState:
      return "optimizer_state";
    case MemoryCategory::Stash:
      return "stash";
    case MemoryCategory::WeightVersions:
      return "weight_versions";
    case MemoryCategory::WorkingSet:
      return "working_set";
    case MemoryCategory::CommBuffers:
      return "comm_buffers";
  }
  return "?";
}

/// "stash" -> Stash. nullopt for anything else (exact, lower-case spelling).
inline std::optional<MemoryCategory> parseMemoryCategory(std::string_view text) {
  for (MemoryCategory c : kAllMemoryCategories)
    if (text == toString(c)) return c;
  return std::nullopt;
}

/// Like parseMemoryCategory, but a bad name is a UserError naming what is allowed.
inline MemoryCategory memoryCategoryFromString(std::string_view text) {
  if (auto c = parseMemoryCategory(text)) return *c;
  std::string allowed;
  for (MemoryCategory c : kAllMemoryCategories) {
    if (!allowed.empty()) allowed += ", ";
    allowed += toString(c);
  }
  throw UserError("unknown memory category '" + std::string(text) + "'; allowed: " + allowed);
}

}  // namespace pipefb
