#!/usr/bin/env bash
# Memory-budget sweep, measured: for VGG16, ResNet50 (width 1/4, 1x32x32, batch 32) and
# GPT-2 tiny (sequence 64, batch 16), on 4 virtual CPU devices with 4 microbatches,
# pipefb_sweep plans every schedule family at each per-device budget, then (--measure)
# trains each distinct feasible plan for MEASURE iterations with pipefb_train --plan and
# records the measured peak per device next to the predicted one.
#   summary.csv   model, family: the smallest feasible budget (planner), and at the
#                 smallest swept budget that was feasible: predicted and measured peak
#                 (max over devices), measured throughput
#   <model>/sweep.csv, sweep.png   pipefb_sweep's own output (every point)
#
#   experiments/memory_budget_sweep.sh                       (after scripts/setup; ~10 minutes)
#   MODELS="vgg16" MEASURE=0 experiments/memory_budget_sweep.sh     (planner only: seconds)
source "$(dirname "$0")/lib.sh"
MODELS=${MODELS:-vgg16 resnet50 gpt2}
MEASURE=${MEASURE:-3}
FAMILIES=${FAMILIES:-1f1b-keep,1f1b-offload,1f1b,gpipe,pipedream,pipefb-sync,pipefb-async}
need pipefb_sweep pipefb_train
start_results memory_budget_sweep
SUM=$OUT/summary.csv
if ! plot_only; then
echo "families $FAMILIES, measure $MEASURE iterations per plan" >>"$OUT/machine.txt"

declare -A ARGS BUDGETS
ARGS[vgg16]="--config $ROOT/configs/vgg16-single.yaml --set model.width=0.25 --set training.batch=32"
BUDGETS[vgg16]=${VGG_BUDGETS:-32MiB:512MiB:5}
ARGS[resnet50]="--config $ROOT/configs/resnet50.yaml --set model.width=0.25 --set training.batch=32"
BUDGETS[resnet50]=${RESNET_BUDGETS:-16MiB:256MiB:5}
ARGS[gpt2]="--config $ROOT/configs/gpt2-tiny.yaml --set training.batch=16"
BUDGETS[gpt2]=${GPT2_BUDGETS:-8MiB:128MiB:5}

echo "model,family,smallest_budget_mib,at_budget_mib,plan,predicted_peak_mib,measured_peak_mib,measured_samples_per_s,measure_note" >"$SUM"
for model in $MODELS; do
  [[ -n ${ARGS[$model]:-} ]] || { echo "$(basename "$0"): MODELS: unknown model '$model'; allowed: vgg16 resnet50 gpt2" >&2; exit 2; }
  dir=$OUT/$model
  rm -rf "$dir"
  mkdir -p "$dir"
  measure=()
  [[ $MEASURE == 0 ]] || measure=(--measure "$MEASURE")
  # shellcheck disable=SC2086
  timed "$dir/sweep.log" "$BUILD/pipefb_sweep" ${ARGS[$model]} --set devices.count=4 \
    --set pipeline.schedule=1f1b --set data.name=synthetic --microbatches 4 \
    --budgets "${BUDGETS[$model]}" --schedules "$FAMILIES" "${measure[@]}" -o "$dir"
  "$PY" - "$dir/sweep.csv" "$model" "$SUM" <<'PYEOF'
import csv, sys
path, model, out = sys.argv[1:]
rows = list(csv.DictReader(open(path)))
mib = lambda b: "%.1f" % (float(b) / 2**20) if b not in ("", None) and float(b) >= 0 else ""
fams = []
for r in rows:
    if r["family"] not in fams:
        fams.append(r["family"])
with open(out, "a") as f:
    for fam in fams:
        pts = [r for r in rows if r["family"] == fam]
        feas = [r for r in pts if r["feasible"] == "1"]
        r = min(feas, key=lambda r: float(r["budget_bytes"])) if feas else None
        plan = ("%s S=%s M=%s %s" % (r["schedule"], r["stages"], r["microbatches"], r["policies"])) if r else "none fits"
        meas_peak = mib(r.get("measured_peak_bytes") or "") if r else ""
        tp = r.get("measured_throughput_samples_s", "") if r else ""
        note = (r.get("measure_note") or "").strip() if r else ""
        exitc = r.get("measure_exit", "") if r else ""
        if exitc not in ("", "0"):
            note = ("exit %s: %s" % (exitc, note)).strip()
        f.write(",".join([model, fam, mib(pts[0]["min_feasible_budget_bytes"]),
                          mib(r["budget_bytes"]) if r else "", plan,
                          mib(r["peak_bytes"]) if r else "", meas_peak,
                          ("%.1f" % float(tp)) if tp else "", note.replace(",", " ")]) + "\n")
PYEOF
  echo "$model done: $(grep -c . "$dir/sweep.csv") sweep rows"
done

fi

# Smallest feasible budget per family and model (log scale).
gnuplot <<GP
set terminal svg size 1000,520 dynamic noenhanced background rgb 'white'
set output '$OUT/smallest_budget.svg'
set datafile separator ','
set title 'smallest feasible per-device budget, 4 devices (experiments/memory_budget_sweep.sh)'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set xtics rotate by -35 noenhanced
set ylabel 'MiB'
set logscale y
set grid ytics
set key off
plot '$SUM' using 3:xtic(sprintf("%s %s", strcol(1), strcol(2))) skip 1 lc rgb '#4477aa'
GP
column -s, -t "$SUM"
end_results
