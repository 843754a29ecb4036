// Parameter names and shapes against torchvision itself (Note [Parameter names]).
// Python's torch/torchvision are the build's own (PIPEFB_PYTHON, build/pipefb-python:
// Note [One LibTorch]), not whatever python3 is first on PATH.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "TestUtil.h"
#include "pipefb/model/Model.h"

namespace pipefb::model {
namespace {

std::string shapeText(c10::IntArrayRef sizes) {
  std::string s;
  for (auto d : sizes) s += (s.empty() ? "" : ",") + std::to_string(d);
  return s.empty() ? "-" : s;  // "-" for a 0-dim tensor (num_batches_tracked)
}

/// Runs torchvision and returns its "key shape" lines; fails the test if Python does.
std::vector<std::string> torchvisionKeys(const std::string& name) {
  const std::string script =
      "import sys, torchvision\n"
      "m = getattr(torchvision.models, sys.argv[1])(weights=None)\n"
      "for k, v in m.state_dict().items():\n"
      "    print(k, ','.join(str(d) for d in v.shape) or '-')\n";
  const auto r =
      pipefb::test::runCommand(std::string(PIPEFB_PYTHON) + " -c \"" + script + "\" " + name);
  EXPECT_EQ(r.code, 0) << PIPEFB_PYTHON << " with torchvision failed (run scripts/setup):\n"
                       << r.out;
  std::vector<std::string> lines;
  if (r.code != 0) return lines;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

void expectSameKeys(const std::string& name, bool batchNorm = false) {
  const std::string tv = batchNorm ? name + "_bn" : name;
  const auto expected = torchvisionKeys(tv);
  ASSERT_FALSE(expected.empty()) << "torchvision printed nothing for " << tv;

  ModelOptions o;  // defaults: width 1, 224 px, 3 channels, 1000 classes
  o.name = name;
  o.batch_norm = batchNorm;
  auto model = buildModel(o);
  std::vector<std::string> actual;
  for (const auto& [key, t] : model->stateDict())
    actual.push_back(key + " " + shapeText(t.sizes()));

  // Report the first difference precisely, then the counts.
  const size_t n = std::min(expected.size(), actual.size());
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(actual[i], expected[i]) << name << ": state_dict entry " << i << " differs";
  }
  ASSERT_EQ(actual.size(), expected.size())
      << name << ": torchvision has " << expected.size() << " entries, we have " << actual.size()
      << "; first extra: " << (actual.size() > n ? actual[n] : expected[n]);
}

TEST(TorchvisionKeys, Vgg16) { expectSameKeys("vgg16"); }
TEST(TorchvisionKeys, Vgg16BatchNorm) { expectSameKeys("vgg16", /*batchNorm=*/true); }
TEST(TorchvisionKeys, AlexNet) { expectSameKeys("alexnet"); }
TEST(TorchvisionKeys, ResNet50) { expectSameKeys("resnet50"); }

}  // namespace
}  // namespace pipefb::model
