#include "pipefb/schedules/ScheduleKind.h"

#include "pipefb/common/Error.h"
#include "pipefb/common/Suggest.h"

namespace pipefb::schedules {

const std::vector<ScheduleKindInfo>& scheduleKinds() {
  // Note [Adding a schedule kind]: one row per enumerator, in enum order.
  using P = DefaultPlacement;
  //                                                               async  step/mb I/W
  static const std::vector<ScheduleKindInfo> kinds = {
      {ScheduleKind::GPipe, "gpipe", P::SameDevice, false, false, false},
      {ScheduleKind::OneFOneB, "1f1b", P::SameDevice, false, false, false},
      {ScheduleKind::PipeDream, "pipedream", P::SameDevice, true, true, false},
      {ScheduleKind::PipeFbSync, "pipefb-sync", P::PipeFb, false, false, false},
      {ScheduleKind::PipeFbAsync, "pipefb-async", P::PipeFb, true, false, false},
      {ScheduleKind::ZbH1, "zb-h1", P::SameDevice, false, false, true},
      {ScheduleKind::ZbH2, "zb-h2", P::SameDevice, false, false, true},
      {ScheduleKind::Zbv, "zbv", P::VShape, false, false, true},
      {ScheduleKind::Interleaved1F1B, "interleaved-1f1b", P::Looped, false, false, false},
      {ScheduleKind::PipeFbZb, "pipefb-zb", P::PipeFb, false, false, true},
  };
  return kinds;
}

const ScheduleKindInfo& info(ScheduleKind k) {
  const auto& all = scheduleKinds();
  const auto i = static_cast<size_t>(k);
  PIPEFB_ASSERT(i < all.size() && all[i].kind == k, "scheduleKinds() is in enum order");
  return all[i];
}

const char* toString(ScheduleKind k) { return info(k).name; }

std::vector<std::string> scheduleKindNames() {
  std::vector<std::string> names;
  for (const auto& row : scheduleKinds()) names.push_back(row.name);
  return names;
}

bool findScheduleKind(const std::string& name, ScheduleKind& out) {
  for (const auto& row : scheduleKinds())
    if (name == row.name) {
      out = row.kind;
      return true;
    }
  return false;
}

ScheduleKind parseScheduleKind(const std::string& name) {
  ScheduleKind k{};
  if (findScheduleKind(name, k)) return k;
  const auto names = scheduleKindNames();
  throw UserError("unknown schedule '" + name + "'" + didYouMean(name, names) +
                  "; allowed: " + joinAllowed(names));
}

}  // namespace pipefb::schedules
