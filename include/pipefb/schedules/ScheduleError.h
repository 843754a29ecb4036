#pragma once
// The error of an invalid schedule, with the step x device grid in its message
// (like PyTorch's _format_pipeline_order).
#include <string>
#include <utility>
#include <vector>

#include "pipefb/common/Error.h"
#include "pipefb/schedules/Schedule.h"

namespace pipefb::schedules {

/// (device, step index in that device's list)
using GridMark = std::pair<int, int>;

/// Thrown by validate() and by the simulator on a deadlock. A schedule may come from a
/// user's file, so this is a UserError. what() = reason + "\n" + grid.
class ScheduleError : public pipefb::UserError {
 public:
  ScheduleError(const std::string& reason, std::vector<GridMark> marks, const std::string& grid);
  const std::string& reason() const { return reason_; }
  const std::vector<GridMark>& marks() const { return marks_; }

 private:
  std::string reason_;
  std::vector<GridMark> marks_;
};

/// Rows = step index, columns = devices; marked actions print as [*B1.0*].
/// Long schedules show at most `maxRows` rows around the first mark.
std::string formatPipelineOrder(const Schedule& s, const std::vector<GridMark>& marks = {},
                                int maxRows = 40);

/// Builds the error with the grid.
ScheduleError scheduleError(const Schedule& s, const std::string& reason,
                            std::vector<GridMark> marks);

}  // namespace pipefb::schedules
