#!/usr/bin/env bash
# Multi-process against threaded pipelines (issue 8): the same schedule on 2 devices,
# once as 2 virtual devices (threads) of one pipefb_train, once as 2 processes
# (pipefb_launch -n 2: one rank per device, c10d gloo over loopback), in one run, with
# the runs interleaved so that the machine's load hits both alike.
#   1f1b         2 stages on 2 devices, stash keep (F and B of a stage in one process)
#   pipefb-sync  1 stage, F on cpu:0 and B on cpu:1, stash checkpoint-offload (the stage
#                input crosses processes: OFF -> c10d -> PRE)
# VGG16 width 1/4, 1x32x32 synthetic images, batch 32, 4 microbatches, SGD; the
# planner's partition. samples/s = steady throughput after WARMUP iterations (rank 0's
# metrics.csv for the multi-process runs).
#
#   experiments/dist_throughput.sh              (after scripts/setup; ~3 minutes)
#   ITERS=40 REPS=3 experiments/dist_throughput.sh
source "$(dirname "$0")/lib.sh"
ITERS=${ITERS:-30}
WARMUP=${WARMUP:-5}
REPS=${REPS:-2}
MICRO=${MICRO:-4}
need pipefb_train pipefb_launch
start_results dist_throughput
CSV=$OUT/results.csv
echo "vgg16 width 0.25 batch 32 microbatches $MICRO iterations $ITERS (warm-up $WARMUP), $REPS repetitions" >>"$OUT/machine.txt"
echo "schedule,mode,rep,samples_per_s,wall_s,final_loss" >"$CSV"
for rep in $(seq 1 "$REPS"); do
  for sched in 1f1b pipefb-sync; do
    if [[ $sched == 1f1b ]]; then S=2; pol=keep; else S=1; pol=checkpoint-offload; fi
    for mode in threads processes; do
      name=$sched-$mode-$rep
      dir=$OUT/runs/$name
      rm -rf "$dir"
      args=(--config "$ROOT/configs/vgg16-single.yaml"
        --set model.width=0.25 --set training.batch=32 --set training.optimizer=sgd --set training.lr=0.01
        --set training.lr_schedule=constant
        --set data.name=synthetic --set data.synthetic_train=256 --set data.synthetic_test=32
        --set training.iterations="$ITERS" --set training.eval=false --set training.checkpoint=false
        --set output.progress=false --set training.log_every=1000
        --set pipeline.schedule="$sched" --set pipeline.stages=$S --set devices.count=2
        --set pipeline.microbatches="$MICRO" --set pipeline.stash="$pol" --set output.dir="$dir")
      if [[ $mode == threads ]]; then
        timed "$OUT/$name.log" "$BUILD/pipefb_train" "${args[@]}"
        metrics=$dir/metrics.csv; summary=$dir/summary.json
      else
        timed "$OUT/$name.log" "$BUILD/pipefb_launch" -n 2 -- "$BUILD/pipefb_train" "${args[@]}"
        metrics=$dir/rank0/metrics.csv; summary=$dir/rank0/summary.json
      fi
      tp=$(steady_throughput "$metrics" 32 "$WARMUP")
      loss=$(json "$summary" 'j["final_loss"]')
      echo "$sched,$mode,$rep,$tp,$WALL_S,$loss" | tee -a "$CSV"
    done
  done
done
end_results
