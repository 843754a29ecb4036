#include <gtest/gtest.h>

#include "pipefb/common/Size.h"

using pipefb::parseSize;

TEST(Size, ParsesBinaryAndDecimalUnits) {
  EXPECT_EQ(parseSize("512MiB"), 512LL << 20);
  EXPECT_EQ(parseSize("2GiB"), 2LL << 30);
  EXPECT_EQ(parseSize("1.5GiB"), 3LL << 29);
  EXPECT_EQ(parseSize("4096"), 4096);
  EXPECT_EQ(parseSize("1GB"), 1000000000LL);
  EXPECT_EQ(parseSize(" 64 kib "), 64 * 1024);
}

TEST(Size, RejectsGarbage) {
  EXPECT_FALSE(parseSize(""));
  EXPECT_FALSE(parseSize("MiB"));
  EXPECT_FALSE(parseSize("12 parsecs"));
  EXPECT_FALSE(parseSize("1.2.3GiB"));
  EXPECT_FALSE(parseSize("-5MiB"));
  EXPECT_FALSE(parseSize("5MiB extra"));
}

TEST(Size, FormatsForPeople) {
  EXPECT_EQ(pipefb::formatBytes(17), "17 B");
  EXPECT_EQ(pipefb::formatBytes(3LL << 29), "1.50 GiB");
}

#include "pipefb/common/Suggest.h"

TEST(Suggest, ClosestByEditDistanceOrPrefix) {
  std::vector<std::string> keys = {"lr", "momentum", "batch", "microbatches"};
  EXPECT_EQ(pipefb::closestMatch("momentun", keys), "momentum");
  EXPECT_EQ(pipefb::closestMatch("lrate", keys), "lr");
  EXPECT_EQ(pipefb::closestMatch("micro", keys), "microbatches");
  EXPECT_EQ(pipefb::closestMatch("zzzzzz", keys), "");
  EXPECT_EQ(pipefb::didYouMean("bach", keys), " (did you mean 'batch'?)");
  EXPECT_EQ(pipefb::joinAllowed({"a", "b"}), "a | b");
}
