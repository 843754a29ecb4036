#!/usr/bin/env bash
# Convergence of the asynchronous schedules (issue 4): pipedream and pipefb-async against
# 1f1b (and the gradient-exact pipefb-sync) after the same number of samples, on the
# default config's small VGG (VGG16 width 1/8, Fashion-MNIST padded to 32 px, Adam 1e-3,
# cosine), 2 stages x 4 microbatches (pipefb: 2 stages on 4 devices), partition by the
# planner. Every schedule gets the same config; only pipeline.schedule and devices.count
# differ.
#   results.csv     schedule, samples, test accuracy and loss, last training loss,
#                   throughput, accuracy gap to 1f1b in points
#   loss.svg        training loss (mean of 20 steps) against samples
#
#   experiments/async_convergence.sh                      (after scripts/setup; ~10 minutes)
#   ITERS=937 experiments/async_convergence.sh            (one epoch)
#   LR=0.0003 OUT=/tmp/ac experiments/async_convergence.sh
#   SCHEDULES=pipefb-async EXTRA="--set pipeline.async_lag=1" experiments/async_convergence.sh
source "$(dirname "$0")/lib.sh"
ITERS=${ITERS:-200}
LR=${LR:-0.001}
SCHEDULES=${SCHEDULES:-1f1b pipedream pipefb-sync pipefb-async}
EXTRA=${EXTRA:-}
need pipefb_train
start_results async_convergence
echo "vgg16 width 0.125 fashion-mnist batch 64 microbatches 4 adam lr $LR cosine, $ITERS iterations $EXTRA" >>"$OUT/machine.txt"

CSV=$OUT/results.csv
echo "schedule,samples,test_accuracy,test_loss,final_train_loss,samples_per_s,gap_to_1f1b_points" >"$CSV"
ref=""
for sched in $SCHEDULES; do
  if [[ $sched == pipefb-* ]]; then D=4; else D=2; fi
  dir=$OUT/runs/$sched
  rm -rf "$dir"
  timed "$OUT/$sched.log" "$BUILD/pipefb_train" --config "$ROOT/configs/vgg16-single.yaml" \
    --set training.lr="$LR" --set training.iterations="$ITERS" --set training.log_every=1000 \
    --set training.checkpoint=false --set output.progress=false \
    --set pipeline.schedule="$sched" --set pipeline.stages=2 --set devices.count=$D \
    --set pipeline.microbatches=4 --set output.dir="$dir" $EXTRA
  acc=$(json "$dir/summary.json" "j['test_accuracy']")
  [[ $sched == 1f1b ]] && ref=$acc
  gap=""
  [[ -n $ref ]] && gap=$("$PY" -c "print('%.2f' % (100*($acc-$ref)))")
  row=$(json "$dir/summary.json" "'%d,%.4f,%.4f,%.4f,%.1f' % (j['samples'], j['test_accuracy'], j['test_loss'], j['final_loss'], j['throughput_samples_per_s'])")
  echo "$sched,$row,$gap" >>"$CSV"
  # loss curve: mean of 20 steps against samples
  awk -F, 'NR>1 {s+=$3; n++; if (n==20) {printf "%d %.4f\n", $1*64, s/n; s=0; n=0}}' \
    "$dir/metrics.csv" >"$OUT/$sched.loss.dat"
done
plot=""
for sched in $SCHEDULES; do
  plot+="${plot:+, }'$OUT/$sched.loss.dat' using 1:2 with lines lw 2 title '$sched'"
done
gnuplot <<GP
set terminal svg size 720,420 dynamic font 'sans,12'
set output '$OUT/loss.svg'
set title 'VGG16 w=1/8, Fashion-MNIST, Adam $LR: training loss'
set xlabel 'samples'
set ylabel 'loss (mean of 20 steps)'
set key top right
set grid
plot $plot
GP
column -s, -t "$CSV"
end_results
