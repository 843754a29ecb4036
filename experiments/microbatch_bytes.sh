#!/usr/bin/env bash
# Plans at a microbatch size other than the profile's (issue 15, "every plan runs as
# planned"; Notes [Parameter-sized working sets] and [Bytes at every microbatch] in
# include/pipefb/planner/LayerCost.h). VGG16 width 1/8 with SGD, profiled at 16 samples
# (batch 64, M = 4), planned by each family with 64 microbatches of 1 at its smallest
# feasible budget, run 2 iterations by pipefb_train with devices.memory at that budget.
# -> devices.csv (family, device, predicted and measured peak, error), budgets.csv (family,
#    smallest budget, whether the run fit it), logs/, plans/, profile.yaml.
#
#   experiments/microbatch_bytes.sh        (~1 minute)
source "$(dirname "$0")/lib.sh"
FAMILIES=${FAMILIES:-1f1b pipefb-sync gpipe pipedream}
need pipefb_plan pipefb_profile pipefb_train
start_results microbatch_bytes
mkdir -p "$OUT/logs" "$OUT/plans" "$OUT/runs"
S="--config $ROOT/configs/vgg16.yaml --set training.optimizer=sgd --set data.name=synthetic
 --set data.synthetic_train=128 --set data.synthetic_test=64"
RUN="--set training.iterations=2 --set training.eval=false --set training.checkpoint=false"
PROFILE=$OUT/profile.yaml
$NICE "$BUILD/pipefb_profile" $S --times analytic --out "$PROFILE" >"$OUT/logs/profile.txt" 2>&1

echo "family,device,predicted_bytes,measured_bytes,error_pct" >"$OUT/devices.csv"
echo "family,smallest_budget_bytes,runs_at_budget" >"$OUT/budgets.csv"
for fam in $FAMILIES; do
  plan="$BUILD/pipefb_plan $S --profile $PROFILE --schedules $fam --microbatches 64"
  rc=0
  $plan --budget 1KiB >"$OUT/logs/$fam-smallest.txt" 2>&1 || rc=$?
  budget=$(grep -o -- '--budget [0-9]*)' "$OUT/logs/$fam-smallest.txt" | tr -dc 0-9)
  [[ $rc == 2 && -n $budget ]] || { echo "$fam: no smallest budget" >&2; exit 1; }
  $NICE $plan --budget "$budget" -o "$OUT/plans/$fam.yaml" >"$OUT/logs/$fam-plan.txt" 2>&1
  rc=0
  $NICE "$BUILD/pipefb_train" $S --plan "$OUT/plans/$fam.yaml" --set devices.memory=$budget \
    $RUN --set output.dir="$OUT/runs/$fam" >"$OUT/logs/$fam-train.txt" 2>&1 || rc=$?
  echo "$fam,$budget,$([[ $rc == 0 ]] && echo yes || echo no)" >>"$OUT/budgets.csv"
  [[ $rc == 0 ]] || continue
  "$PY" - "$OUT/plans/$fam.yaml" "$OUT/runs/$fam/summary.json" "$fam" "$OUT" <<'PYEOF'
import json, sys, yaml
plan_file, summary, fam, out = sys.argv[1:]
predicted = yaml.safe_load(open(plan_file))["predicted"]["peak_memory"]
peaks = {d["name"]: d["peak_bytes"] for d in json.load(open(summary))["devices"]}
with open(out + "/devices.csv", "a") as f:
    for i, want in enumerate(predicted):
        if "cpu:%d" % i not in peaks:
            continue
        got = peaks["cpu:%d" % i]
        f.write("%s,%d,%d,%d,%.1f\n" % (fam, i, want, got, 100.0 * (got - want) / want))
PYEOF
done
rm -rf "$OUT/runs"
column -s, -t "$OUT/budgets.csv"
column -s, -t "$OUT/devices.csv"
end_results
