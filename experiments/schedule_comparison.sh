#!/usr/bin/env bash
# Schedule comparison: gpipe, 1f1b, pipedream, pipefb-sync, pipefb-async, each with the
# stash policies keep, offload and checkpoint-offload, on VGG16 width 1/4, batch 32
# (1x32x32 synthetic images, SGD), 4 microbatches, on 4 virtual devices:
#   gpipe, 1f1b, pipedream          4 stages on 4 devices (forward and backward together)
#   pipefb-sync, pipefb-async       2 stages on 4 devices (F0 F1 on cpu:0,1; B1 B0 on cpu:2,3)
# Partition: the planner's (pipeline.partition_by: planner, the default).
# Per run (pipefb_train's summary.json and metrics.csv):
#   samples/s       steady throughput after WARMUP iterations (metrics.csv)
#   peak_dev_mib    the largest peak over the devices (allocator accounting)
#   host_pool_mib   the host pool's peak (offloaded stashes)
#   idle_pct        measured bubble: 100 * (1 - mean device busy time / wall time)
#   sim_bubble_pct  the schedule's bubble from pipefb_sim with uniform costs (its shape alone)
#   stall_pct       100 * max over devices of offload stall / wall time
#   overlap_pct     copy time hidden under compute, over all devices
#
#   experiments/schedule_comparison.sh                 (after scripts/setup; ~10 minutes)
#   ITERS=20 POLICIES="keep offload" experiments/schedule_comparison.sh
source "$(dirname "$0")/lib.sh"
ITERS=${ITERS:-12}
WARMUP=${WARMUP:-2}
MICRO=${MICRO:-4}
SCHEDULES=${SCHEDULES:-gpipe 1f1b pipedream pipefb-sync pipefb-async}
POLICIES=${POLICIES:-keep offload checkpoint-offload}
need pipefb_train pipefb_sim
start_results schedule_comparison
CSV=$OUT/results.csv
if ! plot_only; then
echo "vgg16 width 0.25 batch 32 microbatches $MICRO iterations $ITERS (warm-up $WARMUP)" >>"$OUT/machine.txt"

echo "schedule,policy,stages,devices,samples_per_s,peak_dev_mib,host_pool_mib,idle_pct,sim_bubble_pct,stall_pct,overlap_pct,final_loss" >"$CSV"
for sched in $SCHEDULES; do
  if [[ $sched == pipefb-* ]]; then S=2; D=4; else S=4; D=4; fi
  simb=$("$BUILD/pipefb_sim" --schedule "$sched" --stages $S --microbatches "$MICRO" --iterations 3 --json \
    --no-actions --no-memory-timeline | "$PY" -c "import json,sys; print('%.1f' % (100*json.load(sys.stdin)['bubble_fraction']))")
  for pol in $POLICIES; do
    name=$sched-$pol
    dir=$OUT/runs/$name
    rm -rf "$dir"
    timed "$OUT/$name.log" "$BUILD/pipefb_train" --config "$ROOT/configs/vgg16-single.yaml" \
      --set model.width=0.25 --set training.batch=32 --set training.optimizer=sgd --set training.lr=0.01 \
      --set training.lr_schedule=constant \
      --set data.name=synthetic --set data.synthetic_train=128 --set data.synthetic_test=32 \
      --set training.iterations=$ITERS --set training.eval=false --set training.checkpoint=false \
      --set output.progress=false --set training.log_every=1000 \
      --set pipeline.schedule="$sched" --set pipeline.stages=$S --set devices.count=$D \
      --set pipeline.microbatches="$MICRO" --set pipeline.stash="$pol" --set output.dir="$dir"
    tp=$(steady_throughput "$dir/metrics.csv" 32 "$WARMUP")
    row=$("$PY" - "$dir/summary.json" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))
p = j["pipeline"]
devs = [d for d in p["devices"] if d["name"] != "host"]
wall = j["wall_seconds"]
peak = max(d["peak_bytes"] for d in devs) / 2**20
idle = 100 * (1 - sum(d["busy_seconds"] for d in devs) / len(devs) / wall)
stall = 100 * max(t["stall_seconds"] for t in p["transfers"]) / wall
copy = sum(t["copy_seconds"] for t in p["transfers"])
hidden = sum(t["hidden_seconds"] for t in p["transfers"])
overlap = "%.1f" % (100 * hidden / copy) if copy > 0 else ""
print("%.1f,%.1f,%.1f,%.1f,%s,%.4f" % (peak, p["host_pool"]["peak_bytes"] / 2**20, idle, stall,
                                      overlap, j["final_loss"]))
PYEOF
)
    IFS=, read -r peak host idle stall overlap loss <<<"$row"
    echo "$sched,$pol,$S,$D,$tp,$peak,$host,$idle,$simb,$stall,$overlap,$loss" >>"$CSV"
    echo "$name: $tp samples/s, peak $peak MiB, host $host MiB, idle $idle%, stall $stall%"
  done
done

fi

bar_pair_chart "$OUT/schedules.svg" \
  "VGG16 w=1/4, batch 32, M=$MICRO, 4 devices (experiments/schedule_comparison.sh)" "$CSV" \
  'sprintf("%s %s", strcol(1), strcol(2))' \
  "5|throughput (samples/s)|#4477aa" "6|peak device memory (MiB)|#cc6677"
column -s, -t "$CSV"
end_results
