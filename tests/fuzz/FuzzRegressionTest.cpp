// Every input a fuzzer in fuzz/ once crashed on (fuzz/regressions/<target>/) goes
// through its parser here, in the plain and the ASan+UBSan test builds: it must parse
// or give pipefb::UserError, never another exception (and, under the sanitizers, no
// memory error or UB). The fuzzers themselves also check round trips; these tests pin
// the inputs that found bugs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "pipefb/common/Error.h"
#include "pipefb/config/Config.h"
#include "pipefb/planner/PlanFile.h"
#include "pipefb/schedules/Schedule.h"
#include "pipefb/schedules/Validator.h"

namespace fs = std::filesystem;

namespace {

std::vector<fs::path> inputsOf(const std::string& target) {
  std::vector<fs::path> out;
  fs::path dir = fs::path(PIPEFB_SOURCE_DIR) / "fuzz" / "regressions" / target;
  if (fs::exists(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file()) out.push_back(e.path());
  return out;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `parse` on every regression input of `target`; returns how many there were.
size_t checkAll(const std::string& target, const std::function<void(const std::string&)>& parse) {
  auto inputs = inputsOf(target);
  for (const auto& p : inputs) {
    SCOPED_TRACE(p.string());
    try {
      parse(slurp(p));
    } catch (const pipefb::UserError&) {
      // bad input, reported as such: fine
    } catch (const std::exception& e) {
      ADD_FAILURE() << "escaped the parser: " << e.what();
    }
  }
  return inputs.size();
}

}  // namespace

TEST(FuzzRegression, Config) {
  // Same input split as fuzz/ConfigFuzzer.cpp: YAML, then after a NUL the --set lines.
  size_t n = checkAll("config", [](const std::string& input) {
    auto nul = input.find('\0');
    std::vector<std::string> overrides;
    if (nul != std::string::npos) {
      std::istringstream rest(input.substr(nul + 1));
      for (std::string line; std::getline(rest, line);) overrides.push_back(line);
    }
    pipefb::config::Config c = pipefb::config::parseConfig(input.substr(0, nul), overrides);
    pipefb::config::parseConfig(pipefb::config::toYaml(c));
  });
  EXPECT_GE(n, 1u);  // the non-scalar key input ConfigFuzzer found
}

TEST(FuzzRegression, Schedule) {
  checkAll("schedule", [](const std::string& text) {
    auto s = pipefb::schedules::parseSchedule(text, "<regression>");
    pipefb::schedules::validate(s);
  });
}

TEST(FuzzRegression, Plan) {
  checkAll("plan",
           [](const std::string& text) { pipefb::planner::parsePlan(text, "<regression>"); });
}
