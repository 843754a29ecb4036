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

TEST(WaitingMessages, GpipeSendsActivationsAndGradientsAtTheReceive) {
  // Device 0's forwards could run ahead of F1.0, and device 1's backwards ahead of device
  // 0's; each activation goes out only when F1's device waits for it at RA1.m, and each
  // gradient when B0's device waits for it (Note [Message rendezvous]): none waits.
  const WaitingMessages w = of("gpipe", 2, 4);
  EXPECT_EQ(w.activations, (std::vector<int>{0, 0}));
  EXPECT_EQ(w.gradients, (std::vector<int>{0, 0}));
  EXPECT_EQ(w.outputs, 0);
  EXPECT_EQ(w.gradientsAtBackward, (std::vector<int>{0, 0}));
  EXPECT_EQ(w.activationsAtBackward, (std::vector<int>{0, 0}));
}

TEST(WaitingMessages, ListsTooLongForSixteenBitPositionsCountTheSame) {
  // Note [Waiting messages speed]: positions are 16-bit numbers only while every list is
  // shorter than 32767 actions. S = 2, M = 100: over 160 iterations a device has 32000
  // actions (16-bit positions), over 170 it has 34000 (int: 16-bit ones would wrap, and
  // count activations that cannot wait). Every count is the one of 2 iterations.
  for (const std::string kind : {"gpipe", "1f1b"}) {
    const WaitingMessages base = of(kind, 2, 100, 2);
    if (kind == "1f1b") EXPECT_EQ(base.activations, (std::vector<int>{0, 1}));
    if (kind == "gpipe") EXPECT_EQ(base.inputsAtBackward, 100);
    for (int K : {160, 170}) {
      const WaitingMessages w = of(kind, 2, 100, K);
      EXPECT_EQ(w.activations, base.activations) << kind << " " << K << " iterations";
      EXPECT_EQ(w.activationsAtBackward, base.activationsAtBackward) << kind << " " << K;
      EXPECT_EQ(w.gradients, base.gradients) << kind << " " << K;
      EXPECT_EQ(w.inputsAtBackward, base.inputsAtBackward) << kind << " " << K;
    }
  }
}

TEST(WaitingMessages, OneFOneBBoundsWhatWaitsByItsWarmUp) {
  // Device 0: F0.0 F0.1 B0.0 F0.2 B0.1 ...; F0.2 waits for B0.0, so no more than one
  // activation waits on device 1. B1.1 may run before B0.0 starts (it waits only for
  // F0.1), but its gradient goes out at RG0.1: none waits on device 0.
  const WaitingMessages w = of("1f1b", 2, 4);
  EXPECT_EQ(w.activations, (std::vector<int>{0, 1}));
  EXPECT_EQ(w.gradients, (std::vector<int>{0, 0}));
}

TEST(WaitingMessages, NextIterationIsFedOnceTheLossesAreKnown) {
  // pipedream, S = 2, M = 1, 3 iterations. Device 1: F1.0 B1.0 F1.1 B1.1 F1.2 B1.2. The
  // feed of iteration k + 1 waits for B1.k's loss, which B1.k computes first: F0.(k+1)
  // may run and send its activation while B1.k still runs, so one activation can wait at
  // a B start on device 1 (none when the feed waited for B1.k's end).
  const WaitingMessages w = of("pipedream", 2, 1, 3);
  EXPECT_EQ(w.activationsAtBackward, (std::vector<int>{0, 1}));
  // Within one iteration nothing is fed: no activation waits at device 1's B.
  EXPECT_EQ(of("pipedream", 2, 1, 1).activationsAtBackward, (std::vector<int>{0, 0}));
}

TEST(WaitingMessages, PipefbLastStageOutputsWaitOnAFoldedBackwardDevice) {
  // pipefb-sync, S = 2 folded (device 0: F0 and B1, device 1: F1 and B0): F(1) runs its 4
  // forwards but the last before B0.0, so at B1.0's start on device 0 the outputs of F1.1
  // and F1.2 may wait there (F1.3 follows B0.0, which needs B1.0's gradient).
  const WaitingMessages w =
      waitingMessages(makeSchedule("pipefb-sync", 2, 4, Placement::folded(2), 1).schedule);
  EXPECT_EQ(w.outputs, 2);
  // In the 2S form the output goes from a forward-only device to a backward-only one: it
  // is sent at its receive, right before B(1) (Note [Message rendezvous]); none waits.
  EXPECT_EQ(of("pipefb-sync", 2, 4).outputs, 0);
  EXPECT_EQ(of("pipefb-async", 3, 4, 3).outputs, 0);
  EXPECT_EQ(of("pipefb-async", 3, 4, 3).outputsAtLoss, 0);
  // One microbatch: nothing can wait.
  const WaitingMessages one =
      waitingMessages(makeSchedule("pipefb-sync", 2, 1, Placement::folded(2), 1).schedule);
  EXPECT_EQ(one.outputs, 0);
  EXPECT_EQ(one.activations, (std::vector<int>{0, 0}));
  EXPECT_EQ(one.gradients, (std::vector<int>{0, 0}));
}

