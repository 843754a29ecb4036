#include <gtest/gtest.h>

#include "pipefb/common/Error.h"
#include "pipefb/sim/CostTable.h"

using namespace pipefb::sim;

TEST(CostTableTest, ParsesDefaultsPerStageOverridesAndLinks) {
  std::string text = R"({
    "stage": {"forward": "2ms", "backward": 0.004, "stash_bytes": "8MiB"},
    "stages": [{}, {"forward": "500us", "weights_bytes": 1024}],
    "link": {"bandwidth": "10GiB", "latency": "5us"},
    "links": [{"src": 0, "dst": 1, "bandwidth": 1e9}],
    "host_link": {"bandwidth": 12000000000, "latency": 0.00001},
    "host_links": [{"device": 1, "latency": "1ms"}]
  })";
  CostTable t = CostTable::fromJson(text, 2, "c.json");
  ASSERT_EQ(t.numStages(), 2);
  EXPECT_DOUBLE_EQ(t.stages[0].forward, 2e-3);
  EXPECT_DOUBLE_EQ(t.stages[1].forward, 5e-4);
  EXPECT_DOUBLE_EQ(t.stages[1].backward, 4e-3);
  EXPECT_EQ(t.stages[0].stashBytes, 8 << 20);
  EXPECT_EQ(t.stages[1].weightsBytes, 1024);
  EXPECT_EQ(t.stages[0].weightsBytes, StageCosts{}.weightsBytes);  // untouched default
  EXPECT_DOUBLE_EQ(t.link(1, 0).bandwidth, 10.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(t.link(1, 0).latency, 5e-6);
  EXPECT_DOUBLE_EQ(t.link(0, 1).bandwidth, 1e9);
  EXPECT_DOUBLE_EQ(t.link(0, 1).latency, 5e-6);  // inherits the default
  EXPECT_DOUBLE_EQ(t.hostLink(0).bandwidth, 12e9);
  EXPECT_DOUBLE_EQ(t.hostLink(1).latency, 1e-3);
  EXPECT_DOUBLE_EQ(t.hostLink(1).bandwidth, 12e9);
}

TEST(CostTableTest, ErrorsNameTheKey) {
  auto message = [](const std::string& text) {
    try {
      CostTable::fromJson(text, 2, "c.json");
    } catch (const pipefb::UserError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  std::string m = message(R"({"stage": {"forwrd": 1}})");
  EXPECT_NE(m.find("forwrd"), std::string::npos) << m;
  EXPECT_NE(m.find("did you mean 'forward'"), std::string::npos) << m;
  m = message(R"({"stages": [{}]})");
  EXPECT_NE(m.find("array of 2"), std::string::npos) << m;
  m = message(R"({"stage": {"forward": "fast"}})");
  EXPECT_NE(m.find("stage.forward"), std::string::npos) << m;
  m = message(R"({"stage": {"stash_bytes": -4}})");
  EXPECT_NE(m.find("stash_bytes"), std::string::npos) << m;
  m = message(R"({"links": [{"dst": 1}]})");
  EXPECT_NE(m.find("src"), std::string::npos) << m;
  m = message("{not json");
  EXPECT_NE(m.find("not valid JSON"), std::string::npos) << m;
  EXPECT_THROW(CostTable::load("/nonexistent/costs.json", 2), pipefb::UserError);
}

TEST(CostTableTest, TransferTime) {
  LinkCost free;
  EXPECT_EQ(free.transferTime(1 << 30), 0.0);
  LinkCost l{1e9, 1e-6};
  EXPECT_DOUBLE_EQ(l.transferTime(1000), 1e-6);
}
