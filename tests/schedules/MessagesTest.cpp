// Note [Waiting messages]: how many messages can wait on a device, on generated schedules.
#include <gtest/gtest.h>

#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/Messages.h"

namespace pipefb::schedules {
namespace {

WaitingMessages of(const std::string& kind, int S, int M, int K = 1) {
  return waitingMessages(makeSchedule(kind, S, M, K).schedule);
}

TEST(WaitingMessages, GpipeSendsEveryGradientAheadOfTheUpstreamBackwards) {
  // Device 1 runs F1.0..F1.3 then B1.3..B1.0 without waiting for device 0 after its
  // inputs: when B0.3 starts, the gradients of B0.2, B0.1, B0.0 may all be there; and
  // device 0's forwards run ahead of F1.0, so 3 activations may wait on device 1.
  const WaitingMessages w = of("gpipe", 2, 4);
  EXPECT_EQ(w.activations, (std::vector<int>{0, 3}));
  EXPECT_EQ(w.gradients, (std::vector<int>{3, 0}));
  EXPECT_EQ(w.outputs, 0);
  // At B starts alone: the gradients still wait at B0.3, but device 1's B's come after all
  // of its forwards, so no activation waits there (Note [Forward beside backward]).
  EXPECT_EQ(w.gradientsAtBackward, (std::vector<int>{3, 0}));
  EXPECT_EQ(w.activationsAtBackward, (std::vector<int>{0, 0}));
}

TEST(WaitingMessages, OneFOneBBoundsWhatWaitsByItsWarmUp) {
  // Device 0: F0.0 F0.1 B0.0 F0.2 B0.1 ...; at B0.0's start B1.1 may have run (it waits
  // only for F0.1), so one gradient beyond B0.0's own can wait. F0.2 waits for B0.0, so
  // no more than one activation waits on device 1 either.
  const WaitingMessages w = of("1f1b", 2, 4);
  EXPECT_EQ(w.activations, (std::vector<int>{0, 1}));
  EXPECT_EQ(w.gradients, (std::vector<int>{1, 0}));
}

TEST(WaitingMessages, PipefbLastStageOutputsWaitOnItsBackwardDevice) {
  // pipefb-sync, S = 2 on 4 devices: F(1) runs its 4 forwards without waiting for B(1),
  // so at B1.0's start the outputs of F1.1..F1.3 may wait on B(1)'s device.
  const WaitingMessages w = of("pipefb-sync", 2, 4);
  EXPECT_EQ(w.outputs, 3);
  // One microbatch: nothing can wait.
  const WaitingMessages one = of("pipefb-sync", 2, 1);
  EXPECT_EQ(one.outputs, 0);
  EXPECT_EQ(one.activations, (std::vector<int>{0, 0}));
  EXPECT_EQ(one.gradients, (std::vector<int>{0, 0}));
}

TEST(WaitingMessages, RecomputingLastBackwardHasNoOutputWaiting) {
  // Note [Recomputed last output]: a B(S-1) marked recompute is sent no output.
  const Schedule marked =
      markRecompute(makeSchedule("pipefb-sync", 2, 4).schedule, {StashPolicy::Checkpoint});
  EXPECT_EQ(waitingMessages(marked).outputs, 0);
  const Schedule kept =
      markRecompute(makeSchedule("pipefb-sync", 2, 4).schedule, {StashPolicy::Offload});
  EXPECT_EQ(waitingMessages(kept).outputs, 3);
}

TEST(WaitingMessages, PipefbSendsWithinAPassAtTheReceive) {
  // Note [Message rendezvous]: two forward devices (0: stages 0-1, 1: stages 2-3) feed
  // two backward devices (3: stages 0-2, 2: stage 3). Device 0's forwards could run three
  // microbatches ahead of device 1's, and device 2's backwards ahead of device 3's; in
  // PipeFB each such message is sent at its receive, so none waits. The last stage's
  // outputs go from a forward to a backward device and still may.
  const Placement p = Placement::parse("0/3 0/3 1/3 1/2", "test");
  for (const std::string kind : {"pipefb-sync", "pipefb-async"}) {
    SCOPED_TRACE(kind);
    const Schedule s = makeSchedule(kind, 4, 4, p, kind == "pipefb-sync" ? 1 : 3).schedule;
    EXPECT_EQ(rendezvousPasses(s), (std::vector<int>{1, 1, 2, 2}));
    const WaitingMessages w = waitingMessages(s);
    EXPECT_EQ(w.activations, (std::vector<int>{0, 0, 0, 0}));
    EXPECT_EQ(w.gradients, (std::vector<int>{0, 0, 0, 0}));
    EXPECT_GT(w.outputs, 0);
  }
  // Other kinds send when made: 1f1b's activations can wait.
  const Schedule oneF = makeSchedule("1f1b", 4, 4).schedule;
  EXPECT_EQ(rendezvousPasses(oneF), (std::vector<int>{0, 0, 0, 0}));
  EXPECT_GT(waitingMessages(oneF).activations.at(1), 0);
  // A folded device runs both passes: its messages are sent when made.
  EXPECT_EQ(rendezvousPasses(makeSchedule("pipefb-sync", 4, 4, Placement::folded(4), 1).schedule),
            (std::vector<int>{0, 0, 0, 0}));
}

}  // namespace
}  // namespace pipefb::schedules
