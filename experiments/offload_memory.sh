#!/usr/bin/env bash
# Offload memory (issue 5, "Memory"): 1f1b-keep, 1f1b-offload and pipefb-sync with offload
# on VGG16 width 1/2 (Adam), batch 32 in 8 microbatches, 4 virtual devices, in ONE run:
#   1f1b            4 stages on 4 devices (forward and backward of a stage together)
#   pipefb-sync     2 stages on 4 devices (F0 F1 on cpu:0,1; B1 B0 on cpu:2,3: "0/3 1/2")
# Rows ending in -optoff add pipeline.optimizer_offload: host (Note [Optimizer offload]:
# Adam's state and the master weights in the host pool); they are not in the default ROWS:
#   SIZES=224 ROUNDS=1 ROWS="1f1b-keep 1f1b-keep-optoff pipefb-sync-offload pipefb-sync-offload-optoff" \
#     OUT=experiments/results/offload_memory/optimizer_offload experiments/offload_memory.sh
# Partition: the planner's (pipeline.partition_by: planner, unlimited budget). Lookahead 1.
# Every image size in SIZES is run with the three rows back to back, in ROUNDS rounds
# (rows alternate, so that a change of the machine's load hits every row alike).
# Per run, from pipefb_train's summary.json, metrics.csv and trace.json (offload_memory.py):
#   samples_per_s     steady throughput after WARMUP iterations (metrics.csv)
#   peak_dev_mib      the largest peak over the devices (allocator accounting), and the
#                     device and category that dominate it
#   overlap_pct       copy time hidden under the device's F/B/STEP, over all devices
#   stall_s_per_it    time compute waited for a prefetch or offload backpressure, summed
#                     over devices, per iteration
# and two checks, printed with their numbers:
#   1f1b-offload      peak resident stash of each device <= (1 + lookahead) x that stage's
#                     stash of one microbatch (summary.json: category_peaks.stash,
#                     stash_bytes_per_microbatch)
#   pipefb-sync       the forward devices hold no stash between actions: at the end of every
#                     iteration their stash is 0 (trace.json 'memory', all iterations), and
#                     at the start of every F the only stash they hold is what their copy
#                     engine is still copying out (trace.json 'memory events', the traced
#                     iterations)
#
#   experiments/offload_memory.sh                  (after scripts/setup; ~25 minutes)
#   SIZES=224 ROUNDS=1 experiments/offload_memory.sh
# Throughput needs a quiet machine: run at normal priority (NICE= ) when the load is < 3.
source "$(dirname "$0")/lib.sh"
SIZES=${SIZES:-32 224}
ROUNDS=${ROUNDS:-2}
ITERS_SMALL=${ITERS_SMALL:-10}  # iterations at input sizes < 100 px
ITERS_LARGE=${ITERS_LARGE:-4}   # iterations at the larger sizes
WARMUP_SMALL=${WARMUP_SMALL:-2}
WARMUP_LARGE=${WARMUP_LARGE:-1}
WIDTH=${WIDTH:-0.5}
ROWS=${ROWS:-1f1b-keep 1f1b-offload pipefb-sync-offload}
need pipefb_train
start_results offload_memory
RUNS=$OUT/runs.csv
if ! plot_only; then
  echo "vgg16 width $WIDTH, 3 channels, batch 32, 8 microbatches, 4 devices, adam; sizes $SIZES; rounds $ROUNDS" >>"$OUT/machine.txt"
  echo "nice: '${NICE}'" >>"$OUT/machine.txt"
  echo "size,row,round,samples_per_s,peak_dev_mib,peak_device,peak_top_category,overlap_pct,stall_s_per_it,copy_s_per_it,host_pool_mib,check" >"$RUNS"
  : >"$OUT/checks.txt"
  for size in $SIZES; do
    if ((size < 100)); then ITERS=$ITERS_SMALL; WARMUP=$WARMUP_SMALL; else ITERS=$ITERS_LARGE; WARMUP=$WARMUP_LARGE; fi
    for round in $(seq 1 "$ROUNDS"); do
      for row in $ROWS; do
        optoff=none
        case $row in
          1f1b-keep) sched=1f1b; pol=keep ;;
          1f1b-offload) sched=1f1b; pol=offload ;;
          pipefb-sync-offload) sched=pipefb-sync; pol=offload ;;
          1f1b-keep-optoff) sched=1f1b; pol=keep; optoff=host ;;
          pipefb-sync-offload-optoff) sched=pipefb-sync; pol=offload; optoff=host ;;
          *) echo "$(basename "$0"): unknown row '$row'; allowed: 1f1b-keep 1f1b-offload pipefb-sync-offload 1f1b-keep-optoff pipefb-sync-offload-optoff" >&2; exit 2 ;;
        esac
        name=$size-$row-r$round
        dir=$OUT/runs/$name
        rm -rf "$dir"
        echo "== $name (load $(cut -d' ' -f1 /proc/loadavg))"
        timed "$OUT/$name.log" "$BUILD/pipefb_train" --config "$ROOT/configs/vgg16-single.yaml" \
          --set model.width="$WIDTH" --set model.input_size="$size" --set model.channels=3 \
          --set training.batch=32 --set training.optimizer=adam --set training.lr=0.0001 \
          --set training.lr_schedule=constant \
          --set data.name=synthetic --set data.synthetic_train=320 --set data.synthetic_test=32 \
          --set training.iterations="$ITERS" --set training.eval=false --set training.checkpoint=false \
          --set output.progress=false --set training.log_every=1000 \
          --set pipeline.schedule=$sched --set devices.count=4 --set pipeline.microbatches=8 \
          --set pipeline.stash=$pol --set pipeline.optimizer_offload=$optoff --set output.dir="$dir"
        tp=$(steady_throughput "$dir/metrics.csv" 32 "$WARMUP")
        row_csv=$("$PY" "$ROOT/experiments/offload_memory.py" run "$dir" "$row" "$OUT/checks.txt" "$size-$row round $round")
        echo "$size,$row,$round,$tp,$row_csv" >>"$RUNS"
        echo "   $tp samples/s; $row_csv"
      done
    done
  done
fi
"$PY" "$ROOT/experiments/offload_memory.py" table "$RUNS" "$OUT/table.csv" | tee "$OUT/table.txt"
cat "$OUT/checks.txt"

bar_pair_chart "$OUT/offload_memory.svg" \
  "VGG16 w=$WIDTH, batch 32, M=8, 4 devices (experiments/offload_memory.sh)" "$OUT/table.csv" \
  'sprintf("%spx %s", strcol(1), strcol(2))' \
  "3|peak device memory (MiB, max over devices)|#cc6677" \
  "6|throughput (samples/s, mean over rounds)|#4477aa"
end_results