TEST(WaitingMessages, OutputsOfTheNextIterationWaitOnlyAfterTheLoss) {
  // Note [Outputs at the loss]: pipefb-async, S = 3, M = 4, 3 iterations, placed 0/2 1/2
  // 2/0 (device 0 runs F0 and B2, device 2 B0, B1 and F2: both run both passes, so the
  // output is sent when made). At the start of B2.0 three outputs can wait, F2.1..F2.3;
  // beside the losses of an iteration only two of its own (F2.(kM+3) waits for B0 of the
  // iteration's second microbatch on device 2, which follows B2.(kM+1)).
  const Placement p = Placement::parse("0/2 1/2 2/0", "test");
  const WaitingMessages w = waitingMessages(makeSchedule("pipefb-async", 3, 4, p, 3).schedule);
  EXPECT_EQ(w.outputs, 3);
  EXPECT_EQ(w.outputsAtLoss, 2);
  // pipefb-sync folded, one iteration: every output that waits is of B's own iteration.
  const WaitingMessages sync =
      waitingMessages(makeSchedule("pipefb-sync", 3, 4, Placement::folded(3), 1).schedule);
  EXPECT_EQ(sync.outputs, 3);
  EXPECT_EQ(sync.outputsAtLoss, sync.outputs);
}

TEST(WaitingMessages, RecomputingLastBackwardHasNoOutputWaiting) {
  // Note [Recomputed last output]: a B(S-1) marked recompute is sent no output.
  const Schedule folded = makeSchedule("pipefb-sync", 3, 4, Placement::folded(3), 1).schedule;
  EXPECT_EQ(waitingMessages(markRecompute(folded, {StashPolicy::Checkpoint})).outputs, 0);
  EXPECT_EQ(waitingMessages(markRecompute(folded, {StashPolicy::Offload})).outputs, 3);
}

TEST(WaitingMessages, PipefbSendsWithinAPassAtTheReceive) {
  // Note [Message rendezvous]: two forward devices (0: stages 0-1, 1: stages 2-3) feed
  // two backward devices (3: stages 0-2, 2: stage 3). Device 0's forwards could run three
  // microbatches ahead of device 1's, and device 2's backwards ahead of device 3's; in
  // PipeFB each such message is sent at its receive, so none waits; so is the last stage's
  // output, from forward-only device 1 to backward-only device 2.
  const Placement p = Placement::parse("0/3 0/3 1/3 1/2", "test");
  for (const std::string kind : {"pipefb-sync", "pipefb-async"}) {
    SCOPED_TRACE(kind);
    const Schedule s = makeSchedule(kind, 4, 4, p, kind == "pipefb-sync" ? 1 : 3).schedule;
    EXPECT_EQ(rendezvousPasses(s), (std::vector<int>{1, 1, 2, 2}));
    const WaitingMessages w = waitingMessages(s);
    EXPECT_EQ(w.activations, (std::vector<int>{0, 0, 0, 0}));
    EXPECT_EQ(w.gradients, (std::vector<int>{0, 0, 0, 0}));
    EXPECT_EQ(w.outputs, 0);
    EXPECT_TRUE(rendezvous(rendezvousPasses(s), 1, 2, MessageKind::Output));
    EXPECT_FALSE(rendezvous(rendezvousPasses(s), 2, 1, MessageKind::Output));
  }
  // 1f1b sends its gradients at the receive, its activations when made: they can wait.
  const Schedule oneF = makeSchedule("1f1b", 4, 4).schedule;
  EXPECT_EQ(rendezvousPasses(oneF), (std::vector<int>{3, 3, 3, 3}));
  EXPECT_GT(waitingMessages(oneF).activations.at(1), 0);
  EXPECT_EQ(waitingMessages(oneF).gradients, (std::vector<int>{0, 0, 0, 0}));
  EXPECT_TRUE(rendezvous(rendezvousPasses(oneF), 1, 0, MessageKind::Gradient));
  EXPECT_FALSE(rendezvous(rendezvousPasses(oneF), 0, 1, MessageKind::Activation));
  // gpipe sends its activations at the receive too: none waits.
  const Schedule gpipe = makeSchedule("gpipe", 4, 4).schedule;
  EXPECT_EQ(rendezvousPasses(gpipe), (std::vector<int>{4, 4, 4, 4}));
  EXPECT_EQ(waitingMessages(gpipe).activations, (std::vector<int>{0, 0, 0, 0}));
  EXPECT_EQ(waitingMessages(gpipe).gradients, (std::vector<int>{0, 0, 0, 0}));
  EXPECT_TRUE(rendezvous(rendezvousPasses(gpipe), 0, 1, MessageKind::Activation));
  // Interleaved and zero-bubble kinds send when made.
  EXPECT_EQ(rendezvousPasses(makeSchedule("zb-h1", 4, 4).schedule), (std::vector<int>{0, 0, 0, 0}));
  // A folded device runs both passes: its messages are sent when made.
  EXPECT_EQ(rendezvousPasses(makeSchedule("pipefb-sync", 4, 4, Placement::folded(4), 1).schedule),
            (std::vector<int>{0, 0, 0, 0}));
}

