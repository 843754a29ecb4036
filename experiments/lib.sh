# Shared helpers of the experiments/*.sh scripts (sourced, not run).
#   BUILD   build directory with the programs (default: <repo>/build, what scripts/setup makes)
#   OUT     results directory (default: experiments/results/<name>)
#   PLOT_ONLY=1  redraw the chart from the CSVs already in OUT (no runs, machine.txt kept)
# Every script writes machine.txt (cores, load before/after) next to its CSVs, because
# on a shared 2-core machine the load changes the numbers more than anything else.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD:-$ROOT/build}
PY=${PY:-$ROOT/build/pipefb-python}  # the build's torch 2.11 (Note [One LibTorch])
NICE=${NICE-nice -n 10}  # NICE= (empty): normal priority

need() {  # need PROGRAM...: the build's programs must exist
  for p in "$@"; do
    if [[ ! -x "$BUILD/$p" ]]; then
      echo "$(basename "$0"): $BUILD/$p is missing; run scripts/setup (or set BUILD=...)" >&2
      exit 2
    fi
  done
  command -v gnuplot >/dev/null || { echo "$(basename "$0"): gnuplot is missing; run scripts/setup" >&2; exit 2; }
}

plot_only() { [[ ${PLOT_ONLY:-0} == 1 ]]; }

start_results() {  # start_results NAME: OUT, machine.txt
  OUT=${OUT:-$ROOT/experiments/results/$1}
  mkdir -p "$OUT"
  plot_only && return 0
  {
    echo "experiment: $1"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "cores: $(nproc)"
    echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  } >"$OUT/machine.txt"
}

end_results() {
  plot_only || echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/machine.txt"
  echo "results in $OUT"
}

# timed LOG CMD...: runs CMD (niced) under /usr/bin/time -v; stdout+stderr to LOG, and
# sets RSS_MIB (maximum resident set size) and WALL_S. Fails if CMD fails.
timed() {
  local log=$1; shift
  local tv; tv=$(mktemp)
  if ! /usr/bin/time -v -o "$tv" $NICE "$@" >"$log" 2>&1; then
    echo "$(basename "$0"): failed: $* (see $log)" >&2; cat "$tv" >&2; rm -f "$tv"; exit 1
  fi
  RSS_MIB=$(awk -F': ' '/Maximum resident set size/ {printf "%.1f", $2/1024}' "$tv")
  WALL_S=$(awk -F': ' '/Elapsed \(wall clock\)/ {n=split($2,a,":"); s=0; for(i=1;i<=n;i++) s=s*60+a[i]; printf "%.2f", s}' "$tv")
  rm -f "$tv"
}

# json FILE EXPR: evaluates a Python expression over the JSON object `j` of FILE.
json() { "$PY" -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"; }

# steady_throughput METRICS_CSV BATCH WARMUP: samples/s over the steps after WARMUP
# (metrics.csv's elapsed_s is cumulative).
steady_throughput() {
  awk -F, -v b="$2" -v w="$3" 'NR==1{next} {s=$1; e[s]=$6; n=s} END {
    if (n<=w) {print "nan"; exit}
    printf "%.1f", b*(n-w)/(e[n]-e[w]) }' "$1"
}

# bar_pair_chart SVG TITLE CSV XTIC LEFT RIGHT: two clustered-bar panels side by side
# from CSV (its header row skipped). XTIC is the gnuplot label expression of a bar;
# LEFT and RIGHT are "column|panel title|colour".
bar_pair_chart() {
  local svg=$1 title=$2 csv=$3 xtic=$4 lcol ltitle lcolor rcol rtitle rcolor
  IFS='|' read -r lcol ltitle lcolor <<<"$5"
  IFS='|' read -r rcol rtitle rcolor <<<"$6"
  gnuplot <<GP
set terminal svg size 1100,520 dynamic noenhanced background rgb 'white'
set output '$svg'
set datafile separator ','
set multiplot layout 1,2 title "$title"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set xtics rotate by -35 noenhanced
set grid ytics
set yrange [0:*]
set key off
set title '$ltitle'
plot '$csv' using $lcol:xtic($xtic) skip 1 lc rgb '$lcolor'
set title '$rtitle'
plot '$csv' using $rcol:xtic($xtic) skip 1 lc rgb '$rcolor'
unset multiplot
GP
}
