#!/usr/bin/env bash
# Issue 18, runtime: zb-h1 (and zb-h2) against 1f1b in pipefb_train on virtual devices.
# VGG16 width 1/4 at 32 px, batch 32, M = 8, S = STAGES devices (default 2 and 4), keep.
# Both schedules run on the SAME cuts: 1f1b's planner partition (pipefb_train's default),
# read from its summary.json and given to zb-h1 / zb-h2 as pipeline.partition. Rounds
# alternate the schedules so that the machine's load drifts over all of them alike.
#   -> runs.csv: round, stages, schedule, steady samples/s (steps after WARMUP),
#      mean F, B, I, W action ms (trace.json's window, all devices)
#   -> summary.csv: per S and schedule, the median over rounds of its iteration time over
#      1f1b's of the same round, and (I + W) / B from the mean action times.
#   ROUNDS=5 ITERS=20 WARMUP=5 STAGES="2 4" SCHEDULES="zb-h1 zb-h2" experiments/zb_runtime.sh
source "$(dirname "$0")/lib.sh"
need pipefb_train
start_results zb_runtime
ROUNDS=${ROUNDS:-5}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
STAGES=${STAGES:-2 4}
SCHEDULES=${SCHEDULES:-zb-h1 zb-h2}
BATCH=32
RUNS=$OUT/runs.csv
echo "round,stages,schedule,samples_per_s,f_ms,b_ms,i_ms,w_ms" >"$RUNS"

# mean action ms per category (F, B, I, W) in trace.json, as "f,b,i,w" ("nan" if none)
action_ms() {
  "$PY" - "$1" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))
ev = j["traceEvents"] if isinstance(j, dict) else j
out = []
for cat in ("F", "B", "I", "W"):
    d = [e["dur"] for e in ev if e.get("ph") == "X" and e.get("cat") == cat]
    out.append("%.4f" % (sum(d) / len(d) / 1e3) if d else "nan")
print(",".join(out))
PYEOF
}

run() {  # run ROUND S SCHEDULE [extra --set ...]
  local r=$1 s=$2 sched=$3; shift 3
  local dir=$OUT/r$r-S$s-$sched
  rm -rf "$dir"
  timed "$dir.log" "$BUILD/pipefb_train" --config "$ROOT/configs/vgg16-single.yaml" \
    --set model.width=0.25 --set model.input_size=32 --set training.batch=$BATCH \
    --set pipeline.microbatches=8 --set pipeline.stash=keep \
    --set pipeline.schedule="$sched" --set devices.count="$s" --set pipeline.stages="$s" \
    --set data.name=synthetic --set data.synthetic_train=$((BATCH * ITERS)) \
    --set data.synthetic_test=$BATCH --set training.iterations="$ITERS" \
    --set training.eval=false --set training.checkpoint=false \
    --set output.trace_steps="[$WARMUP, $((ITERS - WARMUP))]" \
    --set output.dir="$dir" "$@"
  echo "$r,$s,$sched,$(steady_throughput "$dir/metrics.csv" $BATCH "$WARMUP"),$(action_ms "$dir/trace.json")" >>"$RUNS"
}

if ! plot_only; then
  for r in $(seq 1 "$ROUNDS"); do
    for s in $STAGES; do
      run "$r" "$s" 1f1b
      cuts=$(json "$OUT/r$r-S$s-1f1b/summary.json" \
        "','.join(p.split(',')[0].strip('[') for p in j['pipeline']['partition'].split(' ')[1:])")
      for sched in $SCHEDULES; do run "$r" "$s" "$sched" --set pipeline.partition="[$cuts]"; done
    done
  done
fi

"$PY" - "$RUNS" "$OUT/summary.csv" <<'PYEOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
base = {(r["round"], r["stages"]): float(r["samples_per_s"]) for r in rows if r["schedule"] == "1f1b"}
ms = lambda rs, k: statistics.mean(float(r[k]) for r in rs if r[k] != "nan")
out = open(sys.argv[2], "w")
out.write("stages,schedule,rounds,median_iteration_time_over_1f1b,min,max,i_plus_w_over_b\n")
for s in sorted({r["stages"] for r in rows}, key=int):
    b = ms([r for r in rows if r["stages"] == s and r["schedule"] == "1f1b"], "b_ms")
    for sched in sorted({r["schedule"] for r in rows if r["schedule"] != "1f1b"}):
        rs = [r for r in rows if r["stages"] == s and r["schedule"] == sched]
        ratios = [base[(r["round"], s)] / float(r["samples_per_s"]) for r in rs]
        iw = (ms(rs, "i_ms") + ms(rs, "w_ms")) / b
        line = "%s,%s,%d,%.3f,%.3f,%.3f,%.3f" % (s, sched, len(ratios), statistics.median(ratios),
                                                min(ratios), max(ratios), iw)
        out.write(line + "\n")
        print(line)
PYEOF
end_results
