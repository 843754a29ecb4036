// pipefb_report RUN_DIR: (re)builds memory.json, charts/*.svg and report.html of a
// run folder. Exit codes: Note in pipefb/common/Program.h.
#include <iostream>

#include "pipefb/common/Program.h"
#include "pipefb/report/Report.h"

int main(int argc, char** argv) {
  CLI::App app{"Builds the peak-memory report (report.html, memory.json, charts) of a run folder"};
  std::string runDir;
  pipefb::report::ReportOptions options;
  app.add_option("run_dir", runDir, "the run folder (output.dir of a pipefb_train run)")
      ->required();
  app.add_option("--gnuplot", options.gnuplot, "the gnuplot program");
  app.add_option("--plan", options.plan,
                 "a pipefb_plan plan file for the predicted columns (default: RUN_DIR/plan.yaml)");
  return pipefb::runProgram("pipefb_report", app, argc, argv, [&] {
    auto r = pipefb::report::writeReport(runDir, options);
    std::cout << r.html << "\n" << r.memoryJson << "\n";
    for (const auto& w : r.warnings) std::cout << "warning: " << w << "\n";
    return 0;
  });
}
