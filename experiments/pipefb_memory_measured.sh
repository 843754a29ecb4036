#!/usr/bin/env bash
# Issue 16 "Memory", measured on virtual devices: each family's smallest feasible budget
# as planned on a measured profile, the plan at that budget run by pipefb_train with
# devices.memory set to it, and each device's measured peak against the plan's
# prediction (goal +-10%). PipeFB's plan is decoupled (Note [Decoupled search]: forward
# devices feeding backward devices, every layer a segment), which pipefb_train runs
# (Note [Decoupled partitions]).
#   ResNet50 width 1/8, 64 px, 3 channels, batch 32 in 4 microbatches of 8, 4 devices,
#   SGD with momentum, synthetic data, 3 iterations.
# -> devices.csv (family, device, predicted and measured peak), budgets.csv (family,
#    planned smallest budget, whether the run fits it, the capacity it needed),
#    logs/ (every program's output), plans/ (the plan files).
#
#   experiments/pipefb_memory_measured.sh        (~1.5 minutes loaded)
# The issue's own scale, ResNet50 at 224 px and full width (about 25 minutes, results in
# results/pipefb_memory_measured_224/):
#   WIDTH=1 SIZE=224 CLASSES=1000 experiments/pipefb_memory_measured.sh
# PROFILE_FROM=FILE reuses a profile measured before with the same settings.
source "$(dirname "$0")/lib.sh"
WIDTH=${WIDTH:-0.125}
SIZE=${SIZE:-64}
CLASSES=${CLASSES:-10}
FAMILIES=${FAMILIES:-pipefb-sync pipefb-async pipefb-sync-keep pipefb-sync-checkpoint pipefb-async-keep pipefb-async-checkpoint 1f1b-keep 1f1b gpipe pipedream}
need pipefb_plan pipefb_profile pipefb_train
if [[ $WIDTH == 0.125 && $SIZE == 64 ]]; then start_results pipefb_memory_measured
else start_results "pipefb_memory_measured_$SIZE"; fi
mkdir -p "$OUT/logs" "$OUT/plans" "$OUT/runs"
S="--config $ROOT/configs/resnet50.yaml --set model.width=$WIDTH --set model.input_size=$SIZE
 --set model.channels=3 --set model.num_classes=$CLASSES --set training.batch=32 --set pipeline.microbatches=4
 --set devices.count=4 --set pipeline.schedule=pipefb-sync --set data.name=synthetic
 --set data.synthetic_train=64 --set data.synthetic_test=32"
RUN="--set training.iterations=3 --set training.eval=false --set training.checkpoint=false
 --set pipeline.stall_timeout=900"
PROFILE=$OUT/profile.yaml
if [[ -n ${PROFILE_FROM:-} ]]; then cp "$PROFILE_FROM" "$PROFILE"
else $NICE "$BUILD/pipefb_profile" $S --out "$PROFILE" >"$OUT/logs/profile.txt" 2>&1; fi

echo "family,device,predicted_bytes,measured_bytes,error_pct" >"$OUT/devices.csv"
echo "family,smallest_budget_bytes,placement,runs_at_budget,needed_bytes,max_measured_bytes" \
  >"$OUT/budgets.csv"
for fam in $FAMILIES; do
  plan="$BUILD/pipefb_plan $S --profile $PROFILE --schedules $fam --microbatches 4"
  rc=0
  $plan --budget 1KiB >"$OUT/logs/$fam-smallest.txt" 2>&1 || rc=$?
  budget=$(grep -o -- '--budget [0-9]*)' "$OUT/logs/$fam-smallest.txt" | tr -dc 0-9)
  [[ $rc == 2 && -n $budget ]] || { echo "$fam: no smallest budget" >&2; exit 1; }
  $NICE $plan --budget "$budget" -o "$OUT/plans/$fam.yaml" >"$OUT/logs/$fam-plan.txt" 2>&1
  # At the budget: does it fit? (an OOM names the smallest capacity that would fit)
  rc=0
  $NICE "$BUILD/pipefb_train" $S --plan "$OUT/plans/$fam.yaml" --set devices.memory=$budget \
    $RUN --set output.dir="$OUT/runs/$fam-budget" >"$OUT/logs/$fam-train-budget.txt" 2>&1 || rc=$?
  needed=$(grep -o 'would fit is [^(]*(\([0-9]*\) bytes' "$OUT/logs/$fam-train-budget.txt" |
    grep -o '([0-9]*' | tr -dc 0-9 || true)
  # Without a limit: every device's peak.
  $NICE "$BUILD/pipefb_train" $S --plan "$OUT/plans/$fam.yaml" $RUN \
    --set output.dir="$OUT/runs/$fam" >"$OUT/logs/$fam-train.txt" 2>&1
  "$PY" - "$OUT/plans/$fam.yaml" "$OUT/runs/$fam/summary.json" "$fam" "$budget" "$rc" \
    "${needed:-}" "$OUT" <<'PYEOF'
import json, sys, yaml
plan_file, summary, fam, budget, rc, needed, out = sys.argv[1:]
plan = yaml.safe_load(open(plan_file))
predicted = plan["predicted"]["peak_memory"]
placement = next((o.split("=", 1)[1] for o in plan.get("overrides", [])
                  if o.startswith("pipeline.placement=")), "default")
peaks = {d["name"]: d["peak_bytes"] for d in json.load(open(summary))["devices"]}
with open(out + "/devices.csv", "a") as f:
    for i, want in enumerate(predicted):
        if want == 0 and "cpu:%d" % i not in peaks:  # a device the plan leaves unused
            continue
        got = peaks["cpu:%d" % i]
        f.write("%s,%d,%d,%d,%.1f\n" % (fam, i, want, got, 100.0 * (got - want) / want))
top = max(v for k, v in peaks.items() if k.startswith("cpu:"))
with open(out + "/budgets.csv", "a") as f:
    f.write('%s,%s,"%s",%s,%s,%d\n' % (fam, budget, placement, "yes" if rc == "0" else "no",
                                       needed or budget, top))
PYEOF
  rm -rf "$OUT/runs/$fam-budget"
done
rm -rf "$OUT/runs"
column -s, -t "$OUT/budgets.csv"
column -s, -t "$OUT/devices.csv"
end_results
