#!/usr/bin/env bash
# The GPU experiment (issue 17): ResNet50 and VGG16 at 224 px (full width, 3 channels,
# 1000 classes, synthetic data), batch 64 in 8 microbatches, 4 pipeline devices on ONE
# GPU (devices.kind: cuda, devices.count: 4), each with the budget devices.memory=BUDGET.
# Rows (the planner's schedule families, pipefb_plan --schedules):
#   1f1b-keep            4 stages, F and B of a stage on one device, activations kept
#   1f1b-offload         the same, stashes offloaded to the pinned host pool
#   pipefb-sync-offload  PipeFB: forward and backward of a stage on different devices,
#                        stashes through the host pool
# Per row: pipefb_plan under the GPU's device spec (configs/devices/$SPEC.yaml: h100-80g,
# h200-141g; picked from nvidia-smi's GPU name) writes plan.yaml with the planner's
# predicted peak per device; pipefb_train --plan runs it on the GPU for ITERS iterations.
# Columns of runs.csv:
#   samples_per_s     steady throughput after WARMUP iterations (metrics.csv)
#   peak_dev_mib      the largest per-device peak (the domains' accounting of allocated
#                     bytes, Note [CUDA accounting]), its device and top category
#   overlap_pct       copy time hidden under compute, over all devices
#   stall/copy        seconds per iteration; host_pool_mib; the row's check
#   peaks_mib         every device's measured peak, ';'-separated
#   planned_mib       every device's planned peak (plan.yaml predicted.peak_memory)
# The goals it measures (ResNet50 on an H100): pipefb-sync-offload's largest peak <= 0.5x
# 1f1b-keep's at >= 0.9x its samples/s; >= 90% of the copy time hidden; every measured
# peak within +-10% of the planned one.
#
# NOT RUN YET: it needs a GPU host and a build against a CUDA LibTorch (README.md, "On a
# GPU host"): scripts/gpu-host-build, then
#   BUILD=build-gpu experiments/gpu_pipeline.sh
#   PLAN_ONLY=1 experiments/gpu_pipeline.sh       (the planning step only; runs anywhere)
# Results go to experiments/results/gpu/<spec>/, named after the GPU.
source "$(dirname "$0")/lib.sh"
MODELS=${MODELS:-resnet50 vgg16}
ROWS=${ROWS:-1f1b-keep 1f1b-offload pipefb-sync-offload}
BUDGET=${BUDGET:-16GiB}
ITERS=${ITERS:-12}
WARMUP=${WARMUP:-2}
NICE=${NICE-}  # the GPU host is not shared: normal priority
PLAN_ONLY=${PLAN_ONLY:-0}
if [[ -z ${SPEC:-} ]]; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
  case $gpu in
    *H200*) SPEC=h200-141g ;;
    *) SPEC=h100-80g ;;
  esac
fi
if [[ $PLAN_ONLY == 1 ]]; then need pipefb_plan; else need pipefb_plan pipefb_train; fi
OUT=${OUT:-$ROOT/experiments/results/gpu/$SPEC}
start_results gpu
{
  echo "gpu: ${gpu:-none visible} (device spec $SPEC)"
  echo "models: $MODELS at 224 px, batch 64, 8 microbatches, 4 pipeline devices on one GPU, budget $BUDGET each"
  echo "plan only: $PLAN_ONLY"
} >>"$OUT/machine.txt"
RUNS=$OUT/runs.csv
echo "model,row,samples_per_s,peak_dev_mib,peak_device,peak_top_category,overlap_pct,stall_s_per_it,copy_s_per_it,host_pool_mib,check,peaks_mib,planned_mib" >"$RUNS"
: >"$OUT/checks.txt"
for model in $MODELS; do
  case $model in
    resnet50) config=$ROOT/configs/resnet50.yaml ;;
    vgg16) config=$ROOT/configs/vgg16-single.yaml ;;
    *) echo "$(basename "$0"): unknown model '$model'; allowed: resnet50 vgg16" >&2; exit 2 ;;
  esac
  sets=(--set model.width=1 --set model.input_size=224 --set model.channels=3
        --set model.num_classes=1000 --set data.name=synthetic --set data.synthetic_train=1280
        --set data.synthetic_test=64 --set training.batch=64 --set training.iterations="$ITERS"
        --set training.eval=false --set training.checkpoint=false --set output.progress=false
        --set training.log_every=1000 --set devices.count=4 --set devices.memory="$BUDGET"
        --set pipeline.schedule=1f1b --set pipeline.microbatches=8)
  for row in $ROWS; do
    name=$model-$row
    dir=$OUT/runs/$name
    rm -rf "$dir"
    mkdir -p "$dir"
    echo "== $name"
    "$BUILD/pipefb_plan" --config "$config" "${sets[@]}" --device "$SPEC" --schedules "$row" \
      --microbatches 8 --max-stages 4 --budget "$BUDGET" --quiet --out "$dir/plan.yaml" \
      | tee "$OUT/$name.plan.txt"
    planned=$("$PY" -c 'import re,sys
t=open(sys.argv[1]).read()
m=re.search(r"^  peak_memory: \[([^\]]*)\]", t, re.M)
print(";".join("%.1f" % (int(x) / 2**20) for x in m.group(1).split(",")))' "$dir/plan.yaml")
    if [[ $PLAN_ONLY == 1 ]]; then
      echo "$model,$row,,,,,,,,,,,$planned" >>"$RUNS"
      continue
    fi
    timed "$OUT/$name.log" "$BUILD/pipefb_train" --config "$config" "${sets[@]}" \
      --set devices.kind=cuda --plan "$dir/plan.yaml" --set output.dir="$dir"
    tp=$(steady_throughput "$dir/metrics.csv" 64 "$WARMUP")
    row_csv=$("$PY" "$ROOT/experiments/offload_memory.py" run "$dir" "$row" "$OUT/checks.txt" "$name")
    peaks=$(json "$dir/summary.json" '";".join("%.1f" % (d["peak_bytes"] / 2**20) for d in j["pipeline"]["devices"] if d["name"] != "host")')
    echo "$model,$row,$tp,$row_csv,$peaks,$planned" >>"$RUNS"
    echo "   $tp samples/s; $row_csv; peaks $peaks MiB; planned $planned MiB"
  done
done
column -s, -t <"$RUNS" | tee "$OUT/table.txt"
end_results
