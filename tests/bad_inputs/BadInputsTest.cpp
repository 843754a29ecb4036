// The bad-input corpus: every file in tests/bad_inputs/*.yaml is a config with
// one fault. Its first line says `# expect: <text>`, a piece of the message.
// pipefb_train must exit 2 with exactly one line on stderr/stdout containing
// that text, and leave no run folder behind.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
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

  const fs::path work = fs::temp_directory_path() / "pipefb_bad_inputs";
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

    auto r = pipefb::test::runCommand("cd " + work.string() + " && " + PIPEFB_BINARY_DIR +
                                      "/pipefb_train --config " + config.string());
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_EQ(pipefb::test::countLines(r.out), 1u) << r.out;
    EXPECT_NE(r.out.find(expect), std::string::npos) << "expected '" << expect << "' in: " << r.out;
    EXPECT_FALSE(fs::exists(work / "runs")) << "a run folder was left behind";
  }
}
