// The real Fashion-MNIST files, and the synthetic tasks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>

#include "TestFiles.h"
#include "pipefb/common/Error.h"
#include "pipefb/data/Dataset.h"
#include "pipefb/data/Readers.h"

namespace pipefb::data {
namespace {
using testing::userErrorOf;

constexpr const char* kFashionDir = "/usr/share/datasets/fashion-mnist";

model::ModelOptions imageModel(int64_t side, int64_t channels, int64_t classes = 10) {
  model::ModelOptions m;
  m.name = "vgg16";
  m.input_size = side;
  m.channels = channels;
  m.num_classes = classes;
  return m;
}

std::vector<int64_t> range(int64_t begin, int64_t end) {
  std::vector<int64_t> v;
  for (int64_t i = begin; i < end; ++i) v.push_back(i);
  return v;
}

// ------------------------------------------------------------------ Fashion-MNIST

/// The training split, unnormalised at 32 px / 1 channel, loaded once (timed).
class FashionMnist : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kFashionDir)) return;
    DataOptions d;
    d.normalize = false;
    auto t0 = std::chrono::steady_clock::now();
    train_ = makeDataset(d, imageModel(32, 1), Split::Train, 0);
    auto t1 = std::chrono::steady_clock::now();
    readIdx(std::string(kFashionDir) + "/train-images-idx3-ubyte.gz", 3, "images N×H×W");
    auto t2 = std::chrono::steady_clock::now();
    loadSeconds_ = std::chrono::duration<double>(t1 - t0).count();
    inflateSeconds_ = std::chrono::duration<double>(t2 - t1).count();
  }
  static void TearDownTestSuite() { train_.reset(); }
  void SetUp() override {
    if (!train_) GTEST_SKIP() << kFashionDir << " missing (apt-get install dataset-fashion-mnist)";
  }
  static std::shared_ptr<Dataset> train_;
  static double loadSeconds_, inflateSeconds_;
};
std::shared_ptr<Dataset> FashionMnist::train_;
double FashionMnist::loadSeconds_ = 0;
double FashionMnist::inflateSeconds_ = 0;

TEST_F(FashionMnist, TrainSetLoadsQuickly) {
  std::printf(
      "fashion-mnist train (60000 images, 28->32 px) loaded in %.3f s (of which ~%.3f s "
      "reading the images file): %s\n",
      loadSeconds_, inflateSeconds_, train_->describe().c_str());
  EXPECT_LT(loadSeconds_, 5.0);  // ~0.5 s unloaded; slack for a shared machine
}

TEST_F(FashionMnist, SizesShapesAndLabels) {
  ASSERT_EQ(train_->size(), 60000);
  EXPECT_EQ(train_->numClasses(), 10);
  Batch b = train_->get({0, 1, 59999});
  EXPECT_EQ(b.input.sizes(), (std::vector<int64_t>{3, 1, 32, 32}));
  EXPECT_EQ(b.input.dtype(), torch::kFloat);
  EXPECT_EQ(b.target.dtype(), torch::kLong);
  // The first training labels of Fashion-MNIST are 9 (ankle boot), 0, 0.
  EXPECT_EQ(b.target[0].item<int64_t>(), 9);
  EXPECT_EQ(b.target[1].item<int64_t>(), 0);

  // Labels: 0..9, exactly 6000 of each class.
  Batch all = train_->get(range(0, 60000));
  auto counts = torch::bincount(all.target);
  ASSERT_EQ(counts.size(0), 10);
  EXPECT_TRUE(torch::all(counts == 6000).item<bool>()) << counts;

  DataOptions d;
  auto test = makeDataset(d, imageModel(32, 1), Split::Test, 0);
  ASSERT_EQ(test->size(), 10000);
  auto testCounts = torch::bincount(test->get(range(0, 10000)).target);
  EXPECT_TRUE(torch::all(testCounts == 1000).item<bool>()) << testCounts;
}

TEST_F(FashionMnist, RawPixelMeanAndZeroBorder) {
  Batch all = train_->get(range(0, 60000));  // (60000, 1, 32, 32), values in [0, 1]
  const auto& x = all.input;
  // The 2-pixel frame added by padding is exactly zero...
  for (const auto& frame :
       {x.slice(2, 0, 2), x.slice(2, 30, 32), x.slice(3, 0, 2), x.slice(3, 30, 32)})
    EXPECT_EQ(frame.abs().max().item<float>(), 0.0f);
  // ...so the sum over all pixels is that of the 28×28 originals.
  const double mean = x.sum(torch::kDouble).item<double>() / (60000.0 * 28 * 28);
  EXPECT_NEAR(mean, 0.2860, 1e-3);
  EXPECT_GE(x.min().item<float>(), 0.0f);
  EXPECT_LE(x.max().item<float>(), 1.0f);
}

