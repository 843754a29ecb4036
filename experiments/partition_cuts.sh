#!/usr/bin/env bash
# Is the planner's partition the best one? (issue 15, item 5) The two-stage 1f1b VGG16 case
# of runtime_bench (VGG16 width 1/4, batch 32, 1x32x32, 4 microbatches, 2 virtual devices,
# keep): every cut 1..15 and the planner's own (`planner`: the partition pipefb_train picks,
# on the measured profile) are timed in ROUNDS interleaved rounds; each round runs every
# candidate once, in a shuffled order, so a change of machine load hits all alike. The
# figure of a cut is the median over rounds of its pipeline iteration time (and of its
# speed-up over plain LibTorch measured in the same process, a ratio that cancels the
# load that both share).
#
#   experiments/partition_cuts.sh      # BUILD=build ROUNDS=5 ITERS=10 CUTS="$(seq 1 15)"
#
# OMP_WAIT_POLICY=PASSIVE: on a loaded machine the plain run's 2 OpenMP threads otherwise
# spin for their partner and one iteration took 21 s instead of 0.7 s; the pipeline
# (one intra-op thread per device) has no parallel regions and is not affected.
#
# Writes experiments/results/partition_cuts/:
#   runs.csv     one row per (round, candidate): iteration times of plain and pipeline
#   cuts.csv     per candidate: median pipeline ms, median speed-up, ratio to the best cut
#   verdict.txt  the planner's cut, the best cut, and planner / best (goal <= 1.15)
#   logs/        runtime_bench output of every run
source "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-5}
ITERS=${ITERS:-10}
CUTS=${CUTS:-$(seq 1 15)}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
[[ -x "$BUILD/tests/runtime/runtime_bench" ]] || {
  echo "$(basename "$0"): $BUILD/tests/runtime/runtime_bench is missing; build it (ninja -C $BUILD runtime_bench)" >&2
  exit 2
}
start_results partition_cuts
mkdir -p "$OUT/logs"
# The measured profile is cached under profiles/ of the working directory: measure it
# once before the timed rounds (the planner candidate would otherwise measure in round 1).
cd "$ROOT"
$NICE "$BUILD/tests/runtime/runtime_bench" 4 1 1f1b keep 2 planner 1 >"$OUT/logs/profile.log" 2>&1
echo "round,candidate,partition,plain_ms,pipeline_ms,speedup" >"$OUT/runs.csv"
CANDIDATES=(planner $CUTS)
for r in $(seq 1 "$ROUNDS"); do
  for c in $(printf '%s\n' "${CANDIDATES[@]}" | shuf --random-source=<(yes "$r")); do
    log="$OUT/logs/round${r}_${c}.log"
    $NICE "$BUILD/tests/runtime/runtime_bench" 4 "$ITERS" 1f1b keep 2 "$c" 1 >"$log" 2>&1
    plain=$(awk '/^plain LibTorch/ {print $(NF-3)}' "$log")
    piped=$(awk '/^pipeline \(/ {print $(NF-3)}' "$log")
    part=$(sed -n 's/.*partition \(.*\) (.*/\1/p' "$log" | head -1)
    echo "$r,$c,\"$part\",$plain,$piped,$(awk -v p="$plain" -v q="$piped" 'BEGIN{printf "%.4f", p/q}')" >>"$OUT/runs.csv"
  done
  echo "round $r of $ROUNDS done"
done
"$PY" - "$OUT/runs.csv" "$OUT/cuts.csv" "$OUT/verdict.txt" <<'PY'
import csv, statistics, sys
# A run whose log has no times (the bench was killed) is left out and counted.
allrows = list(csv.DictReader(open(sys.argv[1])))
rows = [r for r in allrows if r["pipeline_ms"] and r["plain_ms"]]
by = {}
for r in rows:
    by.setdefault(r["candidate"], []).append(r)
med = {c: statistics.median(float(r["pipeline_ms"]) for r in rs) for c, rs in by.items()}
spd = {c: statistics.median(float(r["speedup"]) for r in rs) for c, rs in by.items()}
cuts = [c for c in by if c != "planner"]
best = min(cuts, key=lambda c: med[c])
best_spd = max(cuts, key=lambda c: spd[c])
with open(sys.argv[2], "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["candidate", "partition", "rounds", "median_pipeline_ms", "median_speedup",
                "time_vs_best", "speedup_best_vs_this"])
    for c in ["planner"] + sorted(cuts, key=int):
        w.writerow([c, by[c][0]["partition"], len(by[c]), f"{med[c]:.2f}", f"{spd[c]:.3f}",
                    f"{med[c] / med[best]:.3f}", f"{spd[best_spd] / spd[c]:.3f}"])
planner_part = by["planner"][0]["partition"]
lines = [
    f"planner's partition: {planner_part}",
    f"best cut by median iteration time: {best} ({by[best][0]['partition']}), {med[best]:.2f} ms",
    f"best cut by median speed-up over plain LibTorch: {best_spd} ({by[best_spd][0]['partition']}), {spd[best_spd]:.3f}x",
    f"planner: {med['planner']:.2f} ms, speed-up {spd['planner']:.3f}x",
    f"cuts measured: {' '.join(sorted(cuts, key=int))}; runs without times left out: {len(allrows) - len(rows)}",
    f"planner / best iteration time: {med['planner'] / med[best]:.3f} (goal <= 1.15)",
    f"best / planner speed-up: {spd[best_spd] / spd['planner']:.3f} (goal <= 1.15)",
]
open(sys.argv[3], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
end_results
