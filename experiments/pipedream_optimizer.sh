#!/usr/bin/env bash
# pipefb's planner against PipeDream's optimizer on PipeDream's own profiles
# (tests/data/pipedream/<model>/graph.txt: VGG16, ResNet50, Inception-v3, measured by
# PipeDream's authors on V100s at a minibatch of 128). For each model x devices (4, 8) x
# per-device memory (none, 16e9, 8e9, 6e9, 4e9 bytes):
#   PipeDream: optimizer/optimizer_graph_hierarchical.py --straight_pipeline -n N
#     -b 12000000000 [--use_memory_constraint -s BYTES], run from a PipeDream checkout with
#     the build's python (build/pipefb-python, + graphviz from PyPI); its "Time per stage in pipeline"
#     (seconds per minibatch of 128), "no plan" when it fails, "timeout" past PD_TIMEOUT s.
#   pipefb best: pipefb_plan on configs/clusters/Nx-v100-pcie (12 GB/s every pair) with
#     --budget BYTES (none: the 16 GB devices' capacity), every schedule and policy.
#   pipefb like-for-like: pipefb_plan on Nx-v100-ideal (links and memory unlimited, so
#     compute only, as PipeDream without --activation_compression_ratio) restricted to
#     --schedules pipedream-keep --microbatches 1, with the same --budget.
#   pipefb M=1: the best plan with one microbatch of 128 (what offload and checkpointing
#     do without microbatching), on Nx-v100-pcie.
# Output: results.csv, table.md (the README's table) and each run's log in OUT.
#
#   PIPEDREAM=/path/to/pipedream experiments/pipedream_optimizer.sh      (~5 minutes)
# PIPEDREAM: a checkout of https://github.com/msr-fiddle/pipedream, or its bare git
# directory (default: cloned into a scratch directory). PD_TIMEOUT: seconds per PipeDream run
# (default 120). MODELS, DEVICES, MEMORY override the lists.
source "$(dirname "$0")/lib.sh"
MODELS=${MODELS:-vgg16 resnet50 inception_v3}
DEVICES=${DEVICES:-4 8}
MEMORY=${MEMORY:-none 16000000000 8000000000 6000000000 4000000000}
PD_TIMEOUT=${PD_TIMEOUT:-120}
need pipefb_plan
start_results pipedream_optimizer
CFG=$ROOT/configs/pipedream-sgd.yaml

# PipeDream's optimizer runs on the build's python (torch 2.11's venv), which has numpy;
# graphviz comes from PyPI into the same venv (not CI).
if ! "$PY" -c 'import graphviz, numpy' 2>/dev/null; then
  "$PY" -m pip install --disable-pip-version-check graphviz numpy >"$OUT/pip.log" 2>&1 || true
  "$PY" -c 'import graphviz, numpy' 2>/dev/null || {
    echo "$(basename "$0"): $PY needs graphviz and numpy: $PY -m pip install graphviz numpy" >&2
    exit 2
  }
fi
# PipeDream's code is run from a scratch copy, never kept with the results.
PD=$(mktemp -d)
trap 'rm -rf "$PD"' EXIT
if [[ -n ${PIPEDREAM:-} && -d $PIPEDREAM/optimizer ]]; then
  cp -r "$PIPEDREAM/optimizer" "$PIPEDREAM/graph" "$PD/"
elif [[ -n ${PIPEDREAM:-} ]] && git --git-dir="$PIPEDREAM" rev-parse HEAD >/dev/null 2>&1; then
  git --git-dir="$PIPEDREAM" archive HEAD optimizer graph | tar -x -C "$PD"
else
  git clone -q --depth 1 https://github.com/msr-fiddle/pipedream "$PD/clone"
  mv "$PD/clone/optimizer" "$PD/clone/graph" "$PD/" && rm -rf "$PD/clone"
fi

# pd MODEL N MEMORY: PipeDream's seconds per minibatch, "no plan" or "timeout".
pd() {
  local log=$OUT/logs/pd-$1-$2-$3.log mem=()
  [[ $3 != none ]] && mem=(--use_memory_constraint -s "$3")
  local rc=0
  (cd "$PD/optimizer" && timeout "$PD_TIMEOUT" $NICE "$PY" optimizer_graph_hierarchical.py \
    -f "$ROOT/tests/data/pipedream/$1/graph.txt" -n "$2" -b 12000000000 --straight_pipeline \
    "${mem[@]}") >"$log" 2>&1 || rc=$?
  if [[ $rc == 124 ]]; then echo timeout
  elif grep -q "Time per stage in pipeline" "$log"; then
    awk -F': ' '/Time per stage in pipeline/ {printf "%.5f", $2}' "$log"
  else echo "no plan"; fi
  # Its summary (or its error) is at the end; the rest is numpy dumps of its DP tables.
  tail -n 12 "$log" >"$log.tail" && mv "$log.tail" "$log"
}

