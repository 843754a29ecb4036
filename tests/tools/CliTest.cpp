// The programs as a user runs them: exit codes and one-line errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "TestUtil.h"

namespace fs = std::filesystem;

namespace {

using pipefb::test::CommandResult;

CommandResult run(const std::string& args) { return pipefb::test::runProgram(args); }

std::string cfg(const std::string& name) {
  return std::string(PIPEFB_SOURCE_DIR) + "/configs/" + name;
}

std::string writeTemp(const std::string& name, const std::string& text) {
  fs::path p = pipefb::test::scratchPath("cli_" + name);
  std::ofstream(p) << text;
  return p.string();
}

}  // namespace

TEST(PipefbTrain, BadInputExitsTwoWithOneLine) {
  struct Case {
    std::string args, mustContain;
  } cases[] = {
      {"pipefb_train --config " + cfg("mlp-tiny.yaml") + " --set training.lrr=1", "training.lrr"},
      {"pipefb_train --config " + cfg("mlp-tiny.yaml") + " --set training.batch=-3",
       "training.batch"},
      {"pipefb_train --config " + cfg("mlp-tiny.yaml") + " --set pipeline.microbatches=5",
       "pipeline.microbatches"},
      {"pipefb_train --config /nonexistent.yaml", "/nonexistent.yaml"},
      {"pipefb_train --config " + writeTemp("bad.yaml", "model:\n  name: [x\n"), "malformed YAML"},
      {"pipefb_train --config " + writeTemp("unk.yaml", "model:\n  nmae: vgg16\n"),
       "did you mean 'name'"},
      {"pipefb_train --config " + cfg("mlp-tiny.yaml") + " --bogus-flag", "bogus"},
      {"pipefb_train", "--config"},
      {"pipefb_train --config " + cfg("vgg16.yaml") + " --set data.path=/nonexistent/fm",
       "/nonexistent/fm"},
  };
  for (const auto& c : cases) {
    CommandResult r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.mustContain), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_EQ(pipefb::test::countLines(r.out), 1u) << c.args << "\n" << r.out;
  }
}

TEST(PipefbTrain, TinyRunSucceedsAndWritesRunFolder) {
  fs::path dir = pipefb::test::scratchPath("cli_run");
  fs::remove_all(dir);
  CommandResult r = run("pipefb_train --config " + cfg("mlp-tiny.yaml") +
                 " --set training.iterations=5 --set output.dir=" + dir.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step 5/5"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("samples/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ETA"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(dir / "summary.json"));
  EXPECT_TRUE(fs::exists(dir / "model.pt"));
}
