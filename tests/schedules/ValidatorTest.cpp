#include <gtest/gtest.h>

#include <algorithm>

#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/Validator.h"

using namespace pipefb::schedules;

namespace {

void removeToken(Schedule& s, int d, const std::string& token) {
  auto& list = s.devices[d];
  auto it =
      std::find_if(list.begin(), list.end(), [&](const Action& a) { return toString(a) == token; });
  ASSERT_NE(it, list.end()) << token;
  list.erase(it);
}

// Runs the validator and returns the message; fails the test if it accepts.
std::string rejection(const Schedule& s, const MemoryContract* c = nullptr) {
  try {
    validate(s, c);
  } catch (const ScheduleError& e) {
    return e.what();
  }
  ADD_FAILURE() << "validator accepted:\n" << toText(s);
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

long indexOfToken(const std::vector<Action>& list, const std::string& token) {
  for (size_t i = 0; i < list.size(); ++i)
    if (toString(list[i]) == token) return static_cast<long>(i);
  ADD_FAILURE() << token << " not found";
  return 0;
}

Schedule lowered(const std::string& kind, int S, int M, StashPolicy p = StashPolicy::Keep) {
  return lower(makeSchedule(kind, S, M), {p}, 1).schedule;
}

}  // namespace

TEST(ValidatorTest, MissingReceive) {
  Schedule s = lowered("1f1b", 2, 2);
  removeToken(s, 1, "RA0.0<0");
  std::string msg = rejection(s);
  EXPECT_TRUE(contains(msg, "missing receive")) << msg;
  EXPECT_TRUE(contains(msg, "[*F1.0*]")) << msg;
  EXPECT_TRUE(contains(msg, "dev0")) << msg;  // the grid header
}

TEST(ValidatorTest, ReceiveWithoutSend) {
  Schedule s = lowered("1f1b", 2, 2);
  removeToken(s, 0, "SA0.1>1");
  std::string msg = rejection(s);
  EXPECT_TRUE(contains(msg, "without a matching send")) << msg;
  EXPECT_TRUE(contains(msg, "[*RA0.1<0*]")) << msg;
}

TEST(ValidatorTest, SendNeverReceived) {
  Schedule s = parseSchedule(
      "stages 2\nmicrobatches 1\nplacement 0/0 1/1\n"
      "device 0: F0.0 SA0.0>1 RG1.0<1 B0.0\n"
      "device 1: RA0.0<0 F1.0 SA1.0>0 B1.0 SG1.0>0\n");
  std::string msg = rejection(s);
  EXPECT_TRUE(contains(msg, "never received")) << msg;
  EXPECT_TRUE(contains(msg, "[*SA1.0>0*]")) << msg;
}

TEST(ValidatorTest, BackwardBeforeForward) {
  Schedule s = lowered("1f1b", 2, 2);
  auto& list = s.devices[1];
  // RA0.0<0 F1.0 B1.0 ... -> RA0.0<0 B1.0 F1.0 ...
  std::iter_swap(list.begin() + 1, list.begin() + 2);
  std::string msg = rejection(s);
  EXPECT_TRUE(contains(msg, "B before F")) << msg;
  EXPECT_TRUE(contains(msg, "[*B1.0*]")) << msg;
  EXPECT_TRUE(contains(msg, "[*F1.0*]")) << msg;
}

TEST(ValidatorTest, CycleIsADeadlock) {
  Schedule s = parseSchedule(
      "stages 2\nmicrobatches 1\nplacement 0/0 1/1\n"
      "device 0: RG1.0<1 F0.0 SA0.0>1 B0.0\n"
      "device 1: RA0.0<0 F1.0 B1.0 SG1.0>0\n");
  std::string msg = rejection(s);
  EXPECT_TRUE(contains(msg, "deadlock")) << msg;
  EXPECT_TRUE(contains(msg, "[*RG1.0<1*]")) << msg;
  EXPECT_TRUE(contains(msg, "[*RA0.0<0*]")) << msg;
}

TEST(ValidatorTest, DeadlockFromWeightSyncOrder) {
  // The forward device waits for weights that the backward device only sends after a
  // backward that needs this forward's output.
  Schedule s = lowered("pipefb-sync", 1, 1);
  removeToken(s, 0, "RW0.0<1");
  s.devices[0].insert(s.devices[0].begin(), recvWeights(0, 0, 1));
  std::string msg = rejection(s);
  EXPECT_TRUE(contains(msg, "deadlock")) << msg;
  EXPECT_TRUE(contains(msg, "[*RW0.0<1*]")) << msg;
}

TEST(ValidatorTest, RendezvousSendWaitsForItsReceiver) {
  // Note [Message rendezvous]: devices 0 and 1 run only forwards, so SA0.0 waits until
  // device 1 is at RA0.0. Receiving microbatch 1 first is fine for a message that waits on
  // its receiver, and a deadlock for one sent at the receive.
  Schedule s = lowered("pipefb-async", 2, 2, StashPolicy::Offload);
  EXPECT_NO_THROW(validate(s));
  auto& list = s.devices[1];
  const long one = indexOfToken(list, "RA0.1<0");
  const Action ra = list[one];
  list.erase(list.begin() + one);
  list.insert(list.begin() + indexOfToken(list, "RA0.0<0"), ra);
  const std::string msg = rejection(s);
  EXPECT_TRUE(contains(msg, "deadlock")) << msg;
  EXPECT_TRUE(contains(msg, "[*SA0.0>1*]")) << msg;
  EXPECT_TRUE(contains(msg, "to reach its receive")) << msg;
}

TEST(ValidatorTest, AsyncStepWaitsForThePreviousRecvWeights) {
  // Note [Weights by reference]: pipefb-async's SW sends the weights themselves, so
  // STEP0.1 waits until RW0.0 took them. A forward device that runs RW0.1 first waits for
  // SW0.1, which comes after STEP0.1: a deadlock.
  Schedule s =
      lower(makeSchedule("pipefb-async", 1, 1, Placement::defaultFor("pipefb-async", 1), 3),
            {StashPolicy::Keep}, 1)
          .schedule;
  EXPECT_NO_THROW(validate(s));
  auto& list = s.devices[0];
  const long one = indexOfToken(list, "RW0.1<1");
  const Action rw = list[one];
  list.erase(list.begin() + one);
  list.insert(list.begin() + indexOfToken(list, "RW0.0<1"), rw);
  const std::string msg = rejection(s);
  EXPECT_TRUE(contains(msg, "deadlock")) << msg;
  EXPECT_TRUE(contains(msg, "[*STEP0.1*]")) << msg;
  EXPECT_TRUE(contains(msg, "for RW0.0 to take the weights")) << msg;
}

TEST(ValidatorTest, PrefetchMustPrecedeUse) {
  Schedule s = lowered("pipefb-sync", 2, 2);
  removeToken(s, 3, "PRE0.1");
  std::string msg = rejection(s);
  EXPECT_TRUE(contains(msg, "PRE0.1 must precede")) << msg;
  EXPECT_TRUE(contains(msg, "[*B0.1*]")) << msg;
}

TEST(ValidatorTest, MismatchedPeers) {
  Schedule s = lowered("1f1b", 3, 2);
  for (Action& a : s.devices[0])
    if (toString(a) == "SA0.0>1") a.peer = 2;
  std::string msg = rejection(s);
  EXPECT_TRUE(contains(msg, "mismatched")) << msg;
}

TEST(ValidatorTest, ContractViolationsAreReported) {
  SchedulePlan plan = lower(makeSchedule("1f1b", 4, 8), {StashPolicy::Keep}, 1);
  EXPECT_NO_THROW(validate(plan.schedule, &plan.contract));
  MemoryContract tight = plan.contract;
  tight.residentForward[1] = 2;  // 1F1B stage 1 of 4 holds 3
  tight.residentBackward[1] = 2;
  std::string msg = rejection(plan.schedule, &tight);
  EXPECT_TRUE(contains(msg, "memory contract")) << msg;
  EXPECT_TRUE(contains(msg, "stage 1")) << msg;

  SchedulePlan pd = lower(makeSchedule("pipedream", 3, 4, 2), {StashPolicy::Keep}, 1);
  MemoryContract fewVersions = pd.contract;
  fewVersions.weightVersions[0] = 2;  // PipeDream stage 0 of 3 needs 3
  msg = rejection(pd.schedule, &fewVersions);
  EXPECT_TRUE(contains(msg, "weight versions")) << msg;
}

TEST(ValidatorTest, OffloadedForwardDeviceResidencyIsChecked) {
  // Offload policy but the contract still says 0 resident on the forward device: remove the
  // OFF of a stage-0 stash and the validator must catch both the residency and the lost stash.
  SchedulePlan plan = lower(makeSchedule("1f1b", 2, 4), {StashPolicy::Offload}, 0);
  EXPECT_NO_THROW(validate(plan.schedule, &plan.contract));
  removeToken(plan.schedule, 0, "OFF0.1");
  std::string msg = rejection(plan.schedule, &plan.contract);
  EXPECT_FALSE(msg.empty());
}

TEST(ValidatorTest, GridMarksAndWindows) {
  Schedule s = lowered("1f1b", 2, 2);
  std::string grid = formatPipelineOrder(s, {{1, 2}});
  EXPECT_TRUE(contains(grid, "step")) << grid;
  EXPECT_TRUE(contains(grid, "[*B1.0*]")) << grid;
  // One row per step plus the header.
  size_t rows = std::count(grid.begin(), grid.end(), '\n');
  EXPECT_EQ(rows, 1 + std::max(s.devices[0].size(), s.devices[1].size()));
  Schedule big = lowered("1f1b", 4, 64);
  std::string window = formatPipelineOrder(big, {{0, 100}}, 10);
  EXPECT_LE(std::count(window.begin(), window.end(), '\n'), 13);
  EXPECT_TRUE(contains(window, "earlier steps")) << window;
  EXPECT_TRUE(contains(window, "[*")) << window;
}

// Seen under fuzz/ScheduleFuzzer (ASan/UBSan) while writing it: the validator sized its tables by
// stages x (largest index + 1), so a file naming F0.100000000 asked for gigabytes. Now a
// ScheduleError (UserError).
TEST(ValidatorTest, HugeIndexIsAUserErrorNotAnAllocation) {
  Schedule s = parseSchedule(
      "stages 2\nmicrobatches 1\nplacement 0/0 1/1\n"
      "device 0: F0.100000000\n");
  EXPECT_THROW(validate(s), pipefb::UserError);
}

// Note [Stashed weight versions]: the validator follows each stashed version.
TEST(ValidatorTest, WeightVersionActionsAreChecked) {
  SchedulePlan plan = lower(makeSchedule("pipedream", 2, 2, 2), {StashPolicy::Offload}, 1);
  ValidationStats ok = validate(plan.schedule, &plan.contract);
  // At B0.2's start version 1 is back and version 2 (never offloaded) is there: min(2, L+1).
  EXPECT_EQ(ok.peakResidentWeightVersions[0][0], 2);
  {
    Schedule s = plan.schedule;
    removeToken(s, 0, "PREW0.0");
    std::string msg = rejection(s, &plan.contract);
    EXPECT_TRUE(contains(msg, "PREW0.0 must precede")) << msg;
    EXPECT_TRUE(contains(msg, "[*B0.1*]")) << msg;
  }
  {
    Schedule s = plan.schedule;  // a DROPW before the B that needs the version
    removeToken(s, 0, "DROPW0.1");
    auto& list = s.devices[0];
    list.insert(list.begin() + indexOfToken(list, "B0.2"), drop(0, 1, StashKind::Weights));
    std::string msg = rejection(s, &plan.contract);
    EXPECT_TRUE(contains(msg, "1 backward(s) still need it")) << msg;
  }
  {
    // An OFFW before the last F on the version: on 3 stages F0.1 and F0.2 run on version 0
    // (F0.1 makes the snapshot), and OFFW0.0 follows F0.2.
    SchedulePlan three = lower(makeSchedule("pipedream", 3, 3, 2), {StashPolicy::Offload}, 1);
    Schedule s = three.schedule;
    removeToken(s, 0, "OFFW0.0");
    auto& list = s.devices[0];
    list.insert(list.begin() + indexOfToken(list, "F0.2"), offload(0, 0, StashKind::Weights));
    std::string msg = rejection(s, &three.contract);
    EXPECT_TRUE(
        contains(msg, "F0.2 runs on weight version 0 of stage 0, which is in the host pool"))
        << msg;
  }
  {
    Schedule t = plan.schedule;  // a version the schedule does not stash
    t.devices[1].push_back(offload(1, 0, StashKind::Weights));
    std::string msg = rejection(t, &plan.contract);
    EXPECT_TRUE(contains(msg, "not a stashed weight version")) << msg;
  }
  // Without the weight actions the versions stay: the weight-offload contract is broken.
  SchedulePlan keep = lower(makeSchedule("pipedream", 4, 4, 2), {StashPolicy::Offload}, 1, false);
  SchedulePlan off = lower(makeSchedule("pipedream", 4, 4, 2), {StashPolicy::Offload}, 1);
  EXPECT_EQ(off.contract.residentWeightVersions, (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(keep.contract.residentWeightVersions, (std::vector<int>{4, 3, 2, 1}));
  ValidationStats k = validate(keep.schedule, &keep.contract);
  EXPECT_EQ(k.peakResidentWeightVersions[0][0], 4);
  std::string msg = rejection(keep.schedule, &off.contract);
  EXPECT_TRUE(contains(msg, "stashed weight versions of stage 1 are resident on device 1")) << msg;
  ValidationStats o = validate(off.schedule, &off.contract);
  EXPECT_EQ(o.peakResidentWeightVersions[0][0], 2);
}

// Note [Split backward]: W needs its I on the same device, before it; I and B exclude each
// other; the deferred W's are checked against the contract.
TEST(ValidatorTest, SplitBackwardRules) {
  Schedule s = lowered("zb-h1", 2, 3);
  {
    Schedule t = s;
    auto& list = t.devices[1];
    const long i = indexOfToken(list, "I1.0"), w = indexOfToken(list, "W1.0");
    std::swap(list[i], list[w]);
    EXPECT_TRUE(contains(rejection(t), "W before I"));
  }
  {
    Schedule t = s;
    removeToken(t, 0, "W0.1");
    EXPECT_TRUE(contains(rejection(t), "I0.1 has no W0.1"));
  }
  {
    Schedule t = s;
    removeToken(t, 0, "W0.1");
    t.devices[1].push_back(W(0, 1));
    EXPECT_TRUE(contains(rejection(t), "W uses what I left on its device"));
  }
  {
    Schedule t = s;
    t.devices[0].push_back(B(0, 2));
    EXPECT_TRUE(contains(rejection(t), "a split backward"));
  }
  SchedulePlan plan = lower(makeSchedule("zb-h1", 2, 3), {StashPolicy::Keep}, 1);
  MemoryContract tight = plan.contract;
  ASSERT_GT(tight.deferredW[1], 0);
  --tight.deferredW[1];
  EXPECT_TRUE(contains(rejection(plan.schedule, &tight), "wait for their W"));
}

// Note [Abstract run]: the copy engine runs OFF and PRE in issue order. Device 1 queues
// PRE2.0 (F2.0 runs on device 0) ahead of its own OFF0.0; that PRE waits for OFF2.0, which
// waits for device 1's F1.0, whose OFF cannot be issued while OFF0.0 waits behind the PRE.
TEST(ValidatorTest, PrefetchAheadOfTheDevicesOwnOffloadIsADeadlock) {
  const Placement p({{1, 1}, {1, 1}, {0, 1}});
  Schedule s = lower(makeSchedule("pipefb-sync", 3, 1, p, 1), {StashPolicy::Offload}, 2).schedule;
  ASSERT_LT(indexOfToken(s.devices[1], "PRE2.0"), indexOfToken(s.devices[1], "OFF0.0"));
  std::string msg = rejection(s);
  EXPECT_TRUE(contains(msg, "deadlock")) << msg;
  EXPECT_TRUE(contains(msg, "device 1's copy engine waits at PRE2.0")) << msg;
  // One stash ahead (lookahead 1) the PRE comes after the device's own offloads: it runs.
  EXPECT_NO_THROW(
      validate(lower(makeSchedule("pipefb-sync", 3, 1, p, 1), {StashPolicy::Offload}, 1).schedule));
}