# plan NAME MODEL CLUSTER MEMORY ARGS...: "seconds|schedule S=.. M=.. policies|solve s"
plan() {
  local name=$1 model=$2 cluster=$3 memory=$4; shift 4
  local log=$OUT/logs/$name-$model-$cluster-$memory.log yaml=$OUT/logs/$name-$model-$cluster-$memory.yaml
  local budget=()
  [[ $memory != none ]] && budget=(--budget "$memory")
  local t0 t1 rc=0
  t0=$(date +%s.%N)
  $NICE "$BUILD/pipefb_plan" -q --config "$CFG" --profile "$ROOT/tests/data/pipedream/$model/graph.txt" \
    --cluster "$cluster" "${budget[@]}" "$@" -o "$yaml" >"$log" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  local solve; solve=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b-a}')
  if [[ $rc != 0 ]]; then echo "none|no plan fits|$solve"; return; fi
  local it sched stages mb pols
  it=$(awk '/^  iteration_time:/ {print $2}' "$yaml")
  sched=$(awk '/^family:/ {print $2}' "$yaml")
  mb=$(awk '/^microbatches:/ {print $2}' "$yaml")
  stages=$(grep -c '^  - layers:' "$yaml")
  # Policies per stage, run-length coded: keep x3, checkpoint.
  pols=$(awk '/^    policy:/ {print $2}' "$yaml" | uniq -c | awk '{printf "%s%s%s", (NR>1?" ":""), $2, ($1>1?"x"$1:"")}')
  printf '%.5f|%s S=%s M=%s (%s)|%s\n' "$it" "$sched" "$stages" "$mb" "$pols" "$solve"
}

mkdir -p "$OUT/logs"
CSV=$OUT/results.csv
echo "model,devices,memory_bytes,pipedream_s,pipefb_best_s,pipefb_best_plan,pipefb_best_solve_s,pipefb_like_for_like_s,pipefb_m1_s,pipefb_m1_plan" >"$CSV"
for model in $MODELS; do
  for n in $DEVICES; do
    pd_free=""
    for mem in $MEMORY; do
      # Inception-v3 (326 nodes, 221,564 antichain states) does not finish unconstrained;
      # the memory check adds work to the same DP, so its constrained runs are not tried.
      if [[ $pd_free == timeout ]]; then p="not run (unconstrained: timeout)"; else p=$(pd "$model" "$n" "$mem"); fi
      [[ $mem == none ]] && pd_free=$p
      IFS='|' read -r best best_plan best_solve <<<"$(plan best "$model" "${n}x-v100-pcie" "$mem")"
      IFS='|' read -r lfl _ _ <<<"$(plan lfl "$model" "${n}x-v100-ideal" "$mem" --schedules pipedream-keep --microbatches 1)"
      IFS='|' read -r m1 m1_plan _ <<<"$(plan m1 "$model" "${n}x-v100-pcie" "$mem" --microbatches 1)"
      echo "$model,$n,$mem,$p,$best,\"$best_plan\",$best_solve,$lfl,$m1,\"$m1_plan\"" >>"$CSV"
      echo "$model n=$n mem=$mem: pipedream $p | pipefb $best $best_plan (${best_solve}s) | like-for-like $lfl | M=1 $m1 $m1_plan"
    done
  done
done

# The README's table.
"$PY" - "$CSV" >"$OUT/table.md" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
def num(s):
    try: return float(s)
    except ValueError: return None
free = {(r["model"], r["devices"]): num(r["pipefb_best_s"]) for r in rows if r["memory_bytes"] == "none"}
print("| model | devices | memory per device | PipeDream (s) | pipefb best (s) | pipefb best plan | best / PipeDream | best / own unconstrained | like-for-like (s) | pipefb, one microbatch of 128 (s, plan) | pipefb solve (s) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    pd, best, lfl, m1 = num(r["pipedream_s"]), num(r["pipefb_best_s"]), num(r["pipefb_like_for_like_s"]), num(r["pipefb_m1_s"])
    f = free[(r["model"], r["devices"])]
    mem = "none" if r["memory_bytes"] == "none" else "%ge9" % (int(r["memory_bytes"]) / 1e9)
    print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        r["model"], r["devices"], mem, r["pipedream_s"],
        "%.5f" % best if best is not None else "none", r["pipefb_best_plan"],
        "%.3f" % (best / pd) if best is not None and pd is not None else "-",
        "%.3f" % (best / f) if best is not None and f else "-",
        "%.5f" % lfl if lfl is not None else "none",
        ("%.5f (%s)" % (m1, r["pipefb_m1_plan"])) if m1 is not None else "none",
        r["pipefb_best_solve_s"]))
PY
cat "$OUT/table.md"
end_results
