#pragma once
// Placement: stage -> (forward device, backward device).
#include <cstdint>
#include <string>
#include <vector>

#include "pipefb/common/Error.h"
#include "pipefb/schedules/ScheduleKind.h"

namespace pipefb::schedules {

struct StagePlacement {
  int forward = 0;
  int backward = 0;
  bool operator==(const StagePlacement& o) const {
    return forward == o.forward && backward == o.backward;
  }
};

/// Device indices are below this (a placement or a schedule file naming more is a UserError).
constexpr int kMaxDevices = 100000;

class Placement {
 public:
  Placement() = default;
  explicit Placement(std::vector<StagePlacement> stages);

  /// Stage s on device s for both passes (GPipe, 1F1B, PipeDream).
  static Placement sameDevice(int numStages);
  /// PipeFB default for 2S devices: F(s) on device s, B(s) on device 2S-1-s, so activations
  /// flow one way: F0 -> ... -> F(S-1) -> B(S-1) -> ... -> B0.
  static Placement pipefb(int numStages);
  /// Interleaved (Megatron's virtual stages): `virtualStages` v stages per device, stage s on
  /// device s mod (S/v) for both passes. S not a multiple of v is a UserError naming
  /// pipeline.virtual_stages.
  static Placement looped(int numStages, int virtualStages);
  /// ZB-V: S = 2D stages on D devices in a V, stage s on device min(s, S-1-s) for both
  /// passes: device 0 holds the first and the last stage. S odd is a UserError.
  static Placement vShape(int numStages);
  /// Note [Folded placements]
  /// Folded PipeFB on S devices: device d runs F of stage d and B of stage S-1-d, so every
  /// device does about F + B of work (as in 1F1B) while each stage's forward and backward
  /// still run on two devices and its stash still goes through the host pool. Activations
  /// go round a ring: F0 on 0 -> ... -> F(S-1) on S-1 -> B(S-1) on 0 -> ... -> B0 on S-1.
  /// With odd S the middle stage runs F and B on device (S-1)/2 (a stage that is not split).
  /// ZB-V places its stages by the same mirror, foldedDevice() (vShape()).
  static Placement folded(int numStages);
  /// Note [Decoupled partitions]
  /// PipeFB's forward chain and backward chain may be cut at different layers and run on
  /// different numbers of devices (issue 16): one forward device feeding three backward
  /// devices, two feeding four, a backward range that spans two forward ranges, a forward
  /// range whose layers go to two backward devices. The representation adds nothing new:
  ///  * The chain is cut at the UNION of the forward cuts and the backward cuts (decouple()).
  ///    Each segment is an ordinary stage with its own forward and backward device, so "one
  ///    forward device feeds three backward devices" is the placement "0/1 0/2 0/3" on three
  ///    segments, and plan files, pipeline.placement and --placement carry it as they carry
  ///    any placement.
  ///  * A forward range is a maximal run of consecutive stages with the same forward device
  ///    (forwardRanges()); a backward range likewise with the same backward device.
  ///    checkFor() allows a pipefb device the forwards of one range and the backwards of one
  ///    range, nothing else: the 2S form, folded() and the odd-S middle stage are the special
  ///    cases with one stage per range. Device numbers are free (forward ranges in chain
  ///    order on ascending devices is the natural dataflow, not a rule).
  ///  * Every segment boundary of a split stage is stashed by its forward device and goes
  ///    through the host pool (Note [PipeFB hand-off]); checkpoint kinds recompute each
  ///    segment from its own stashed input, the nearest stashed boundary, which never holds
  ///    more recompute memory than recomputing a whole range would.
  ///  * Consecutive segments on one device pass activations (and gradients) locally, as
  ///    zbv's turn does: addCommunication makes no message between them and the runtime
  ///    keeps the tensor in the device's own maps (no copy, no host round trip).
  /// The generators order a device's actions by the slots of Note [PipeFB device order],
  /// counted in ranges, not stages.
  static Placement decoupled(const std::vector<int>& forwardDevices,
                             const std::vector<int>& backwardDevices);
  /// A maximal run of consecutive stages [first, last) whose forward (or backward) device is
  /// `device` (Note [Decoupled partitions]).
  struct StageRun {
    int first = 0;
    int last = 0;
    int device = 0;
    bool operator==(const StageRun& o) const {
      return first == o.first && last == o.last && device == o.device;
    }
  };
  /// Every placement of `numStages` stages on devices 0..devices-1 that checkFor() accepts
  /// for the pipefb kinds, in a fixed order: (devices^2)^numStages candidates, so for tests
  /// and brute force on small instances only.
  static std::vector<Placement> everyPipefb(int numStages, int devices);
  /// The forward ranges in chain order (first stage 0).
  std::vector<StageRun> forwardRanges() const;
  /// The backward ranges in chain order (first stage 0; the backward pass meets them last
  /// to first).
  std::vector<StageRun> backwardRanges() const;
  /// The mirror fold of position i in a chain of n onto n/2 (rounded up) devices:
  /// min(i, n-1-i). folded() puts B(s) on F(n-1-s)'s device; vShape() puts stage s there.
  static int foldedDevice(int i, int n) { return i < n - 1 - i ? i : n - 1 - i; }
  /// Virtual stages per device of looped() when none is given (pipeline.virtual_stages: 0).
  static constexpr int kDefaultVirtualStages = 2;
  /// The default placement of a schedule kind (DefaultPlacement: sameDevice, pipefb, looped
  /// with `virtualStages` stages per device, vShape). By name: an unknown name is a
  /// UserError.
  static Placement defaultFor(ScheduleKind kind, int numStages,
                              int virtualStages = kDefaultVirtualStages);
  static Placement defaultFor(const std::string& kind, int numStages,
                              int virtualStages = kDefaultVirtualStages);
  /// Note [Stages per device]
  /// The default placement of `kind` puts `stages` stages on every `devices` devices:
  /// 1 on 1 (same device), 1 on 2 (pipefb), v on 1 (looped), 2 on 1 (vShape). It is the one
  /// rule for how many devices a pipeline of S stages needs, and how many stages D devices
  /// take, that the config, the resolver and the trainer check; a placement that is given
  /// says it itself (numDevices(), e.g. folded(): S stages on S devices).
  struct StagesPerDevice {
    int stages = 1;
    int devices = 1;
  };
  /// (Inline: the planner's cost model asks for it millions of times per solve, Note
  /// [Planner speed] in planner/CostModel.h.)
  static StagesPerDevice stagesPerDevice(ScheduleKind kind,
                                         int virtualStages = kDefaultVirtualStages) {
    switch (info(kind).placement) {
      case DefaultPlacement::SameDevice:
        return {1, 1};
      case DefaultPlacement::PipeFb:
        return {1, 2};
      case DefaultPlacement::Looped:
        return {virtualStages > 1 ? virtualStages : 1, 1};
      case DefaultPlacement::VShape:
        return {2, 1};
    }
    PIPEFB_ASSERT(false, "a schedule kind without a default placement");
    return {1, 1};
  }
  /// Devices that defaultFor(kind, numStages, virtualStages) uses; 0 when numStages does
  /// not fill them (looped: not a multiple of v; vShape: odd).
  static int devicesFor(ScheduleKind kind, int numStages,
                        int virtualStages = kDefaultVirtualStages);
  /// Stages the default placement puts on `devices` devices; 0 when they do not make whole
  /// stages (pipefb: an odd count).
  static int stagesOn(ScheduleKind kind, int devices, int virtualStages = kDefaultVirtualStages);

