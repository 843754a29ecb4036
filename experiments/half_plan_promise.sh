#!/usr/bin/env bash
# Issue 36: the plan promise at half precision on virtual CPU devices (Note [Autocast] in
# include/pipefb/model/Model.h; fp16 with Note [Loss scaling] in train/LossScaler.h). For
# each model and family, at fp32 and at HALF (bf16 or fp16):
#   pipefb_profile (under autocast at HALF) -> the family's smallest budget (pipefb_plan exits 2
#   naming it) -> a plan at 1.25x that budget -> pipefb_train --plan, 10 iterations, with
#   devices.memory at the budget -> each device's measured peak against its planned peak.
# Adam allocates its states at the first step taken, and at fp16 the first steps may overflow
# and be skipped: from the default loss scale, 65536, ResNet50/8 skipped 9 to 10 of its 10
# steps. fp16 therefore starts at training.loss_scale=64: ResNet50/8 then skips 6 and takes
# 4; the CSV's last column counts the steps each run skipped.
# Writes experiments/results/precision/plan_promise-HALF.csv (or CSV) and prints it. MODELS
# picks the models (default: vgg16 resnet50 gpt2-tiny). gpt2-chunked is GPT-2 tiny with a
# vocabulary of 8192 and model.loss_chunk=128 (Note [Chunked loss]), whose loss is most of
# the last stage's memory.
#   experiments/half_plan_promise.sh [BUILD_DIR] [HALF]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
HALF=${2:-bf16}
OUT=$ROOT/experiments/results/precision
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"
PY=$BUILD/pipefb-python
COMMON="--set data.name=synthetic --set data.synthetic_train=256 --set data.synthetic_test=64
  --set devices.count=4 --set pipeline.microbatches=4 --set training.eval=false
  --set training.checkpoint=false --set output.progress=false"
read -r -a models <<<"${MODELS:-vgg16 resnet50 gpt2-tiny}"
families=(1f1b pipefb-sync)
total=$(( ${#models[@]} * ${#families[@]} * 2 )); done_=0; start=$(date +%s)
CSV=${CSV:-$OUT/plan_promise-$HALF.csv}
echo "model,family,precision,smallest_budget,device,planned_bytes,peak_bytes,below_plan,skipped_steps" >"$CSV"
for m in "${models[@]}"; do
  case $m in
    vgg16) c="$ROOT/configs/vgg16.yaml"; extra="--set training.batch=32 --set devices.memory=1GiB" ;;
    resnet50) c="$ROOT/configs/resnet50.yaml"; extra="--set training.batch=32 --set model.width=0.125" ;;
    gpt2-tiny) c="$ROOT/configs/gpt2-tiny.yaml"; extra="--set training.batch=16" ;;
    gpt2-chunked) c="$ROOT/configs/gpt2-tiny.yaml"
      extra="--set training.batch=16 --set model.num_classes=8192 --set model.loss_chunk=128" ;;
  esac
  for f in "${families[@]}"; do
    for p in fp32 $HALF; do
      sets="$COMMON $extra --set pipeline.schedule=$f --set training.precision=$p"
      [ "$p" = fp16 ] && sets="$sets --set training.loss_scale=64"
      prof="$WORK/profile-$m-$p.yaml"
      [ -f "$prof" ] || "$BUILD/pipefb_profile" --config "$c" $sets -o "$prof" >"$WORK/log" 2>&1
      smallest=$({ "$BUILD/pipefb_plan" --config "$c" $sets --profile "$prof" --schedules "$f" \
        --budget 1KiB 2>&1 || true; } | grep -o -- '--budget [0-9]*' | awk '{print $2}')
      budget=$(( smallest * 5 / 4 ))
      "$BUILD/pipefb_plan" --config "$c" $sets --profile "$prof" --schedules "$f" \
        --budget "$budget" -o "$WORK/plan.yaml" >"$WORK/log" 2>&1
      "$BUILD/pipefb_train" --config "$c" $sets --plan "$WORK/plan.yaml" \
        --set devices.memory="$budget" --set training.iterations=10 \
        --set output.dir="$WORK/run" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
      "$PY" - "$WORK/run/memory.json" "$m,$f,$p,$smallest" >>"$CSV" <<'PY'
import json, sys
import os
run = os.path.dirname(sys.argv[1])
skipped = json.load(open(os.path.join(run, "summary.json"))).get("loss_scale", {}).get("skipped_steps", 0)
for d in json.load(open(sys.argv[1]))["devices"]:
    if d.get("predicted_peak_bytes"):
        p, m = d["predicted_peak_bytes"], d["peak_bytes"]
        print(f"{sys.argv[2]},{d['name']},{p},{m},{(p - m) / p:.4f},{skipped}")
PY
      done_=$((done_ + 1)); now=$(date +%s)
      echo "$m $f $p: smallest $smallest bytes ($done_ of $total, ETA $(( (now - start) * (total - done_) / done_ )) s)"
    done
  done
done
cat "$CSV"
