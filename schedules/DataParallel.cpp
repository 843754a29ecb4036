#include "pipefb/schedules/DataParallel.h"

namespace pipefb::schedules {

Schedule addAllReduce(const Schedule& schedule) {
  Schedule out = schedule;
  for (auto& list : out.devices) {
    std::vector<Action> next;
    next.reserve(list.size() * 2);
    size_t covered = 0;  // the STEPs before this index have their AR already
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].type == ActionType::Step && i >= covered) {
        // Note [All-reduces before the steps] (DataParallel.h)
        for (covered = i; covered < list.size(); ++covered) {
          const Action& b = list[covered];
          if (b.isCompute() || b.isRecv()) break;
          if (b.type == ActionType::Step) next.push_back(allReduce(b.stage, b.index));
        }
      }
      next.push_back(list[i]);
    }
    list = std::move(next);
  }
  return out;
}

}  // namespace pipefb::schedules
