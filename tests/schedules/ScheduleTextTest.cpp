#include <gtest/gtest.h>

#include "pipefb/common/Error.h"
#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/Schedule.h"
#include "pipefb/schedules/Validator.h"
#include "pipefb/schedules/ZeroBubble.h"

using namespace pipefb::schedules;

TEST(ScheduleTextTest, EveryGeneratedAndLoweredScheduleRoundTrips) {
  for (const std::string& kind : scheduleKindNames())
    for (auto [S, M] : {std::pair{1, 1}, {3, 2}, {4, 10}, {7, 3}, {6, 3}})
      for (int K : {1, 3})
        for (StashPolicy p : {StashPolicy::Keep, StashPolicy::CheckpointOffload}) {
          if (!takesShape(kind, S, M)) continue;
          SchedulePlan plan = makeSchedule(kind, S, M, K);
          for (const Schedule& s : {plan.schedule, lower(plan, {p}, 1).schedule}) {
            std::string text = toText(s);
            Schedule back = parseSchedule(text);
            EXPECT_EQ(back, s) << kind << " " << S << "x" << M;
            EXPECT_EQ(toText(back), text);
          }
        }
}

TEST(ScheduleTextTest, ParseErrorNamesLineAndToken) {
  std::string text =
      "kind custom\nstages 2\nmicrobatches 1\nplacement 0/0 1/1\n"
      "device 0: F0.0 SA0.0>1\n"
      "device 1: RA0.0<0 F1.0 Q1.0 B1.0\n";
  try {
    parseSchedule(text, "mine.txt");
    FAIL() << "accepted a bad token";
  } catch (const pipefb::UserError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("mine.txt:6"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'Q1.0'"), std::string::npos) << msg;
  }
}

TEST(ScheduleTextTest, RejectsInconsistentHeaders) {
  EXPECT_THROW(parseSchedule("stages 2\nmicrobatches 1\nplacement 0/0\n"), pipefb::UserError);
  EXPECT_THROW(parseSchedule("stages 1\nmicrobatches 1\n"), pipefb::UserError);
  EXPECT_THROW(parseSchedule("stages 1\nmicrobatches 0\nplacement 0/0\n"), pipefb::UserError);
  EXPECT_THROW(parseSchedule("stages 1\nmicrobatches 1\nplacement 0/0\ndevice 3: F0.0\n"),
               pipefb::UserError);
  EXPECT_THROW(parseSchedule("stages 1\nmicrobatches 1\nplacement 0/0\ndevice 0: F4.0\n"),
               pipefb::UserError);
  EXPECT_THROW(parseSchedule("stages 1\nmicrobatches 1\nplacement 0/0\nbogus 1\n"),
               pipefb::UserError);
  // Comments, blank lines and repeated device lines are fine.
  Schedule s = parseSchedule(
      "# hi\n\nstages 1\nmicrobatches 2\nplacement 0/0\ndevice 0: F0.0 F0.1 # two\n"
      "device 0: B0.0 B0.1\n");
  ASSERT_EQ(s.devices.size(), 1u);
  EXPECT_EQ(s.devices[0].size(), 4u);
}

// Seen under fuzz/ScheduleFuzzer (ASan/UBSan) while writing it: a placement naming device
// 2147483647 overflowed `forward + 1`; one naming device 2000000000 made the parser allocate two
// billion action lists; huge microbatches x iterations overflowed totalMicrobatches(). All are
// UserErrors.
TEST(ScheduleTextTest, RejectsHugeDevicesAndCounts) {
  for (const char* text : {"stages 1\nmicrobatches 1\nplacement 0/2147483647\n",
                           "stages 1\nmicrobatches 1\nplacement 0/2000000000\n",
                           "stages 1\nmicrobatches 1\nplacement 100000/0\n",
                           "stages 1\nmicrobatches 2000000000\niterations 2\nplacement 0/0\n"})
    EXPECT_THROW(parseSchedule(text), pipefb::UserError) << text;
  // The largest device index is still fine.
  EXPECT_EQ(parseSchedule("stages 1\nmicrobatches 1\nplacement 0/99999\n").numDevices(), 100000);
}

TEST(Placement, ParsesItsTextAndChecksItFitsTheKind) {
  auto p = Placement::parse(" 0/3  1/2 ", "<t>");
  EXPECT_EQ(p.toString(), "0/3 1/2");
  EXPECT_EQ(p, Placement::pipefb(2));
  p.checkFor("pipefb-sync", 4, "<t>");
  auto fails = [](auto f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "expected a UserError mentioning " << needle;
    } catch (const pipefb::UserError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind("<t>: ", 0), 0u) << e.what();
    }
  };
  fails([] { Placement::parse("0-3 1/2", "<t>"); }, "bad placement entry '0-3'");
  fails([] { Placement::parse("0/x", "<t>"); }, "bad placement entry '0/x'");
  fails([] { Placement::parse("0/-1", "<t>"); }, "bad placement entry");
  fails([] { Placement::parse("  ", "<t>"); }, "empty placement");
  fails([] { Placement::parse("0/3 1/2", "<t>").checkFor("pipefb-sync", 3, "<t>"); },
        "devices.count is 3");
  fails([] { Placement::parse("0/0 1/1", "<t>").checkFor("pipefb-async", 4, "<t>"); },
        "splits at least one stage");
  // Note [Folded placements]: one stage's forward and another's backward may share a device,
  // and a stage that is not split may sit in the middle.
  Placement::parse("0/3 1/2 2/1 3/0", "<t>").checkFor("pipefb-sync", 4, "<t>");
  Placement::parse("0/2 1/1 2/0", "<t>").checkFor("pipefb-async", 3, "<t>");
  fails([] { Placement::parse("0/1 1/1", "<t>").checkFor("1f1b", 2, "<t>"); },
        "runs F and B on two devices");
  fails([] { Placement::parse("0/0 0/0", "<t>").checkFor("gpipe", 2, "<t>"); },
        "device 0 runs the forward of stages 0 and 1");
  // Note [Decoupled partitions]: two forward devices may feed one backward device, but a
  // device runs one run of consecutive stages per pass.
  Placement::parse("0/2 1/2", "<t>").checkFor("pipefb-sync", 4, "<t>");
  Placement::parse("0/1 0/2 0/3", "<t>").checkFor("pipefb-async", 4, "<t>");
  fails([] { Placement::parse("0/2 1/3 3/2", "<t>").checkFor("pipefb-sync", 4, "<t>"); },
        "device 2 runs the backward of stages 0 and 2 but not of the stages between");
  fails([] { Placement::parse("0/1 2/1 0/1", "<t>").checkFor("pipefb-sync", 4, "<t>"); },
        "device 0 runs the forward of stages 0 and 2 but not of the stages between");
}

TEST(Lowering, PerStageLookahead) {
  auto raw = makeSchedule("1f1b", 3, 6, Placement::sameDevice(3), 1);
  auto plan = lower(raw, {StashPolicy::Offload}, std::vector<int>{0, 2, 1});
  EXPECT_EQ(plan.contract.residentBackward, (std::vector<int>{1, 2, 1}));  // min(inFlight, la+1)
  validate(plan.schedule, &plan.contract);
  EXPECT_THROW(lower(raw, {StashPolicy::Offload}, std::vector<int>{1, 1}), pipefb::UserError);
  EXPECT_THROW(lower(raw, {StashPolicy::Offload}, std::vector<int>{-1}), pipefb::UserError);
}
