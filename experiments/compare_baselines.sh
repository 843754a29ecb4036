#!/usr/bin/env bash
# pipefb against what a user would pick instead, on the same model and batch:
#   pipefb_train, pipeline.schedule none (single device)      -> pipefb-none
#   pipefb_train, 1f1b on 2 devices (1 intra-op thread each) -> pipefb-1f1b-2dev
#   bench_trainer --only pipefb (the trainer's step alone)   -> pipefb-trainer-step
#   bench_trainer --only plain (a hand-written LibTorch loop) -> libtorch-plain
#   experiments/python_baseline.py (Python PyTorch 2.11 eager, build/pipefb-python) -> python-eager
# VGG16 (torchvision layout) width WIDTH, 1x32x32 input, 10 classes, batch BATCH, Adam
# lr 1e-3, synthetic data; each in its own process so /usr/bin/time -v gives its peak RSS.
# Throughput: samples/s over the STEPS steps after 3 warm-up steps (mean, not median).
#
#   experiments/compare_baselines.sh            (after scripts/setup; a few minutes)
#   WIDTH=0.25 BATCH=32 STEPS=20 THREADS=2 experiments/compare_baselines.sh
# On a loaded machine use THREADS=1: 2 OpenMP threads on 2 oversubscribed cores spin at
# their barriers and run ~10x slower (experiments/README.md).
# Writes experiments/results/compare_baselines/{results.csv,throughput_rss.svg,*.log,machine.txt}.
source "$(dirname "$0")/lib.sh"
WIDTH=${WIDTH:-0.125}
BATCH=${BATCH:-64}
STEPS=${STEPS:-30}
THREADS=${THREADS:-2}
WARMUP=3
need pipefb_train bench_trainer
start_results compare_baselines
CSV=$OUT/results.csv
if ! plot_only; then
echo "width $WIDTH batch $BATCH steps $STEPS threads $THREADS (single-device rows)" >>"$OUT/machine.txt"

echo "impl,threads,samples_per_s,peak_rss_mib,wall_s" >"$CSV"

ITERS=$((STEPS + WARMUP))
common=(--config "$ROOT/configs/vgg16-single.yaml"
  --set model.width="$WIDTH" --set training.batch="$BATCH"
  --set data.name=synthetic --set data.synthetic_train=$((BATCH * 4)) --set data.synthetic_test=$BATCH
  --set training.iterations=$ITERS --set training.lr_schedule=constant
  --set training.eval=false --set training.checkpoint=false --set output.progress=false
  --set training.log_every=1000)

run_train() {  # run_train NAME THREADS EXTRA...
  local name=$1 thr=$2; shift 2
  local dir=$OUT/runs/$name
  rm -rf "$dir"
  timed "$OUT/$name.log" "$BUILD/pipefb_train" "${common[@]}" --set output.dir="$dir" "$@"
  local tp; tp=$(steady_throughput "$dir/metrics.csv" "$BATCH" "$WARMUP")
  echo "$name,$thr,$tp,$RSS_MIB,$WALL_S" >>"$CSV"
  echo "$name: $tp samples/s, peak RSS $RSS_MIB MiB"
}

run_train pipefb-none "$THREADS" --set training.threads="$THREADS"
run_train pipefb-1f1b-2dev 1x2 --set pipeline.schedule=1f1b --set pipeline.stages=2 \
  --set devices.count=2 --set pipeline.microbatches=4

for side in pipefb plain; do
  name=$([[ $side == plain ]] && echo libtorch-plain || echo pipefb-trainer-step)
  timed "$OUT/$name.log" "$BUILD/bench_trainer" --model vgg16 --width "$WIDTH" --batch "$BATCH" \
    --steps "$STEPS" --optimizer adam --lr 0.001 --threads "$THREADS" --only $side --json
  tp=$(json <(tail -1 "$OUT/$name.log") "'%.1f' % j['$side']['samples_per_s_mean']")
  echo "$name,$THREADS,$tp,$RSS_MIB,$WALL_S" >>"$CSV"
  echo "$name: $tp samples/s, peak RSS $RSS_MIB MiB"
done

timed "$OUT/python-eager.log" "$PY" "$ROOT/experiments/python_baseline.py" --width "$WIDTH" \
  --batch "$BATCH" --steps "$STEPS" --warmup $WARMUP --threads "$THREADS" --optimizer adam --lr 0.001
tp=$(json <(tail -1 "$OUT/python-eager.log") "'%.1f' % j['samples_per_s_mean']")
echo "python-eager,$THREADS,$tp,$RSS_MIB,$WALL_S" >>"$CSV"
echo "python-eager: $tp samples/s, peak RSS $RSS_MIB MiB"

fi

bar_pair_chart "$OUT/throughput_rss.svg" \
  "VGG16 width $WIDTH, batch $BATCH, Adam (experiments/compare_baselines.sh)" "$CSV" 1 \
  "3|throughput (samples/s)|#4477aa" "4|peak RSS (MiB)|#cc6677"
column -s, -t "$CSV"
end_results
