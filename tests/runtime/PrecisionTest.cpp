// Note [Autocast] (model/Model.h): training.precision bf16 in the runtime. Every sync
// schedule and stash policy gives one device's bf16 weights; bf16 is really on (the
// weights differ from fp32's), and messages and stashes move at their real dtype.
#include "Equivalence.h"

using namespace pipefb;
using namespace pipefb::test::equivalence;

namespace {

Case bf16(Case c) {
  c.precision = "bf16";
  c.name += " bf16";
  return c;
}

}  // namespace

TEST(PrecisionBf16, PipelinesGiveOneDevicesWeightsForEveryStashPolicy) {
  std::vector<Layout> layouts = kOneStagePerDevice;
  layouts.insert(layouts.end(), kFolded.begin(), kFolded.end());
  layouts.insert(layouts.end(), kInterleaved.begin(), kInterleaved.end());
  checkEquivalence(bf16({"mlp", mlpOptions(), 8}), {2, 4}, {2, 4}, kAllStashes, layouts);
}

TEST(PrecisionBf16, VisionAndGpt2PipelinesGiveOneDevicesWeights) {
  checkEquivalence(bf16({"vgg16", visionOptions("vgg16"), 4}), {2}, {2}, kAllStashes);
  checkEquivalence(bf16({"resnet50", visionOptions("resnet50"), 4}), {2}, {2},
                   {"keep", "checkpoint"});
  checkEquivalence(bf16({"gpt2", gpt2Options(), 4}), {2, 3}, {2}, kAllStashes);
}

// bf16 is on: the same steps at fp32 give other weights (by far more than the 1e-5 the
// equivalence allows), and a stage's message is bf16 after a linear layer.
TEST(PrecisionBf16, ChangesTheNumbersAndSendsBf16Activations) {
  auto cfg = makeConfig(mlpOptions(), "1f1b", 2, 2, "keep", 8);
  Reference f32(cfg);
  cfg.training.precision = "bf16";
  Reference b16(cfg);
  for (int k = 0; k < 3; ++k) {
    auto b = makeBatch(*f32.model, 8, cfg.model.num_classes, 100 + k);
    f32.step(b, 3);
    b16.step(b, 3);
  }
  std::string worst;
  EXPECT_GT(maxRelErr(*b16.model, *f32.model, /*grads=*/false, &worst), 1e-4);
  // fp32 master weights and .grad.
  for (const auto& p : b16.model->parameters()) {
    EXPECT_EQ(p.scalar_type(), torch::kFloat32);
    EXPECT_EQ(p.grad().scalar_type(), torch::kFloat32);
  }
  // The first stage's output (what 1f1b sends on) is bf16 under autocast.
  auto x = makeBatch(*b16.model, 4, cfg.model.num_classes, 7).input;
  model::Autocast autocast("bf16", x.device().type());
  EXPECT_EQ(b16.model->forward(x, 0, 1).scalar_type(), torch::kBFloat16);
}
