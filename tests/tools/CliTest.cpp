// The programs as a user runs them: exit codes and one-line errors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;

namespace {

struct Result {
  int code = -1;
  std::string out;  // stdout + stderr
};

Result run(const std::string& args) {
  std::string cmd = std::string(PIPEFB_BINARY_DIR) + "/" + args + " 2>&1";
  Result r;
  FILE* f = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  int status = pclose(f);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::string cfg(const std::string& name) {
  return std::string(PIPEFB_SOURCE_DIR) + "/configs/" + name;
}

std::string writeTemp(const std::string& name, const std::string& text) {
  fs::path p = fs::temp_directory_path() / ("pipefb_cli_" + name);
  std::ofstream(p) << text;
  return p.string();
}

size_t lines(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
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
    Result r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.mustContain), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_EQ(lines(r.out), 1u) << c.args << "\n" << r.out;
  }
}

TEST(PipefbTrain, TinyRunSucceedsAndWritesRunFolder) {
  fs::path dir = fs::temp_directory_path() / "pipefb_cli_run";
  fs::remove_all(dir);
  Result r = run("pipefb_train --config " + cfg("mlp-tiny.yaml") +
                 " --set training.iterations=5 --set output.dir=" + dir.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step 5/5"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("samples/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ETA"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(dir / "summary.json"));
  EXPECT_TRUE(fs::exists(dir / "model.pt"));
}
