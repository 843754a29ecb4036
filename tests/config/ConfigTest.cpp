#include <gtest/gtest.h>

#include <fstream>

#include "pipefb/common/Error.h"
#include "pipefb/config/Config.h"

using namespace pipefb::config;
using pipefb::UserError;

namespace {
// The message of the UserError that `f` throws, or "" if it throws none.
template <class F>
std::string errorOf(F f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Config, DefaultsWhenEmpty) {
  Config c = parseConfig("");
  EXPECT_EQ(c.model.name, "vgg16");
  EXPECT_EQ(c.pipeline.schedule, "none");
  EXPECT_FALSE(c.devices.memory.has_value());
}

TEST(Config, ParsesEverySection) {
  Config c = parseConfig(R"(
model: {name: mlp, width: 0.5, input_size: 28, channels: 1, num_classes: 10, hidden: [64, 32]}
data: {name: synthetic, synthetic_train: 100}
training: {optimizer: adam, lr: 0.001, batch: 32, iterations: 7, seed: 3}
devices: {count: 1, memory: 512MiB}
pipeline: {microbatches: 4, stash: checkpoint}
output: {dir: /tmp/x}
)");
  EXPECT_EQ(c.model.name, "mlp");
  EXPECT_DOUBLE_EQ(c.model.width, 0.5);
  EXPECT_EQ(c.model.hidden, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(c.data.synthetic_train, 100);
  EXPECT_EQ(c.training.optimizer, "adam");
  EXPECT_EQ(c.training.iterations, 7);
  EXPECT_EQ(c.training.seed, 3u);
  EXPECT_EQ(c.devices.memory, 512LL << 20);
  EXPECT_EQ(c.pipeline.microbatches, 4);
  EXPECT_EQ(c.pipeline.stash, "checkpoint");
}

TEST(Config, UnknownKeySuggestsAndNamesLine) {
  std::string msg =
      errorOf([] { parseConfig("training:\n  batch: 8\n  lrr: 0.1\n", {}, "f.yaml"); });
  EXPECT_NE(msg.find("f.yaml:3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("training.lrr"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'lr'"), std::string::npos) << msg;
}

TEST(Config, UnknownSectionSuggests) {
  std::string msg = errorOf([] { parseConfig("trainig:\n  lr: 0.1\n"); });
  EXPECT_NE(msg.find("did you mean 'training'"), std::string::npos) << msg;
}

TEST(Config, WrongTypesAndRanges) {
  struct Case {
    std::string yaml, key, what;
  } cases[] = {
      {"training: {lr: abc}", "training.lr", "got 'abc'"},
      {"training: {lr: -1}", "training.lr", "(0, 10]"},
      {"training: {batch: 0}", "training.batch", "integer in [1,"},
      {"training: {batch: 1.5}", "training.batch", "got '1.5'"},
      {"training: {seed: -4}", "training.seed", "non-negative"},
      {"devices: {memory: 12 parsecs}", "devices.memory", "512MiB"},
      {"devices: {memory: 0}", "devices.memory", "512MiB"},
      {"pipeline: {schedule: 1f1c}", "pipeline.schedule", "did you mean '1f1b'"},
      {"pipeline: {stash: [a]}", "pipeline.stash", "unknown value 'a'"},
      {"model: {hidden: [3, x]}", "model.hidden", "list of integers"},
      {"output: {progress: maybe}", "output.progress", "true | false"},
      {"output: {trace_steps: [10]}", "output.trace_steps", "[skip, steps]"},
      {"output: {trace_steps: [10, -1]}", "output.trace_steps", "got '-1'"},
      {"model: {name: vgg61}", "model.name", "did you mean 'vgg16'"},
  };
  for (const auto& c : cases) {
    std::string msg = errorOf([&] { parseConfig(c.yaml, {}, "t.yaml"); });
    EXPECT_NE(msg.find(c.key), std::string::npos) << c.yaml << " -> " << msg;
    EXPECT_NE(msg.find(c.what), std::string::npos) << c.yaml << " -> " << msg;
    EXPECT_NE(msg.find("t.yaml:1"), std::string::npos) << c.yaml << " -> " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  }
}

TEST(Config, MalformedYamlNamesLine) {
  std::string msg = errorOf([] { parseConfig("model:\n  name: [vgg16\n", {}, "bad.yaml"); });
  EXPECT_NE(msg.find("bad.yaml:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("malformed YAML"), std::string::npos) << msg;
}

TEST(Config, OverridesApplyAndAreChecked) {
  Config c = parseConfig("training: {lr: 0.1}",
                         {"training.lr=0.5", "devices.memory=2GiB", "pipeline.partition=[3, 7]"});
  EXPECT_DOUBLE_EQ(c.training.lr, 0.5);
  EXPECT_EQ(c.devices.memory, 2LL << 30);
  EXPECT_EQ(c.pipeline.partition, (std::vector<int64_t>{3, 7}));
  std::string msg = errorOf([] { parseConfig("", {"training.lrate=1"}); });
  EXPECT_NE(msg.find("--set training.lrate=1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'training.lr'"), std::string::npos) << msg;
  msg = errorOf([] { parseConfig("", {"training.batch=big"}); });
  EXPECT_NE(msg.find("training.batch"), std::string::npos) << msg;
  EXPECT_NE(msg.find("got 'big'"), std::string::npos) << msg;
  EXPECT_NE(errorOf([] { parseConfig("", {"noequals"}); }), "");
}

TEST(Config, PartitionBy) {
  EXPECT_EQ(parseConfig("").pipeline.partition_by, "planner");
  EXPECT_EQ(parseConfig("pipeline: {partition_by: params}").pipeline.partition_by, "params");
  EXPECT_NE(errorOf([] { parseConfig("", {"pipeline.partition_by=flops"}); }).find("planner"),
            std::string::npos);
}

TEST(Config, CrossKeyChecks) {
  EXPECT_NE(errorOf([] {
              parseConfig("training: {batch: 10}\npipeline: {microbatches: 3}");
            }).find("pipeline.microbatches"),
            std::string::npos);
  EXPECT_NE(errorOf([] {
              parseConfig("model: {name: gpt2}\ndata: {name: fashion-mnist}");
            }).find("data.name"),
            std::string::npos);
  EXPECT_NE(errorOf([] { parseConfig("devices: {count: 2}"); }).find("devices.count"),
            std::string::npos);
  EXPECT_NE(errorOf([] { parseConfig("pipeline: {partition: [5, 2]}"); }).find("increasing"),
            std::string::npos);
}

TEST(Config, ToYamlRoundTrips) {
  Config a = parseConfig(R"(
model: {name: resnet50, width: 0.25, hidden: [5]}
training: {optimizer: adam, lr: 0.003, seed: 42, iterations: 9}
devices: {memory: 1536MiB, host_memory: 3GiB}
pipeline: {partition: [2, 4], microbatches: 2}
output: {dir: "runs/a b"}
)");
  Config b = parseConfig(toYaml(a));
  EXPECT_EQ(toYaml(a), toYaml(b));
  EXPECT_EQ(b.model.name, "resnet50");
  EXPECT_EQ(b.devices.memory, 1536LL << 20);
  EXPECT_EQ(b.devices.host_memory, 3LL << 30);
  EXPECT_EQ(b.pipeline.partition, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(b.output.dir, "runs/a b");
  EXPECT_EQ(b.training.seed, 42u);
}

TEST(Config, ShippedConfigsParse) {
  for (const char* name : {"vgg16", "alexnet", "resnet50", "mlp-tiny", "gpt2-tiny", "gpt2-small",
                           "gpt2-medium", "gpt2-large", "gpt2-xl"}) {
    std::string path = std::string(PIPEFB_SOURCE_DIR) + "/configs/" + name + ".yaml";
    EXPECT_NO_THROW(loadConfig(path)) << path;
  }
}

TEST(Config, MissingFileIsUserError) {
  EXPECT_NE(errorOf([] { loadConfig("/nonexistent/x.yaml"); }).find("/nonexistent/x.yaml"),
            std::string::npos);
}

// Found by fuzz/ConfigFuzzer: a YAML key that is not plain text (a "? [list]" or
// "? {map}" complex key) made yaml-cpp's as<std::string>() throw out of the parser.
TEST(Config, NonScalarKeyIsAUserError) {
  EXPECT_NE(errorOf([] {
              parseConfig("? [model]\n: {name: mlp}\n");
            }).find("a section name must be plain text, got a list"),
            std::string::npos);
  EXPECT_NE(errorOf([] {
              parseConfig("model:\n  ? {width: 1}\n  : 0.5\n");
            }).find("a model key name must be plain text, got a mapping"),
            std::string::npos);
  EXPECT_NO_THROW(parseConfig("model:\n  ? width\n  : 0.5\n"));  // a scalar complex key is fine
}
