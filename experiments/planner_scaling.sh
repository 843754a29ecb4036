#!/usr/bin/env bash
# Planner scaling: solve time against layers x devices, on bench_planner's synthetic
# profile (a transformer-like chain with costs drawn from a fixed seed, 16 GiB devices over
# 10 GB/s links, every schedule and policy, batch 512, simulator re-scoring of the top 4).
# Two solves per point: unconstrained, and with a 3 GiB budget (memory binds).
#
#   experiments/planner_scaling.sh                       (after scripts/setup; ~2 minutes)
#   LAYERS="50 100 200 400 1000" DEVICES="8 64" experiments/planner_scaling.sh
# Writes experiments/results/planner_scaling/{results.csv,solve_time.svg,bench.log,machine.txt}.
source "$(dirname "$0")/lib.sh"
LAYERS=${LAYERS:-25 50 100 200 400}
DEVICES=${DEVICES:-4 8 16 32 64}
need bench_planner
start_results planner_scaling
CSV=$OUT/results.csv
if ! plot_only; then
echo "layers,devices,solve_s,solve_budget3g_s,best" >"$CSV"
: >"$OUT/bench.log"
for L in $LAYERS; do
  for D in $DEVICES; do
    # bench_planner exits 1 when a speed target (< 2 s) is missed: that is a result here.
    out=$($NICE "$BUILD/bench_planner" --layers "$L" --devices "$D" 2>&1) || true
    echo "$out" >>"$OUT/bench.log"
    t1=$(sed -n 's/^plan [0-9]* layers x [0-9]* devices: \([0-9.]*\) s.*/\1/p' <<<"$out")
    t2=$(sed -n 's/^plan [0-9]* layers x [0-9]* devices, budget 3 GiB: \([0-9.]*\) s.*/\1/p' <<<"$out")
    best=$(sed -n 's/^plan [0-9]* layers x [0-9]* devices: .*best \(.*\) iteration.*/\1/p' <<<"$out")
    [[ $best == "- "* ]] && best="infeasible"  # bench_planner prints "best - S=1 M=1 ... (infeasible)"
    [[ -n $t1 && -n $t2 ]] || { echo "$(basename "$0"): unexpected bench_planner output: $out" >&2; exit 1; }
    echo "$L,$D,$t1,$t2,$best" >>"$CSV"
    echo "$L layers x $D devices: $t1 s, budget 3 GiB $t2 s ($best)"
  done
done

fi

# One line per device count: solve time against layers (log-log).
plots=""
for D in $DEVICES; do
  plots+="${plots:+, }'$CSV' using (\$2==$D ? \$1 : 1/0):3 skip 1 with linespoints title '$D devices'"
done
gnuplot <<GP
set terminal svg size 760,460 dynamic noenhanced background rgb 'white'
set output '$OUT/solve_time.svg'
set datafile separator ','
set title 'planner solve time (experiments/planner_scaling.sh)'
set xlabel 'layers'
set ylabel 'solve time (s)'
set logscale xy
set grid
set key left top
plot $plots
GP
column -s, -t "$CSV"
end_results
