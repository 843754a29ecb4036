#!/usr/bin/env bash
# Issue 36, planner: ResNet50 at 224 px and GPT-2 small at 1024 tokens, microbatches of 8 on
# 4 devices, at fp32 and at half precision: fp16 on 4x T4 (no bf16 there), bf16 on 4x A100
# and 4x H100 (analytic profiles, Note [Half-precision training]). Prints each family's
# smallest budget, and its throughput at a common budget (the sweep's smallest budget at which
# every family below fits at fp32). Raw sweeps: experiments/results/precision/sweeps.txt and
# sweep-*.csv.   experiments/half_precision_sweeps.sh [BUILD_DIR]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
OUT=$ROOT/experiments/results/precision
mkdir -p "$OUT"
R="--set model.width=1 --set model.input_size=224 --set model.channels=3 --set model.num_classes=1000 --set training.batch=64 --set devices.count=4 --set pipeline.schedule=1f1b"
G="--set model.input_size=1024 --set training.batch=64 --set devices.count=4 --set pipeline.schedule=1f1b"
: >"$OUT/sweeps.txt"
for ch in 4x-t4-pcie:fp16 4x-a100-nvlink:bf16 4x-h100-nvlink:bf16; do
  cl=${ch%%:*}; half=${ch##*:}
  for p in fp32 $half; do
    for m in resnet50 gpt2-small; do
      if [ $m = resnet50 ]; then c=configs/resnet50.yaml; s=$R; b=128MiB:64GiB:40; else c=configs/gpt2-small.yaml; s=$G; b=1GiB:128GiB:40; fi
      echo "\$ build/pipefb_sweep --config $c $s --set training.precision=$p --cluster $cl --budgets $b --microbatches 8" >>"$OUT/sweeps.txt"
      (cd "$ROOT" && "$BUILD/pipefb_sweep" --config $c $s --set training.precision=$p --cluster $cl \
        --budgets $b --microbatches 8 -o "$OUT/sweep-$m-$cl-$p") 2>&1 | grep -v '^wrote' >>"$OUT/sweeps.txt"
      cp "$OUT/sweep-$m-$cl-$p/sweep.csv" "$OUT/sweep-$m-$cl-$p.csv"; rm -rf "$OUT/sweep-$m-$cl-$p"
    done
  done
done
"${PYTHON:-python3}" - "$OUT" <<'PY'
import csv, sys, os
out = sys.argv[1]
fams = ["1f1b-keep", "1f1b", "gpipe", "pipedream", "interleaved-1f1b", "pipefb-sync", "pipefb-async"]
def load(m, cl, p):
    rows = list(csv.DictReader(open(os.path.join(out, f"sweep-{m}-{cl}-{p}.csv"))))
    return rows
for m in ["resnet50", "gpt2-small"]:
    for cl, half in [("4x-t4-pcie", "fp16"), ("4x-a100-nvlink", "bf16"), ("4x-h100-nvlink", "bf16")]:
        f32, h = load(m, cl, "fp32"), load(m, cl, half)
        smallest = lambda rows, f: int(next(r for r in rows if r["family"] == f)["min_feasible_budget_bytes"] or 0)
        budgets = sorted({int(r["budget_bytes"]) for r in f32})
        need = max(smallest(f32, f) for f in fams)
        common = next(b for b in budgets if b >= need)
        def thr(rows, f):
            r = next(r for r in rows if r["family"] == f and int(r["budget_bytes"]) == common)
            return float(r["throughput_samples_s"]) if r["feasible"] == "1" else None
        print(f"\n{m} on {cl}, fp32 / {half}; common budget {common / 2**30:.2f} GiB")
        print("| family | smallest budget, GiB | half / fp32 | samples/s at the common budget | half / fp32 |")
        print("|---|---|---|---|---|")
        for f in fams:
            a, b = smallest(f32, f), smallest(h, f)
            ta, tb = thr(f32, f), thr(h, f)
            print(f"| {f} | {a / 2**30:.3f} / {b / 2**30:.3f} | {b / a:.2f}x | "
                  f"{ta:.1f} / {tb:.1f} | {tb / ta:.2f}x |" if ta and tb else
                  f"| {f} | {a / 2**30:.3f} / {b / 2**30:.3f} | {b / a:.2f}x | - | - |")
PY

# Note [Half-precision weights on a device]: PipeFB's smallest budget with the optimizer
# kept on the backward devices (none) and with the planner choosing host or device per
# stage (per-stage), at fp32 and at half, from pipefb_plan's "smallest feasible budget".
smallest() { { "$BUILD/pipefb_plan" "$@" --budget 1KiB 2>&1 || true; } | grep -o -- '--budget [0-9]*' | awk '{print $2}'; }
{
  echo "model,cluster,optimizer_offload,fp32_bytes,half,half_bytes,half_over_fp32"
  for ch in 4x-t4-pcie:fp16 4x-a100-nvlink:bf16; do
    cl=${ch%%:*}; half=${ch##*:}
    # gpt2-small-chunked: the loss over chunks of 1024 tokens (model.loss_chunk, Note [Chunked
    # loss]) at both precisions.
    for m in resnet50 gpt2-small gpt2-small-chunked; do
      case $m in
        resnet50) c=configs/resnet50.yaml; s=$R ;;
        gpt2-small) c=configs/gpt2-small.yaml; s=$G ;;
        gpt2-small-chunked) c=configs/gpt2-small.yaml; s="$G --set model.loss_chunk=1024" ;;
      esac
      for oo in none per-stage; do
        a=$(cd "$ROOT" && smallest --config $c $s --set training.precision=fp32 --cluster $cl --schedules pipefb-sync --microbatches 8 --optimizer-offload $oo)
        b=$(cd "$ROOT" && smallest --config $c $s --set training.precision=$half --cluster $cl --schedules pipefb-sync --microbatches 8 --optimizer-offload $oo)
        echo "$m,$cl,$oo,$a,$half,$b,$(awk -v a=$a -v b=$b 'BEGIN{printf "%.2f", b/a}')"
      done
    done
  done
} | tee "$OUT/pipefb_optimizer_placement.csv"