TEST_F(FashionMnist, NormalisedThreeChannels) {
  DataOptions d;
  d.limit_train = 20000;
  auto ds = makeDataset(d, imageModel(32, 3), Split::Train, 0);
  ASSERT_EQ(ds->size(), 20000);
  Batch b = ds->get(range(0, 20000));
  ASSERT_EQ(b.input.sizes(), (std::vector<int64_t>{20000, 3, 32, 32}));
  // One channel repeated three times.
  EXPECT_TRUE(torch::equal(b.input.select(1, 0), b.input.select(1, 2)));
  // On the unpadded region: mean ~0 and std ~1 (statistics of the whole train set,
  // measured here on its first third).
  auto centre = b.input.select(1, 1).slice(1, 2, 30).slice(2, 2, 30).to(torch::kDouble);
  EXPECT_NEAR(centre.mean().item<double>(), 0.0, 0.01);
  EXPECT_NEAR(centre.std().item<double>(), 1.0, 0.01);
  // The border is the normalised black background.
  EXPECT_NEAR(b.input[7][0][0][0].item<float>(), -0.2860f / 0.3530f, 1e-5);
  // The same samples as the unnormalised set.
  Batch raw = train_->get({7});
  EXPECT_TRUE(torch::allclose(b.input[7][0], (raw.input[0][0] - 0.2860) / 0.3530, 1e-5, 1e-5));
}

TEST_F(FashionMnist, ResizeWhenPaddingDoesNotFit) {
  DataOptions d;
  d.normalize = false;
  d.limit_test = 50;
  for (int64_t side : {24, 37, 64}) {
    auto ds = makeDataset(d, imageModel(side, 3), Split::Test, 0);
    ASSERT_EQ(ds->size(), 50);
    Batch b = ds->get(range(0, 50));
    ASSERT_EQ(b.input.sizes(), (std::vector<int64_t>{50, 3, side, side})) << side;
    // Bilinear resizing keeps values in [0, 1] and roughly keeps the mean brightness.
    EXPECT_GE(b.input.min().item<float>(), 0.0f);
    EXPECT_LE(b.input.max().item<float>(), 1.0f);
    EXPECT_NEAR(b.input.mean().item<double>(), 0.2860, 0.05) << side;
  }
  // 36 = 28 + 8 still pads (4 px each side).
  auto padded = makeDataset(d, imageModel(36, 1), Split::Test, 0)->get({0});
  EXPECT_EQ(padded.input.slice(2, 0, 4).abs().sum().item<float>(), 0.0f);
}

// ------------------------------------------------------------------ synthetic images

DataOptions synthetic(int64_t train, int64_t test) {
  DataOptions d;
  d.name = "synthetic";
  d.synthetic_train = train;
  d.synthetic_test = test;
  return d;
}

TEST(SyntheticImages, DeterministicFromSeed) {
  auto m = imageModel(16, 3);
  auto a = makeDataset(synthetic(64, 32), m, Split::Train, 7)->get({0, 5, 63});
  auto b = makeDataset(synthetic(64, 32), m, Split::Train, 7)->get({0, 5, 63});
  auto c = makeDataset(synthetic(64, 32), m, Split::Train, 8)->get({0, 5, 63});
  ASSERT_EQ(a.input.sizes(), (std::vector<int64_t>{3, 3, 16, 16}));
  EXPECT_TRUE(torch::equal(a.input, b.input));
  EXPECT_TRUE(torch::equal(a.target, b.target));
  EXPECT_FALSE(torch::equal(a.input, c.input));
  // A sample does not depend on which batch fetches it.
  auto single = makeDataset(synthetic(64, 32), m, Split::Train, 7)->get({5});
  EXPECT_TRUE(torch::equal(single.input[0], a.input[1]));
  // Torch's global RNG does not enter.
  torch::manual_seed(123);
  auto d = makeDataset(synthetic(64, 32), m, Split::Train, 7)->get({0, 5, 63});
  EXPECT_TRUE(torch::equal(a.input, d.input));
  // Train and test differ.
  auto t = makeDataset(synthetic(64, 32), m, Split::Test, 7)->get({0, 5, 31});
  EXPECT_FALSE(torch::equal(a.input, t.input));
}

TEST(SyntheticImages, LearnableNearestClassMean) {
  // Class means estimated on the training split classify the test split: the
  // task is learnable, and train and test share it.
  auto m = imageModel(16, 3, 10);
  auto train = makeDataset(synthetic(1000, 200), m, Split::Train, 1)->get(range(0, 1000));
  auto test = makeDataset(synthetic(1000, 200), m, Split::Test, 1)->get(range(0, 200));
  auto x = train.input.flatten(1);
  std::vector<torch::Tensor> means;
  for (int k = 0; k < 10; ++k) {
    auto mask = train.target == k;
    ASSERT_GT(mask.sum().item<int64_t>(), 50) << "class " << k;  // labels spread over classes
    means.push_back(x.index({mask}).mean(0));
  }
  auto centres = torch::stack(means);  // (10, D)
  // Class means are far apart compared with their estimation noise (~sqrt(D/100)).
  auto gap = torch::cdist(centres, centres);
  auto offDiagonal = gap + torch::eye(10) * 1e9;
  EXPECT_GT(offDiagonal.min().item<float>(), 10.0f);
  auto pred = torch::cdist(test.input.flatten(1), centres).argmin(1);
  const double accuracy = (pred == test.target).to(torch::kDouble).mean().item<double>();
  EXPECT_GT(accuracy, 0.95);
}