  int numStages() const { return static_cast<int>(stages_.size()); }
  /// 1 + the largest device id used.
  int numDevices() const { return numDevices_; }
  int forward(int stage) const { return stages_.at(stage).forward; }
  int backward(int stage) const { return stages_.at(stage).backward; }
  bool split(int stage) const { return forward(stage) != backward(stage); }
  /// Some device runs the forward of one stage and the backward of another (folded()).
  bool sharesDevices() const;
  const std::vector<StagePlacement>& stages() const { return stages_; }

  /// "0/5 1/4 2/3": forward/backward device per stage.
  std::string toString() const;
  /// Parses toString()'s form. A bad entry is a UserError that starts with `where`.
  static Placement parse(const std::string& text, const std::string& where);
  /// UserError (starting with `where`) unless this placement suits `kind` on `devices`
  /// devices: every device id below `devices`; same-device kinds (gpipe, 1f1b, pipedream,
  /// interleaved-1f1b, zbv) run F and B of a stage on one device; pipefb-* splits at least
  /// one stage (a stage it does not split runs as in GPipe, e.g. folded()'s middle stage);
  /// a pipefb device runs the forwards of at most one forward range and the backwards of
  /// at most one backward range (Note [Decoupled partitions]; folded() and the 2S form are
  /// the one-stage ranges); and the other kinds, unless their default placement hosts
  /// several stages per device (looped, vShape: their generators check the exact shape),
  /// run at most one stage per device.
  void checkFor(const std::string& kind, int devices, const std::string& where) const;
  bool operator==(const Placement& o) const { return stages_ == o.stages_; }

 private:
  std::vector<StagePlacement> stages_;
  int numDevices_ = 0;
};

/// One pass's partition of a chain of `numLayers` layers (Note [Decoupled partitions]):
/// `cuts` are the layer indices where a range ends and the next begins (strictly increasing,
/// each in (0, numLayers)), `devices` the device of each range (cuts.size() + 1 of them).
struct PassPartition {
  std::vector<std::int64_t> cuts;
  std::vector<int> devices;
};

/// The segments of a decoupled partition: the chain cut at the union of both passes' cuts.
struct DecoupledStages {
  std::vector<std::int64_t>
      cuts;             // segment s covers [cuts[s-1], cuts[s]) (0 and numLayers implied)
  Placement placement;  // per segment: its forward and backward device
};

/// Note [Decoupled partitions]: the segments of `forward` and `backward` on `numLayers`
/// layers. A bad cut list (not increasing, outside (0, numLayers), the wrong number of
/// devices) is a UserError naming which pass. The result is not checked against a kind
/// (Placement::checkFor does that).
DecoupledStages decouple(std::int64_t numLayers, const PassPartition& forward,
                         const PassPartition& backward);

}  // namespace pipefb::schedules
