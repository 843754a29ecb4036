#include "pipefb/schedules/ScheduleError.h"

#include <algorithm>
#include <set>
#include <sstream>

namespace pipefb::schedules {

ScheduleError::ScheduleError(const std::string& reason, std::vector<GridMark> marks,
                             const std::string& grid)
    : UserError(reason + "\n" + grid), reason_(reason), marks_(std::move(marks)) {}

std::string formatPipelineOrder(const Schedule& s, const std::vector<GridMark>& marks,
                                int maxRows) {
  std::set<GridMark> marked(marks.begin(), marks.end());
  size_t rows = 0;
  for (const auto& d : s.devices) rows = std::max(rows, d.size());
  const int D = s.numDevices();

  auto cell = [&](int d, size_t r) -> std::string {
    if (r >= s.devices[d].size()) return "";
    std::string t = toString(s.devices[d][r]);
    if (marked.count({d, static_cast<int>(r)})) t = "[*" + t + "*]";
    return t;
  };
  // Window of rows: all of them, or maxRows around the first mark.
  size_t first = 0, last = rows;
  if (maxRows > 0 && rows > static_cast<size_t>(maxRows)) {
    size_t center = marks.empty() ? 0 : static_cast<size_t>(marks.front().second);
    first = center > static_cast<size_t>(maxRows / 2) ? center - maxRows / 2 : 0;
    last = std::min(rows, first + maxRows);
    first = last - maxRows;
  }
  std::vector<size_t> width(D, 0);
  for (int d = 0; d < D; ++d) {
    width[d] = std::string("dev" + std::to_string(d)).size();
    for (size_t r = first; r < last; ++r) width[d] = std::max(width[d], cell(d, r).size());
  }
  std::ostringstream os;
  auto pad = [](const std::string& t, size_t w) { return t + std::string(w - t.size(), ' '); };
  const size_t stepW = std::max<size_t>(4, std::to_string(rows).size());
  os << pad("step", stepW);
  for (int d = 0; d < D; ++d) os << " | " << pad("dev" + std::to_string(d), width[d]);
  os << "\n";
  if (first > 0) os << "... (" << first << " earlier steps)\n";
  for (size_t r = first; r < last; ++r) {
    os << pad(std::to_string(r), stepW);
    for (int d = 0; d < D; ++d) os << " | " << pad(cell(d, r), width[d]);
    os << "\n";
  }
  if (last < rows) os << "... (" << rows - last << " later steps)\n";
  return os.str();
}

ScheduleError scheduleError(const Schedule& s, const std::string& reason,
                            std::vector<GridMark> marks) {
  std::string grid = formatPipelineOrder(s, marks);
  return ScheduleError(reason, std::move(marks), grid);
}

}  // namespace pipefb::schedules
