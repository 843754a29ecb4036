#pragma once
// How many messages can wait on a device (Note [Waiting messages]).
#include <vector>

#include "pipefb/schedules/Schedule.h"

namespace pipefb::schedules {

/// Note [Waiting messages]
/// Channels copy a message into the receiver's memory when it is sent (comm_buffers),
/// and the receiver holds it until the action that consumes it. A sender that runs ahead
/// of its receiver therefore leaves messages waiting there. Devices run their lists
/// freely, ordered only by what they wait for, so a message can be waiting when a
/// compute action c of its receiver starts if its consumer comes after c on that device
/// and its producer does not have to wait for c (it is not reachable from c through
/// device order and the waits: activations F(s-1,m) -> F(s,m), gradients B/I(s+1,m) ->
/// B/I(s,m), the output and the stash F(s,m) -> B/I(s,m), SW -> RW, and for schedules
/// that step per microbatch the feed of an iteration after the last stage's backwards of
/// the previous one). The counts are upper bounds over the compute starts of the
/// schedule's compute-only lists; how many do wait depends on timing. The counts at
/// the backward starts alone are kept apart: a device that runs a stage's F and B peaks
/// in B, and gpipe's activations, for one, wait only at forward starts.
struct WaitingMessages {
  std::vector<int> activations;  // per stage s: inputs of F(s) waiting on its forward device
  std::vector<int> gradients;    // per stage s: output gradients waiting on its backward device
  // the same two counts, over the starts of B (or I) on that device only
  std::vector<int> activationsAtBackward, gradientsAtBackward;
  // outputs of F(S-1) waiting on the last stage's backward device; none are sent to a B that
  // recomputes (Note [Recomputed last output]), so the planner counts them only for the rest
  int outputs = 0;
};

WaitingMessages waitingMessages(const Schedule& schedule);

}  // namespace pipefb::schedules
