#!/usr/bin/env bash
# Planner fidelity (issue 6, "Done when: Fidelity"): VGG16 at width 1/4 on 4 virtual CPU
# devices, schedules 1f1b, pipefb-sync and pipedream, three per-device budgets. For each
# (schedule, budget) the planner's winning plan (from a measured profile) is trained for
# ITERS iterations with `pipefb_train --plan`, and its predicted peak memory per device
# and iteration time are set against the measured ones.
#
#   experiments/planner_fidelity.sh            # BUILD=build ITERS=8 BUDGETS=150MiB,165MiB,180MiB,1GiB
#                                              # KEEP_FREED_MEMORY=true
#
# KEEP_FREED_MEMORY=false profiles and trains with glibc's malloc defaults
# (devices.keep_freed_memory, Note [Keeping freed memory] in pipefb/memory/FreedMemory.h):
# freed memory goes back to the system and the next step page-faults it in again.
#
# The default budgets change the plans where the budget can: 1f1b has 3 stages at 150 MiB
# (fc6 alone on a device) and 2 above; pipefb-sync does not fit at 150 MiB, has 2 stages
# on 4 devices at 165 MiB and 1 stage on 2 devices from 180 MiB; pipedream does not fit at
# 150 MiB and has one plan above (its binding stage, fc6..fc8, holds no stash, and more
# stages only add weight copies). So each schedule is measured at 3 or 4 budgets.
# Writes experiments/results/planner_fidelity/:
#   profile.yaml   the measured profile (pipefb_profile)
#   sweep.csv      pipefb_sweep --measure output (predicted and measured columns)
#   fidelity.csv   one row per (schedule, budget, device): predicted vs measured peak and
#                  iteration time, relative errors; targets: peak within 10%, time within 15%
#   plans/         the plan files that were trained
# Run folders (with traces) stay in $WORK (default: a temporary folder).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build}
ITERS=${ITERS:-8}
BUDGETS=${BUDGETS:-150MiB,165MiB,180MiB,1GiB}
OUT=$ROOT/experiments/results/planner_fidelity
WORK=${WORK:-$(mktemp -d /tmp/planner_fidelity.XXXXXX)}
mkdir -p "$OUT/plans" "$WORK"
rm -f "$OUT"/plans/*.yaml  # only the plans of this run

SETS=(--set model.width=0.25 --set training.batch=32 --set pipeline.microbatches=8
      --set pipeline.schedule=1f1b --set devices.count=4
      --set devices.keep_freed_memory=${KEEP_FREED_MEMORY:-true})
CONFIG=$ROOT/configs/vgg16-single.yaml

echo "== profile (microbatch 32/8 = 4) =="
"$BUILD/pipefb_profile" --config "$CONFIG" "${SETS[@]}" --out "$OUT/profile.yaml" --force | tail -3

echo "== plan and train: $BUDGETS, $ITERS iterations per plan =="
(cd "$WORK" && "$BUILD/pipefb_sweep" --config "$CONFIG" "${SETS[@]}" --profile "$OUT/profile.yaml" \
   --microbatches 8 --schedules 1f1b,pipefb-sync,pipedream --budgets "$BUDGETS" \
   --measure "$ITERS" -o "$WORK/sweep")
cp "$WORK/sweep/sweep.csv" "$OUT/sweep.csv"
for d in "$WORK"/sweep/measure/*/; do cp "$d/plan.yaml" "$OUT/plans/$(basename "$d").yaml"; done

python3 - "$OUT/sweep.csv" "$OUT/fidelity.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
out = csv.writer(open(sys.argv[2], "w", newline=""))
out.writerow(["schedule", "budget_mib", "stages", "policies", "device", "predicted_peak_mib",
              "measured_peak_mib", "peak_error", "predicted_iteration_s", "measured_iteration_s",
              "time_error", "status"])
print(f"{'schedule':12} {'budget':>7} {'dev':>3} {'peak pred':>10} {'meas':>8} {'err':>7}"
      f"   {'iter pred':>9} {'meas':>7} {'err':>7}")
worst_peak = worst_time = 0.0
for r in rows:
    if r["feasible"] != "1":
        print(f"{r['family']:12} {float(r['budget_mib']):7.0f}   infeasible")
        out.writerow([r["family"], r["budget_mib"], "", "", "", "", "", "", "", "", "", "infeasible"])
        continue
    if r["measure_exit"] != "0":
        out.writerow([r["family"], r["budget_mib"], r["stages"], r["policies"], "", "", "", "",
                      r["iteration_time_s"], "", "", "exit " + r["measure_exit"] + ": " + r["measure_note"]])
        print(f"{r['family']:12} {float(r['budget_mib']):7.0f}   not run: {r['measure_note']}")
        continue
    pred = [int(x) for x in r["predicted_peaks"].split(";")]
    meas = [int(x) for x in r["measured_peaks"].split(";")]
    tp, tm = float(r["iteration_time_s"]), float(r["measured_iteration_time_s"])
    te = (tp - tm) / tm
    worst_time = max(worst_time, abs(te))
    for d in range(max(len(pred), len(meas))):
        p = pred[d] if d < len(pred) else 0
        m = meas[d] if d < len(meas) else 0
        if p == 0 and m == 0:
            continue
        pe = (p - m) / m if m else float("inf")
        worst_peak = max(worst_peak, abs(pe))
        out.writerow([r["family"], r["budget_mib"], r["stages"], r["policies"], d,
                      f"{p/2**20:.2f}", f"{m/2**20:.2f}", f"{pe:+.3f}", f"{tp:.4f}", f"{tm:.4f}",
                      f"{te:+.3f}", "ok"])
        print(f"{r['family']:12} {float(r['budget_mib']):7.0f} {d:3} {p/2**20:9.1f}M {m/2**20:7.1f}M"
              f" {pe:+7.1%}   {tp:8.3f}s {tm:6.3f}s {te:+7.1%}")
print(f"worst |peak error| {worst_peak:.1%} (target 10%), worst |time error| {worst_time:.1%} (target 15%)")
PY
echo "wrote $OUT/fidelity.csv, $OUT/sweep.csv; runs in $WORK"