TEST(WaitingMessages, InputsWaitAtStageZerosBackwardsUntilTheirForward) {
  // 1f1b, S = 2, M = 4: device 0 runs F0.0 F0.1 B0.0 F0.2 B0.1 F0.3 B0.2 B0.3; the
  // iteration's 4 inputs are fed at its start, so at B0.0 those of F0.2 and F0.3 wait.
  EXPECT_EQ(of("1f1b", 2, 4).inputsAtBackward, 2);
  // gpipe runs every forward before its first backward: none waits there.
  EXPECT_EQ(of("gpipe", 2, 4).inputsAtBackward, 0);
  // Folded pipefb-sync, S = 3: device 0 runs F0.j in slot j and B2.j in slot 3 + j,
  // forwards first, so at B2.0 the inputs of F0.4 .. F0.(M-1) wait: M - S - 1 of them.
  auto folded = [](int M) {
    return waitingMessages(makeSchedule("pipefb-sync", 3, M, Placement::folded(3), 1).schedule);
  };
  EXPECT_EQ(folded(2).inputsAtBackward, 0);
  EXPECT_EQ(folded(6).inputsAtBackward, 2);
  // With M = 2 every forward of the iteration runs before its device's first backward:
  // the activation that can wait for F2 on the device of F2 and B0 waits at F starts only
  // (PlanRunsTest seed 1 instance 8, Note [Folded pace] in planner/CostModel.h).
  const WaitingMessages two = folded(2);
  EXPECT_GT(two.activations.at(2), two.activationsAtBackward.at(2));
  EXPECT_EQ(two.activationsAtBackward.at(2), 0);
}

TEST(WaitingMessages, AFoldedDeviceHoldsItsTwoStagesMessagesTogetherAtMostAsOneCount) {
  // Note [Messages held together]: pipefb-sync folded, S = 3, M = 4; device 2 runs
  // F2.0-3, then B0.0-3. At F2.0's start the activations of F1.1-3 can wait (no gradient:
  // B1.0 needs F2.0), at F2.3's the gradients of B1.0-2 (no activation: F1.3's is F2.3's
  // own), between them some of each; at B0.0's start the gradients of B1.1-3. Each stage's
  // own count is 3, so summed they are 6; together never more than 3.
  const WaitingMessages w =
      waitingMessages(makeSchedule("pipefb-sync", 3, 4, Placement::folded(3), 1).schedule);
  EXPECT_EQ(w.activations.at(2), 3);
  EXPECT_EQ(w.gradients.at(0), 3);
  using H = WaitingMessages::Held;
  ASSERT_EQ(w.together.size(), 3u);
  EXPECT_EQ(w.together[2], (std::vector<H>{{3, 0, 0}, {2, 1, 0}, {1, 2, 0}, {0, 3, 0}}));
  EXPECT_EQ(w.togetherAtBackward[2], (std::vector<H>{{0, 3, 0}}));
  // Device 0 runs F0 (fed inputs, no activations) and B2, which is sent outputs.
  EXPECT_EQ(w.together[0], (std::vector<H>{{0, 0, 3}}));
  // No combination is covered by another, and each is within the per-stage counts.
  for (const auto& set : w.together)
    for (const H& a : set)
      for (const H& b : set)
        if (&a != &b) EXPECT_FALSE(a[0] >= b[0] && a[1] >= b[1] && a[2] >= b[2]);
}

}  // namespace
}  // namespace pipefb::schedules
