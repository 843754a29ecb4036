#pragma once
// Placement: stage -> (forward device, backward device).
#include <string>
#include <vector>

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
  static StagesPerDevice stagesPerDevice(ScheduleKind kind,
                                         int virtualStages = kDefaultVirtualStages);
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
  /// and, unless the kind's default placement hosts several stages per device (looped,
  /// vShape: their generators check the exact shape), no device runs more than one stage's
  /// forward, or more than one stage's backward. A pipefb device may
  /// run one stage's forward and another's backward (Note [Folded placements]).
  void checkFor(const std::string& kind, int devices, const std::string& where) const;
  bool operator==(const Placement& o) const { return stages_ == o.stages_; }

 private:
  std::vector<StagePlacement> stages_;
  int numDevices_ = 0;
};

}  // namespace pipefb::schedules
