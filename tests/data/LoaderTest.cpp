// The loader: deterministic order from (seed, epoch), every index once per
// epoch, resume with seek().
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "TestFiles.h"
#include "pipefb/common/Error.h"
#include "pipefb/data/Dataset.h"

namespace pipefb::data {
namespace {
using testing::userErrorOf;

/// Sample i is the number i, so batches show which indices they hold.
class IndexDataset : public Dataset {
 public:
  explicit IndexDataset(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  int64_t numClasses() const override { return n_; }
  std::string describe() const override { return "index data set of " + std::to_string(n_); }
  Batch get(const std::vector<int64_t>& indices) const override {
    auto t = torch::tensor(indices, torch::kLong);
    return {t.to(torch::kFloat), t};
  }

 private:
  int64_t n_;
};

std::vector<int64_t> indicesOf(const Batch& b) {
  return std::vector<int64_t>(b.target.data_ptr<int64_t>(),
                              b.target.data_ptr<int64_t>() + b.target.numel());
}

/// The next `count` batches, as index lists.
std::vector<std::vector<int64_t>> take(Loader& loader, int count) {
  std::vector<std::vector<int64_t>> out;
  for (int i = 0; i < count; ++i) out.push_back(indicesOf(loader.next()));
  return out;
}

TEST(Loader, SameSeedSameBatchesWhateverTorchsRng) {
  auto ds = std::make_shared<IndexDataset>(100);
  Loader a(ds, 8, true, 42);
  torch::manual_seed(1);
  torch::randn({1000});  // model init would consume torch's RNG like this
  Loader b(ds, 8, true, 42);
  EXPECT_EQ(take(a, 40), take(b, 40));  // 40 batches: more than 3 epochs
  Loader c(ds, 8, true, 43);
  Loader a2(ds, 8, true, 42);
  EXPECT_NE(take(a2, 12), take(c, 12));
}

TEST(Loader, EveryIndexOncePerEpochAndEpochsDiffer) {
  auto ds = std::make_shared<IndexDataset>(103);
  Loader loader(ds, 10, true, 5, /*dropLast=*/false);
  ASSERT_EQ(loader.batchesPerEpoch(), 11);
  std::vector<std::vector<int64_t>> orders;
  for (int e = 0; e < 3; ++e) {
    EXPECT_EQ(loader.epoch(), e);
    EXPECT_EQ(loader.position(), 0);
    std::vector<int64_t> order;
    for (int i = 0; i < 11; ++i) {
      auto idx = indicesOf(loader.next());
      EXPECT_EQ(idx.size(), i < 10 ? 10u : 3u);
      order.insert(order.end(), idx.begin(), idx.end());
    }
    std::set<int64_t> seen(order.begin(), order.end());
    EXPECT_EQ(seen.size(), 103u);
    EXPECT_EQ(*seen.begin(), 0);
    EXPECT_EQ(*seen.rbegin(), 102);
    orders.push_back(order);
  }
  EXPECT_NE(orders[0], orders[1]);
  EXPECT_NE(orders[1], orders[2]);
  EXPECT_EQ(loader.epoch(), 3);
}

TEST(Loader, DropLastSkipsTheShortBatch) {
  auto ds = std::make_shared<IndexDataset>(103);
  Loader loader(ds, 10, true, 5, /*dropLast=*/true);
  ASSERT_EQ(loader.batchesPerEpoch(), 10);
  std::set<int64_t> seen;
  for (int i = 0; i < 10; ++i) {
    auto idx = indicesOf(loader.next());
    ASSERT_EQ(idx.size(), 10u);
    seen.insert(idx.begin(), idx.end());
  }
  EXPECT_EQ(seen.size(), 100u);  // distinct; 3 left out this epoch
  EXPECT_EQ(loader.epoch(), 1);
}

TEST(Loader, SeekReproducesTheSequence) {
  auto ds = std::make_shared<IndexDataset>(64);
  Loader reference(ds, 6, true, 11);  // 10 batches per epoch
  auto all = take(reference, 35);
  for (auto [epoch, position] :
       std::vector<std::pair<int, int>>{{0, 0}, {0, 7}, {1, 3}, {2, 9}, {1, 10}}) {
    Loader resumed(ds, 6, true, 11);
    take(resumed, 4);  // wherever it was before
    resumed.seek(epoch, position);
    const int at = epoch * 10 + position;
    EXPECT_EQ(resumed.epoch() * 10 + resumed.position(), at);
    auto rest = take(resumed, 35 - at);
    EXPECT_EQ(rest, std::vector<std::vector<int64_t>>(all.begin() + at, all.end()))
        << "seek(" << epoch << ", " << position << ")";
  }
  Loader bad(ds, 6, true, 11);
  EXPECT_NE(userErrorOf([&] { bad.seek(0, 11); }).find("0 <= position <= 10"), std::string::npos);
}

TEST(Loader, NoShuffleIsSequential) {
  auto ds = std::make_shared<IndexDataset>(10);
  Loader loader(ds, 4, false, 0, false);
  EXPECT_EQ(take(loader, 4),
            (std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}, {0, 1, 2, 3}}));
}

TEST(Loader, BadBatchSizes) {
  auto ds = std::make_shared<IndexDataset>(10);
  EXPECT_NE(userErrorOf([&] { Loader(ds, 0, true, 0); }).find("training.batch = 0"),
            std::string::npos);
  EXPECT_NE(userErrorOf([&] { Loader(ds, 11, true, 0, true); }).find("larger than the data set"),
            std::string::npos);
  Loader ok(ds, 11, true, 0, false);  // one short batch per epoch
  EXPECT_EQ(indicesOf(ok.next()).size(), 10u);
}

TEST(Loader, RealBatchesFromASyntheticSet) {
  DataOptions d;
  d.name = "synthetic";
  d.synthetic_train = 50;
  model::ModelOptions m;
  m.name = "mlp";
  m.input_size = 8;
  m.channels = 1;
  m.num_classes = 4;
  auto ds = makeDataset(d, m, Split::Train, 0);
  Loader a(ds, 16, true, 2), b(ds, 16, true, 2);
  for (int i = 0; i < 7; ++i) {
    Batch x = a.next(), y = b.next();
    ASSERT_EQ(x.input.sizes(), (std::vector<int64_t>{16, 1, 8, 8}));
    EXPECT_TRUE(torch::equal(x.input, y.input));
    EXPECT_TRUE(torch::equal(x.target, y.target));
  }
}

}  // namespace
}  // namespace pipefb::data