TEST(SyntheticImages, LargeInputsCostNoMemoryUpFront) {
  auto m = imageModel(224, 3, 1000);
  DataOptions d = synthetic(100000, 10);
  d.limit_train = 5000;
  auto ds = makeDataset(d, m, Split::Train, 0);
  EXPECT_EQ(ds->size(), 5000);
  EXPECT_EQ(ds->numClasses(), 1000);
  auto b = ds->get({0, 4999});
  EXPECT_EQ(b.input.sizes(), (std::vector<int64_t>{2, 3, 224, 224}));
  EXPECT_LT(b.target.max().item<int64_t>(), 1000);
}

// ------------------------------------------------------------------ synthetic tokens

model::ModelOptions gpt2(int64_t t, int64_t vocab) {
  model::ModelOptions m;
  m.name = "gpt2";
  m.size = "tiny";
  m.input_size = t;
  m.num_classes = vocab;
  return m;
}

TEST(SyntheticTokens, ShapesShiftAndDeterminism) {
  auto ds = makeDataset(synthetic(300, 50), gpt2(16, 1000), Split::Train, 3);
  ASSERT_EQ(ds->size(), 300);
  EXPECT_EQ(ds->numClasses(), 1000);
  Batch b = ds->get({0, 1, 299});
  ASSERT_EQ(b.input.sizes(), (std::vector<int64_t>{3, 16}));
  ASSERT_EQ(b.target.sizes(), (std::vector<int64_t>{3, 16}));
  EXPECT_EQ(b.input.dtype(), torch::kLong);
  EXPECT_TRUE(torch::equal(b.input.slice(1, 1), b.target.slice(1, 0, 15)));
  EXPECT_GE(b.input.min().item<int64_t>(), 0);
  EXPECT_LT(b.input.max().item<int64_t>(), 1000);
  auto again = makeDataset(synthetic(300, 50), gpt2(16, 1000), Split::Train, 3)->get({0, 1, 299});
  EXPECT_TRUE(torch::equal(b.input, again.input));
  auto other = makeDataset(synthetic(300, 50), gpt2(16, 1000), Split::Train, 4)->get({0, 1, 299});
  EXPECT_FALSE(torch::equal(b.input, other.input));
}

TEST(SyntheticTokens, BigramStructureIsLearnable) {
  // The most frequent successor of each token, counted on train, predicts ~3/4
  // of the next tokens in test (chance would be 1/256).
  auto m = gpt2(32, 5000);
  auto train = makeDataset(synthetic(2000, 200), m, Split::Train, 9)->get(range(0, 2000));
  auto test = makeDataset(synthetic(2000, 200), m, Split::Test, 9)->get(range(0, 200));
  std::map<int64_t, std::map<int64_t, int64_t>> counts;
  auto in = train.input.flatten(), out = train.target.flatten();
  const int64_t* pi = in.data_ptr<int64_t>();
  const int64_t* po = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < in.numel(); ++i) ++counts[pi[i]][po[i]];
  std::map<int64_t, int64_t> best;
  for (auto& [prev, nexts] : counts) {
    int64_t arg = -1, top = -1;
    for (auto& [n, c] : nexts)
      if (c > top) top = c, arg = n;
    best[prev] = arg;
  }
  auto tin = test.input.flatten(), tout = test.target.flatten();
  int64_t hits = 0;
  for (int64_t i = 0; i < tin.numel(); ++i)
    hits += best.count(tin[i].item<int64_t>()) &&
            best[tin[i].item<int64_t>()] == tout[i].item<int64_t>();
  const double rate = double(hits) / tin.numel();
  EXPECT_NEAR(rate, 0.75, 0.03);
}

TEST(MakeDatasetOptions, BadSizesAreUserErrors) {
  auto m = imageModel(16, 3);
  DataOptions d = synthetic(0, 10);
  EXPECT_NE(
      userErrorOf([&] { makeDataset(d, m, Split::Train, 0); }).find("data.synthetic_train = 0"),
      std::string::npos);
  d = synthetic(10, 10);
  d.limit_test = -1;
  EXPECT_NE(userErrorOf([&] { makeDataset(d, m, Split::Test, 0); }).find("data.limit_test = -1"),
            std::string::npos);
  d = synthetic(10, 10);
  d.limit_test = 3;
  EXPECT_EQ(makeDataset(d, m, Split::Test, 0)->size(), 3);
}

}  // namespace
}  // namespace pipefb::data
