#include "pipefb/schedules/DataParallel.h"

namespace pipefb::schedules {

Schedule addAllReduce(const Schedule& schedule) {
  Schedule out = schedule;
  for (auto& list : out.devices) {
    std::vector<Action> next;
    next.reserve(list.size() * 2);
    for (const Action& a : list) {
      if (a.type == ActionType::Step) next.push_back(allReduce(a.stage, a.index));
      next.push_back(a);
    }
    list = std::move(next);
  }
  return out;
}

}  // namespace pipefb::schedules
