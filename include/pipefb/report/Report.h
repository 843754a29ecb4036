#pragma once
// The peak-memory report of a run folder (issue 7): reads summary.json,
// metrics.csv, config.yaml and trace.json, and (re)writes memory.json,
// charts/*.svg (drawn by gnuplot) and a self-contained report.html.
// docs/report.md documents the files. Torch-free.
#include <string>
#include <vector>

namespace pipefb::report {

struct ReportOptions {
  /// The gnuplot program (a subprocess; `set terminal svg`).
  std::string gnuplot = "gnuplot";
  /// Timeline points per device above which the chart keeps each bucket's maximum.
  std::size_t maxTimelinePoints = 20000;
  /// A plan file of pipefb_plan whose `predicted:` section (iteration_time,
  /// peak_memory per device) fills the predicted columns. Empty: <run>/plan.yaml if
  /// it exists.
  std::string plan;
};

struct ReportResult {
  std::string html;                   // <run>/report.html
  std::string memoryJson;             // <run>/memory.json
  std::vector<std::string> charts;    // <run>/charts/*.svg
  std::vector<std::string> warnings;  // also in memory.json and the page
};

/// Builds the report of `runDir`. A missing or malformed summary.json is a
/// UserError; a missing trace.json or metrics.csv leaves those sections empty
/// with a note. gnuplot failing (or absent) is a std::runtime_error.
ReportResult writeReport(const std::string& runDir, const ReportOptions& options = {});

}  // namespace pipefb::report
