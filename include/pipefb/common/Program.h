#pragma once
// The exit-code convention every pipefb program shares (README, "Programs"):
//   0  success
//   2  bad input: a flag (CLI11), a config key, a file (pipefb::UserError), with
//      one line on stderr naming it (a ScheduleError adds its grid below)
//   1  anything else (out of memory under a budget, a numerical fault, a bug)
#include <CLI/CLI.hpp>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "pipefb/common/Error.h"

namespace pipefb {

/// The flags every config-driven program takes: --config FILE (required) and
/// repeatable --set section.key=value overrides.
inline void addConfigOptions(CLI::App& app, std::string& configPath,
                             std::vector<std::string>& overrides) {
  app.add_option("--config,-c", configPath, "YAML config file (e.g. configs/vgg16.yaml)")
      ->required();
  app.add_option("--set,-s", overrides, "override a key: --set training.lr=0.1 (repeatable)");
}

/// Parses argv into `app`, then runs `body` and returns the exit code it gives,
/// mapping exceptions to the codes above. `name` prefixes every error line.
inline int runProgram(const std::string& name, CLI::App& app, int argc, char** argv,
                      const std::function<int()>& body) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << name << ": error: " << e.what() << " (see --help)\n";
    return 2;
  }
  try {
    return body();
  } catch (const UserError& e) {
    std::string what = e.what();
    std::cerr << name << ": error: " << what << (what.empty() || what.back() != '\n' ? "\n" : "");
    return 2;
  } catch (const std::exception& e) {
    std::cerr << name << ": failed: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace pipefb
