#include "pipefb/schedules/ScheduleKind.h"

#include <iterator>

#include "pipefb/common/Error.h"
#include "pipefb/common/Suggest.h"

namespace pipefb::schedules {

namespace detail {
// Note [Adding a schedule kind]: one row per enumerator, in enum order.
//                                                                      async  step/mb I/W
const ScheduleKindInfo kScheduleKindRows[] = {
    {ScheduleKind::GPipe, "gpipe", DefaultPlacement::SameDevice, false, false, false},
    {ScheduleKind::OneFOneB, "1f1b", DefaultPlacement::SameDevice, false, false, false},
    {ScheduleKind::PipeDream, "pipedream", DefaultPlacement::SameDevice, true, true, false},
    {ScheduleKind::PipeFbSync, "pipefb-sync", DefaultPlacement::PipeFb, false, false, false},
    {ScheduleKind::PipeFbAsync, "pipefb-async", DefaultPlacement::PipeFb, true, false, false},
    {ScheduleKind::ZbH1, "zb-h1", DefaultPlacement::SameDevice, false, false, true},
    {ScheduleKind::ZbH2, "zb-h2", DefaultPlacement::SameDevice, false, false, true},
    {ScheduleKind::Zbv, "zbv", DefaultPlacement::VShape, false, false, true},
    {ScheduleKind::Interleaved1F1B, "interleaved-1f1b", DefaultPlacement::Looped, false, false,
     false},
    {ScheduleKind::PipeFbZb, "pipefb-zb", DefaultPlacement::PipeFb, false, false, true},
    {ScheduleKind::InterleavedZb, "interleaved-zb", DefaultPlacement::Looped, false, false, true},
};
}  // namespace detail

const std::vector<ScheduleKindInfo>& scheduleKinds() {
  static const std::vector<ScheduleKindInfo> kinds = [] {
    std::vector<ScheduleKindInfo> rows(std::begin(detail::kScheduleKindRows),
                                       std::end(detail::kScheduleKindRows));
    for (size_t i = 0; i < rows.size(); ++i)
      PIPEFB_ASSERT(static_cast<size_t>(rows[i].kind) == i, "scheduleKinds() is in enum order");
    return rows;
  }();
  return kinds;
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
