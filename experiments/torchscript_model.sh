#!/usr/bin/env bash
# Issue 34, "your own model": torchvision's resnet50 (full width, 10 classes, 32 px)
# exported by python/pipefb_export.py, against the zoo's resnet50 of the same shape.
#  1. Speed: pipefb_train, 1f1b on 2 devices with the same cut (pipeline.partition [9]),
#     batch 16, 4 microbatches, 8 steps on synthetic data; zoo and TorchScript alternated
#     over 5 rounds; samples/s after the first 2 steps. -> speed.csv
#  2. The plan promise: each model profiled (pipefb_profile), planned by pipefb_plan on
#     4 devices (PipeFB families) at 1.25x its smallest feasible budget, and run by
#     pipefb_train with devices.memory at that budget: each device's peak against its
#     plan. -> plan.csv (and plan-*.yaml)
#   experiments/torchscript_model.sh        (after scripts/setup; about 4 minutes)
source "$(dirname "$0")/lib.sh"
need pipefb_train pipefb_profile pipefb_plan
start_results torchscript_model
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$PY" "$ROOT/python/pipefb_export.py" torchvision resnet50 --num-classes 10 \
  --sample-shape 3,32,32 -o "$WORK/resnet50.pt" | tee "$OUT/export.txt"

config() {  # config NAME DEVICES SCHEDULE_KEYS: a config file for the zoo or the script
  local model
  if [[ $1 == zoo ]]; then
    model="{name: resnet50, width: 1, input_size: 32, channels: 3, num_classes: 10}"
  else
    model="{name: torchscript, path: $WORK/resnet50.pt, sample_shape: [3, 32, 32], num_classes: 10}"
  fi
  cat >"$WORK/$1-$2.yaml" <<EOF
model: $model
data: {name: synthetic, synthetic_train: 512, synthetic_test: 64}
training: {batch: 16, iterations: 8, eval: false, checkpoint: false, lr: 0.01}
devices: {count: $2}
pipeline: $3
EOF
  echo "$WORK/$1-$2.yaml"
}

echo "round,model,samples_per_s" >"$OUT/speed.csv"
for round in 1 2 3 4 5; do
  for m in zoo torchscript; do
    echo "speed: round $round of 5, $m (ETA $(( (5 - round) * 12 + 6 )) s)"
    c=$(config "$m" 2 "{schedule: 1f1b, microbatches: 4, partition: [9]}")
    $NICE "$BUILD/pipefb_train" --config "$c" --set output.dir="$WORK/run-$m" >"$WORK/log" 2>&1
    echo "$round,$m,$(steady_throughput "$WORK/run-$m/metrics.csv" 16 2)" >>"$OUT/speed.csv"
  done
done
"$PY" - "$OUT/speed.csv" <<'PY' | tee "$OUT/speed.txt"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
by = {m: [float(r["samples_per_s"]) for r in rows if r["model"] == m] for m in ("zoo", "torchscript")}
ratios = [z / t for z, t in zip(by["zoo"], by["torchscript"])]
for m, v in by.items():
    print(f"{m}: median {statistics.median(v):.1f} samples/s (min {min(v):.1f}, max {max(v):.1f})")
print(f"time per step, torchscript / zoo: median {statistics.median(ratios):.3f} "
      f"(min {min(ratios):.3f}, max {max(ratios):.3f}) over {len(ratios)} alternated rounds")
PY

echo "model,device,planned_bytes,peak_bytes,below_plan" >"$OUT/plan.csv"
for m in zoo torchscript; do
  echo "plan promise: $m"
  c=$(config "$m" 4 "{schedule: pipefb-sync, microbatches: 4}")
  $NICE "$BUILD/pipefb_profile" --config "$c" -o "$WORK/profile-$m.yaml" >"$WORK/log" 2>&1
  # No plan fits 1 KiB: pipefb_plan exits 2 naming the smallest budget that fits.
  smallest=$({ "$BUILD/pipefb_plan" --config "$c" --profile "$WORK/profile-$m.yaml" \
    --schedules pipefb-sync --budget 1KiB 2>&1 || true; } | grep -o -- '--budget [0-9]*' |
    awk '{print $2}')
  budget=$(( smallest * 5 / 4 ))
  "$BUILD/pipefb_plan" --config "$c" --profile "$WORK/profile-$m.yaml" --schedules pipefb-sync \
    --budget "$budget" -o "$OUT/plan-$m.yaml" >"$WORK/log" 2>&1
  $NICE "$BUILD/pipefb_train" --config "$c" --plan "$OUT/plan-$m.yaml" \
    --set devices.memory="$budget" --set training.iterations=4 \
    --set output.dir="$WORK/plan-run-$m" >"$WORK/log" 2>&1
  "$PY" - "$WORK/plan-run-$m/memory.json" "$m" >>"$OUT/plan.csv" <<'PY'
import json, sys
for d in json.load(open(sys.argv[1]))["devices"]:
    if d.get("predicted_peak_bytes"):
        p, m = d["predicted_peak_bytes"], d["peak_bytes"]
        print(f"{sys.argv[2]},{d['name']},{p},{m},{(p - m) / p:.4f}")
PY
done
cat "$OUT/plan.csv"
end_results
