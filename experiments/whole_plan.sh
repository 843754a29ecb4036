#!/usr/bin/env bash
# The newcomer's command, `pipefb_train --config configs/vgg16.yaml`, with the plan the
# planner chooses whole (Note [The planner's whole plan in pipefb_train]: on 2 cores,
# pipefb-sync folded onto 2 of the 4 devices) against the 2S form it ran before (pinned
# with pipeline.placement "0/3 1/2"), PAIRS times each, alternated so that the load of the
# shared machine falls on both alike.
# -> runs.csv (pair, shape, samples/s, busiest/idlest busy seconds, the report's imbalance
#    warning), runs/ (every run folder), logs/.
#   experiments/whole_plan.sh        (~6 minutes)
source "$(dirname "$0")/lib.sh"
PAIRS=${PAIRS:-3}
ITERATIONS=${ITERATIONS:-150}
need pipefb_train
start_results whole_plan
mkdir -p "$OUT/runs" "$OUT/logs"
RUN="--config $ROOT/configs/vgg16.yaml --set training.iterations=$ITERATIONS
 --set training.eval=false --set training.checkpoint=false"
echo "pair,shape,samples_per_s,busy_max_s,busy_min_s,imbalance_warning" >"$OUT/runs.csv"
for i in $(seq 1 "$PAIRS"); do
  for shape in whole 2S; do
    pin=()
    [[ $shape == 2S ]] && pin=(--set 'pipeline.placement=0/3 1/2')
    dir="$OUT/runs/$shape-$i"
    rm -rf "$dir"
    echo "\$ pipefb_train $RUN ${pin[*]} --set output.dir=$dir" >"$OUT/logs/$shape-$i.txt"
    $NICE "$BUILD/pipefb_train" $RUN "${pin[@]}" --set output.dir="$dir" \
      >>"$OUT/logs/$shape-$i.txt" 2>&1
    "$PY" - "$dir" "$i" "$shape" >>"$OUT/runs.csv" <<'PYEOF'
import json, re, sys
d, pair, shape = sys.argv[1:]
s = json.load(open(d + "/summary.json"))
busy = [d["busy_seconds"] for d in s["pipeline"]["devices"] if d.get("busy_seconds", 0) > 0]
html = open(d + "/report.html").read()
warn = re.search(r"imbalanced stages: [^<;]*", html)
print(f"{pair},{shape},{s['throughput_samples_per_s']:.1f},"
      f"{max(busy) if busy else 'nan'},{min(busy) if busy else 'nan'},"
      f"\"{warn.group(0) if warn else 'none'}\"")
PYEOF
    tail -1 "$OUT/runs.csv"
  done
done
end_results
