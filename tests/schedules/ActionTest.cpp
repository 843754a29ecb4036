#include <gtest/gtest.h>

#include "pipefb/common/Error.h"
#include "pipefb/schedules/Action.h"

using namespace pipefb::schedules;

TEST(ActionTest, PrintsShortForm) {
  EXPECT_EQ(toString(F(1, 3)), "F1.3");
  EXPECT_EQ(toString(B(0, 2)), "B0.2");
  EXPECT_EQ(toString(B(0, 2, true)), "BR0.2");
  EXPECT_EQ(toString(sendAct(1, 3, 4)), "SA1.3>4");
  EXPECT_EQ(toString(recvAct(1, 3, 2)), "RA1.3<2");
  EXPECT_EQ(toString(sendGrad(1, 3, 0)), "SG1.3>0");
  EXPECT_EQ(toString(recvGrad(1, 3, 5)), "RG1.3<5");
  EXPECT_EQ(toString(offload(1, 3)), "OFF1.3");
  EXPECT_EQ(toString(prefetch(1, 3)), "PRE1.3");
  EXPECT_EQ(toString(drop(1, 3)), "DROP1.3");
  EXPECT_EQ(toString(offload(1, 2, StashKind::Weights)), "OFFW1.2");
  EXPECT_EQ(toString(step(2, 0)), "STEP2.0");
  EXPECT_EQ(toString(syncWeights(1, 0, 3)), "SW1.0>3");
  EXPECT_EQ(toString(recvWeights(1, 0, 7)), "RW1.0<7");
  EXPECT_EQ(toString(allReduce(1, 4)), "AR1.4");
  EXPECT_EQ(toString(I(1, 3)), "I1.3");
  EXPECT_EQ(toString(I(1, 3, true)), "IR1.3");
  EXPECT_EQ(toString(W(1, 3)), "W1.3");
}

TEST(ActionTest, EveryTypeRoundTrips) {
  std::vector<Action> all = {F(0, 0),
                             B(12, 345),
                             B(1, 1, true),
                             sendAct(3, 9, 1),
                             recvAct(3, 9, 0),
                             sendGrad(2, 7, 11),
                             recvGrad(2, 7, 12),
                             offload(4, 5),
                             prefetch(4, 5),
                             drop(4, 5),
                             offload(4, 5, StashKind::Weights),
                             prefetch(4, 6, StashKind::Weights),
                             drop(4, 7, StashKind::Weights),
                             step(3, 2),
                             syncWeights(3, 2, 1),
                             recvWeights(3, 2, 6),
                             allReduce(0, 10),
                             I(2, 3),
                             I(2, 4, true),
                             W(2, 3)};
  std::set<int> types;
  for (const Action& a : all) {
    EXPECT_EQ(parseAction(toString(a)), a) << toString(a);
    types.insert(static_cast<int>(a.type));
  }
  EXPECT_EQ(static_cast<int>(types.size()), kNumActionTypes);
}

TEST(ActionTest, BadTokensNameTheTokenAndTheForms) {
  for (std::string bad :
       {"X1.2", "F1", "F1.", "F.2", "SA1.2", "SA1.2<3", "RA1.2>3", "F1.2>3", "B1.2x", "", "f1.2",
        "W1.2>3", "WR1.2", "I1.2<0", "STEP1.-1", "F99999999999.1"}) {
    try {
      parseAction(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const pipefb::UserError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("'" + bad + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("allowed"), std::string::npos) << msg;
    }
  }
}
