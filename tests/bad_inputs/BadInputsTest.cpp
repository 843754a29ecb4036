// The bad-input corpus: every file in tests/bad_inputs/*.yaml is a case with one
// fault. Its first line says `# expect: <text>`, a piece of the message.
// pipefb_train must exit 2 with exactly one line on stderr/stdout containing
// that text, and leave no run folder behind.
//
// By default the case file is the config (`pipefb_train --config CASE`). Optional
// header lines after the first one change that, for faults outside the config:
//   # copy: DIR    copies tests/bad_inputs/data/DIR into the work folder (a run folder
//                  with a broken checkpoint, say)
//   # args: ARGS   the arguments instead of `--config CASE`; @CASE@ is the case file,
//                  @WORK@ the work folder, @DATA@ tests/bad_inputs/data
//   # program: NAME  runs another pipefb program (pipefb_sim, pipefb_plan) instead
// Every case must be listed in docs/troubleshooting.md (second test).
//
// Cheap checks first (issue 33): a bad input is refused before anything expensive runs,
// so every case finishes within kCaseSeconds (wall clock, the program's start included)
// and measures no profile (no profiles/ folder is left). The test prints the slowest case.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "TestUtil.h"

namespace fs = std::filesystem;

namespace {

std::string readFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string replaceAll(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

}  // namespace

TEST(BadInputs, EveryCaseExitsTwoWithOneNamingLine) {
  const fs::path corpus = fs::path(PIPEFB_SOURCE_DIR) / "tests" / "bad_inputs";
  std::vector<fs::path> cases;
  for (const auto& e : fs::directory_iterator(corpus))
    if (e.path().extension() == ".yaml") cases.push_back(e.path());
  std::sort(cases.begin(), cases.end());
  ASSERT_GE(cases.size(), 30u);

  // Generous against the ~0.5 s a case takes: a refusal that waits on a profile or a
  // solve over thousands of devices takes from seconds to minutes.
  constexpr double kCaseSeconds = 5.0;
  std::string slowest;
  double slowestSeconds = 0;
  const fs::path work = pipefb::test::scratchPath("bad_inputs");
  for (const auto& c : cases) {
    SCOPED_TRACE(c.filename().string());
    std::string text = readFile(c);
    const std::string tag = "# expect: ";
    ASSERT_EQ(text.rfind(tag, 0), 0u) << "first line must be '# expect: ...'";
    std::string expect = text.substr(tag.size(), text.find('\n') - tag.size());

    fs::remove_all(work);
    fs::create_directories(work);
    fs::path config = work / c.filename();
    std::ofstream(config) << replaceAll(text, "@SOURCE@", PIPEFB_SOURCE_DIR);

    std::string args = "--config " + config.string();
    std::string program = "pipefb_train";
    std::istringstream header(text);
    std::string line;
    std::getline(header, line);  // # expect:
    while (std::getline(header, line) && line.rfind("# ", 0) == 0) {
      if (line.rfind("# copy: ", 0) == 0) {
        const std::string dir = line.substr(8);
        fs::copy(corpus / "data" / dir, work / dir, fs::copy_options::recursive);
      } else if (line.rfind("# args: ", 0) == 0) {
        args = line.substr(8);
        args = replaceAll(args, "@CASE@", config.string());
        args = replaceAll(args, "@WORK@", work.string());
        args = replaceAll(args, "@DATA@", (corpus / "data").string());
      } else if (line.rfind("# program: ", 0) == 0) {
        program = line.substr(11);
      }
    }

    // No GPU visible: 80-kind-cuda-unavailable.yaml is bad input on a GPU host too.
    const auto start = std::chrono::steady_clock::now();
    auto r = pipefb::test::runCommand("cd " + work.string() + " && CUDA_VISIBLE_DEVICES= " +
                                      PIPEFB_BINARY_DIR + "/" + program + " " + args);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, kCaseSeconds) << "a bad input must be refused by a cheap check first";
    if (seconds > slowestSeconds) {
      slowestSeconds = seconds;
      slowest = c.filename().string();
    }
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_EQ(pipefb::test::countLines(r.out), 1u) << r.out;
    EXPECT_NE(r.out.find(expect), std::string::npos) << "expected '" << expect << "' in: " << r.out;
    EXPECT_FALSE(fs::exists(work / "runs")) << "a run folder was left behind";
    EXPECT_FALSE(fs::exists(work / "profiles")) << "a profile was measured for a bad input";
  }
  std::cout << "slowest case: " << slowest << " (" << slowestSeconds << " s of " << kCaseSeconds
            << " s allowed)\n";
  RecordProperty("slowest_case", slowest);
}

// docs/troubleshooting.md lists every case file (so that it cannot go stale): each name
// appears in it, and it names no case that is gone.
TEST(BadInputs, TroubleshootingListsEveryCase) {
  const fs::path root(PIPEFB_SOURCE_DIR);
  const std::string section = readFile(root / "docs" / "troubleshooting.md");
  ASSERT_FALSE(section.empty()) << "docs/troubleshooting.md is missing or empty";
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root / "tests" / "bad_inputs"))
    if (e.path().extension() == ".yaml") names.push_back(e.path().filename().string());
  ASSERT_GE(names.size(), 30u);
  for (const auto& n : names)
    EXPECT_NE(section.find("`" + n + "`"), std::string::npos)
        << n << " is not listed in docs/troubleshooting.md";
  // And no listed case that does not exist.
  for (size_t at = section.find(".yaml`"); at != std::string::npos;
       at = section.find(".yaml`", at + 1)) {
    const auto open = section.rfind('`', at);
    const std::string listed = section.substr(open + 1, at + 5 - open - 1);
    if (listed.find('/') != std::string::npos || listed.find(' ') != std::string::npos) continue;
    if (listed.size() < 3 || !std::isdigit(static_cast<unsigned char>(listed[0]))) continue;
    EXPECT_TRUE(fs::exists(root / "tests" / "bad_inputs" / listed))
        << "docs/troubleshooting.md lists " << listed << ", which is not in tests/bad_inputs";
  }
}
