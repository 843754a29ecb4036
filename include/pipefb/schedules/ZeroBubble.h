#pragma once
// Schedules with a split backward (Note [Split backward], Action.h) and with several stages
// per device: ZB-H1, ZB-H2 and ZB-V (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"),
// Megatron's interleaved 1F1B, and pipefb-zb (PipeFB placement with W deferred).
//
// Note [Lagged W]
// ZB-H1 and ZB-H2 are 1F1B with B split into I and W: device d (stage d) warms up with w
// forwards, alternates F and I, and after I(m) runs W(m - L); the last L W's close the
// iteration. Later devices defer more W's, which fill the cool-down while the I chain
// crosses the pipeline at one I per hop:
//  * zb-h1: w = S-1-d (1F1B's), L = d. Unit costs: makespan 3M + S - 1 (1F1B: 3(M + S - 1)),
//    every device holds at most S stashes (1F1B's device 0) for M >= S;
//  * zb-h2: w = 2(S-1-d), L = 2d: up to 2S - 1 stashes, and no bubble between iterations
//    in steady state for M >= 2S - 1.
// (Found by enumerating w and L per device in unit time, S = 4, M = 8, and checked for
// S = 2..8; tests/sim/ZeroBubbleSimTest.cpp holds the goals.)
//
// Note [Greedy zero-bubble order]
// ZB-V and pipefb-zb order each device's actions by a list schedule of ONE iteration run in
// unit time (F = I = W = 1, communication free). Whenever a device is free it starts, in
// this order of preference:
//  1. the oldest I whose gradient (or, for the last stage, whose F) is there (then the
//     highest stage): it frees upstream devices, the I chain never waits for a W;
//  2. an F whose input is there, the highest stage first, under the device's hold: fewer
//     than hold - 1 stashes alive (F started, W not finished) for an F of the device's
//     lowest stage, fewer than hold for a later one (a V's second chunk always finds room);
//  3. the oldest deferred W.
// Each stage's F, I and W run in microbatch order.
//  * zbv: V placement (Placement::vShape), two stages per device, hold 2D stashes of half a
//    1F1B stage each: 1F1B's device-0 bytes;
//  * pipefb-zb: Placement::pipefb; forward devices run the forwards in order (as
//    pipefb-sync); backward devices run I as soon as its gradient is there, send it, and
//    then run W (at most one deferred W, Note [PipeFB with a split backward]).
//
// Note [PipeFB with a split backward]
// In pipefb-sync the backward chain B(S-1) -> ... -> B(0) passes a gradient on after a
// whole B: its fill is (S-1) B. Split, a backward device passes it on after I, so the fill
// is (S-1) I and an iteration is (S-1) W shorter (unit costs S = 4, M = 8: 23 against 26).
// Deferring W further gains nothing there: a backward device has 2 units of work per
// microbatch and receives one per unit, so it is never idle once started, and every W held
// back keeps a stash on it (with no cap, all M: 23 units as well, at 8 stashes per
// backward device instead of 2). So W runs right after its I (cap 1); the deferral that
// pays is the I chain's, which releases the upstream backward devices a W earlier.
//
// Iteration k repeats the order on microbatches kM..kM+M-1; each stage's STEP follows its
// device's last W of the iteration (no global flush: each stage steps once its own
// gradients are complete, the paper's post-validation placement). pipefb-zb adds SW/RW as
// pipefb-sync does. The contract is counted from the lists (contractFromOrder).
#include "pipefb/schedules/Generators.h"

namespace pipefb::schedules {

SchedulePlan zbH1(int S, int M, const Placement& placement, int iterations = 1);
SchedulePlan zbH2(int S, int M, const Placement& placement, int iterations = 1);
/// V-shape: S = 2D stages, stage s on device min(s, S-1-s) (Placement::vShape).
SchedulePlan zbv(int S, int M, const Placement& placement, int iterations = 1);
/// PipeFB placement (forward and backward devices all distinct), W deferred.
SchedulePlan pipefbZb(int S, int M, const Placement& placement, int iterations = 1);

/// Megatron-LM's interleaved 1F1B: D devices, v = S / D stages per device, stage s on device
/// s mod D (Placement::looped). Device d warms up with min(vM, 2(D-d-1) + (v-1)D) forwards,
/// then alternates F and B, forwards and backwards walking the chunks in groups of D
/// microbatches (backwards from the last chunk). Needs M a multiple of D, v >= 2.
SchedulePlan interleaved1F1B(int S, int M, const Placement& placement, int iterations = 1);
/// ZB1P of the zero-bubble paper over v chunks, in the order of torch.distributed.pipelining's
/// ScheduleInterleavedZeroBubble (Note [Interleaved zero bubble]): interleaved-1f1b's order
/// with each B split into I and W, min(vM, (D-d-1) + (v-1)D) warm-up forwards on device d, and
/// after its k-th I (k >= d) the W of its (k-d)-th. Same placement and shapes as
/// interleaved-1f1b.
SchedulePlan interleavedZb(int S, int M, const Placement& placement, int iterations = 1);

/// Whether makeSchedule(kind, S, M, K) (the kind's default placement) accepts S stages and
/// M microbatches: zbv needs S even; interleaved-1f1b and interleaved-zb (v = 2) S even and M a
/// multiple of S / 2; every other kind takes any S, M >= 1. The generators refuse the rest with a
/// UserError; tables of shapes in the tests skip them.
bool takesShape(const std::string& kind, int S, int M);

/// The contract of a schedule's compute order: for a same-device stage, the stashes alive
/// on its device at compute starts (in flight == resident); for a split stage M in flight
/// per iteration, as pipefb-sync; deferredW from the I-done-W-pending counts.
MemoryContract contractFromOrder(const Schedule& schedule);

}  // namespace pipefb::schedules
