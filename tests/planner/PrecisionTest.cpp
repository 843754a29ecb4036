// Note [Half-precision training] (common/Precision.h): what the analytic profile charges
// at bf16 and fp16, the device specs' half rates, and plan files that record the precision.
#include <gtest/gtest.h>

#include <string>

#include "pipefb/common/Error.h"
#include "pipefb/planner/AnalyticProfile.h"
#include "pipefb/planner/DeviceSpec.h"
#include "pipefb/planner/PlanFile.h"

using namespace pipefb;
using namespace pipefb::planner;

namespace {

const std::string kDevices = std::string(PIPEFB_SOURCE_DIR) + "/configs/devices";

model::ModelOptions gpt2Tiny() {
  model::ModelOptions o;
  o.name = "gpt2";
  o.size = "tiny";
  o.input_size = 64;
  o.num_classes = 256;
  return o;
}

}  // namespace

TEST(Precision, HalfHalvesActivationsAndKeepsIdsLossAndFp32State) {
  const DeviceSpec a100 = loadDeviceSpec(kDevices + "/a100-40g.yaml");
  const ModelWork work = modelWork(gpt2Tiny());
  const OptimizerMemory adam = optimizerMemory("adam", 0, 0);
  const Profile f = analyticProfile(work, 4, a100, adam, Precision::FP32);
  const Profile h = analyticProfile(work, 4, a100, adam, Precision::BF16);
  EXPECT_EQ(h.precision, Precision::BF16);
  ASSERT_EQ(f.layers.size(), h.layers.size());
  const int L = static_cast<int>(f.layers.size());
  // Blocks: every activation byte halves.
  for (int l = 1; l + 1 < L; ++l) {
    EXPECT_EQ(2 * h.layers[l].savedBytes, f.layers[l].savedBytes) << l;
    EXPECT_EQ(2 * h.layers[l].outputBytes, f.layers[l].outputBytes) << l;
    EXPECT_LT(h.layers[l].forward, f.layers[l].forward) << l;  // tensor-core rate
  }
  // The embedding saves int64 ids: they keep their width.
  EXPECT_EQ(h.layers[0].savedBytes, f.layers[0].savedBytes);
  // The head: its fp32 log-softmax stays; the rest halves. Its working set is the loss's.
  const auto& wh = work.layers.back();
  EXPECT_EQ(h.layers[L - 1].savedBytes,
            4 * (wh.savedWideBytes + (wh.savedBytes - wh.savedWideBytes) / 2));
  EXPECT_GT(wh.savedWideBytes, 0);
  EXPECT_EQ(h.layers[L - 1].forwardWorkingBytes, f.layers[L - 1].forwardWorkingBytes);
  for (int l = 0; l < L; ++l) {
    // fp32 master + half copy; fp32 .grad and Adam states.
    EXPECT_EQ(2 * h.layers[l].paramBytes, 3 * f.layers[l].paramBytes) << l;
    EXPECT_EQ(h.layers[l].gradBytes, f.layers[l].gradBytes) << l;
    EXPECT_EQ(h.layers[l].optimizerBytes, f.layers[l].optimizerBytes) << l;
    EXPECT_EQ(h.layers[l].stepWorkingBytes, f.layers[l].stepWorkingBytes) << l;
  }
  EXPECT_EQ(h.inputBytes, f.inputBytes);  // token ids
}

TEST(Precision, Fp32IsTheDefaultAndUnchanged) {
  const DeviceSpec t4 = loadDeviceSpec(kDevices + "/t4-16g.yaml");
  const ModelWork work = modelWork(gpt2Tiny());
  const Profile a = analyticProfile(work, 2, t4, OptimizerMemory{});
  const Profile b = analyticProfile(work, 2, t4, OptimizerMemory{}, Precision::FP32);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    EXPECT_EQ(a.layers[l].savedBytes, b.layers[l].savedBytes);
    EXPECT_EQ(a.layers[l].paramBytes, 4 * work.layers[l].params);
    EXPECT_EQ(a.layers[l].forward, b.layers[l].forward);
  }
}

TEST(Precision, DeviceWithoutAHalfRateCannotPlanAtIt) {
  const DeviceSpec t4 = loadDeviceSpec(kDevices + "/t4-16g.yaml");
  EXPECT_GT(flopsAt(t4, Precision::FP16), flopsAt(t4, Precision::FP32));
  try {
    flopsAt(t4, Precision::BF16);
    FAIL() << "a T4 has no bf16";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("t4-16g has no bf16"), std::string::npos) << what;
    EXPECT_NE(what.find("allowed on it: fp32, fp16"), std::string::npos) << what;
  }
  for (const char* name : {"a100-40g", "a100-80g", "h100-80g", "h200-141g"}) {
    const DeviceSpec d = loadDeviceSpec(kDevices + "/" + name + ".yaml");
    EXPECT_GT(d.bf16Flops, d.peakFlops) << name;
    EXPECT_GT(d.fp16Flops, d.peakFlops) << name;
  }
  EXPECT_GT(loadDeviceSpec(kDevices + "/v100-16g.yaml").fp16Flops, 0);
  EXPECT_EQ(loadDeviceSpec(kDevices + "/v100-16g.yaml").bf16Flops, 0);
}

TEST(Precision, PlanFilesRecordItAndRefuseAnUnknownOne) {
  const std::string head =
      "version: 1\nlayers: 2\nschedule: 1f1b\nmicrobatches: 2\nmicrobatch_size: 4\nbatch: 8\n"
      "stages:\n"
      "  - {layers: [0, 1], forward_device: 0, backward_device: 0, policy: keep}\n"
      "  - {layers: [1, 2], forward_device: 1, backward_device: 1, policy: keep}\n";
  EXPECT_EQ(parsePlan(head, "a.yaml").precision, Precision::FP32);  // absent: fp32
  EXPECT_EQ(parsePlan(head + "precision: fp16\n", "b.yaml").precision, Precision::FP16);
  try {
    parsePlan(head + "precision: fp8\n", "c.yaml");
    FAIL() << "fp8 is no precision";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("c.yaml: precision: 'fp8'; allowed: fp32, bf16, fp16"),
              std::string::npos)
        << e.what();
  }
}
