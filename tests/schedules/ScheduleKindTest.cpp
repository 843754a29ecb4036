// The one schedule-kind table (pipefb/schedules/ScheduleKind.h): its traits agree with
// what the generators make, so a row added for a new kind is checked the same way.
#include <gtest/gtest.h>

#include "pipefb/common/Error.h"
#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/ScheduleKind.h"
#include "pipefb/schedules/ZeroBubble.h"

using namespace pipefb::schedules;

TEST(ScheduleKindTest, NamesRoundTripInEnumOrder) {
  const auto names = scheduleKindNames();
  ASSERT_EQ(names.size(), scheduleKinds().size());
  for (size_t i = 0; i < names.size(); ++i) {
    const ScheduleKind k = parseScheduleKind(names[i]);
    EXPECT_EQ(static_cast<size_t>(k), i) << names[i];
    EXPECT_EQ(names[i], toString(k));
  }
  ScheduleKind out = ScheduleKind::GPipe;
  EXPECT_FALSE(findScheduleKind("pipefb", out));
  try {
    parseScheduleKind("1f1f");
    FAIL() << "no UserError";
  } catch (const pipefb::UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("did you mean '1f1b'"), std::string::npos) << msg;
    for (const auto& n : names) EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
}

TEST(ScheduleKindTest, TraitsMatchTheGenerators) {
  const int S = 4, M = 4, K = 3;
  for (const auto& row : scheduleKinds()) {
    SCOPED_TRACE(row.name);
    ASSERT_TRUE(takesShape(row.name, S, M));
    const SchedulePlan plan = makeSchedule(row.kind, S, M, Placement::defaultFor(row.kind, S), K);
    const Schedule& s = plan.schedule;
    // splitPlacement: the default placement runs F and B of every stage on two devices.
    for (int st = 0; st < S; ++st) EXPECT_EQ(s.placement.split(st), usesSplitPlacement(row.kind));
    // stepPerMicrobatch: K*M STEPs per stage, else K.
    int steps = 0, inputGrads = 0;
    for (const auto& list : s.devices)
      for (const Action& a : list) {
        steps += a.type == ActionType::Step && a.stage == 0;
        inputGrads += a.type == ActionType::InputGrad;
      }
    EXPECT_EQ(inputGrads > 0, splitsBackward(row.kind));
    EXPECT_EQ(steps, stepsPerMicrobatch(row.kind) ? K * M : K);
    // async: a forward runs on a weight version older than its backward's, which needs
    // more than one version of some stage; a flushing schedule never does.
    int versions = 0;
    for (int v : plan.contract.weightVersions) versions = std::max(versions, v);
    EXPECT_EQ(versions > 1, isAsync(row.kind));
    EXPECT_EQ(isFlushing(row.kind), !isAsync(row.kind));
  }
}
