#!/usr/bin/env bash
# Hybrid data + pipeline parallelism (issue 8): 1f1b with 2 stages x 2 replicas on 4 ranks
# (pipefb_launch -n 4, c10d gloo over loopback), the gradient all-reduce in four modes:
#   overlap-small  distributed.bucket_mb BUCKET_MB (1), buckets started during the B that
#                  completes a stage's gradients (Note [Gradient buckets])
#   at-ar-small    the same buckets, distributed.overlap false: all started at AR
#   overlap-one    one 25 MiB bucket (the default size), started by the hook of the last
#                  parameter backward finishes, still inside that B
#   at-ar-one      one 25 MiB bucket started at AR after that B: what the runtime did
#                  before the buckets
# as dist_throughput.sh runs it: VGG16 width 1/4, 1x32x32 synthetic images, batch 32 (16
# per replica), 4 microbatches, SGD, the planner's partition; samples/s after WARMUP
# iterations (rank 0's metrics.csv), the two modes interleaved, REPS repetitions.
# VGG16 at width 1/4 has ~3.7 MB of weights, so the default 25 MiB would be one bucket
# per stage: the overlap mode uses 1 MiB buckets.
#
#   experiments/hybrid_allreduce.sh           (after scripts/setup; ~10 minutes loaded)
#   ITERS=40 REPS=3 BUCKET_MB=2 experiments/hybrid_allreduce.sh
source "$(dirname "$0")/lib.sh"
ITERS=${ITERS:-30}
WARMUP=${WARMUP:-5}
REPS=${REPS:-2}
MICRO=${MICRO:-4}
BUCKET_MB=${BUCKET_MB:-1}
need pipefb_train pipefb_launch
start_results hybrid_allreduce
CSV=$OUT/results.csv
echo "vgg16 width 0.25 batch 32 microbatches $MICRO iterations $ITERS (warm-up $WARMUP), 1f1b 2 stages x 2 replicas, $REPS repetitions, bucket_mb $BUCKET_MB" >>"$OUT/machine.txt"
echo "mode,rep,samples_per_s,wall_s,final_loss" >"$CSV"
for rep in $(seq 1 "$REPS"); do
  for mode in ${MODES:-overlap-small at-ar-small overlap-one at-ar-one}; do
    case $mode in
      overlap-small) ov=true; mb=$BUCKET_MB ;;
      at-ar-small) ov=false; mb=$BUCKET_MB ;;
      overlap-one) ov=true; mb=25 ;;
      at-ar-one) ov=false; mb=25 ;;
      *) echo "unknown mode $mode" >&2; exit 2 ;;
    esac
    name=$mode-$rep
    dir=$OUT/runs/$name
    rm -rf "$dir"
    args=(--config "$ROOT/configs/vgg16-single.yaml"
      --set model.width=0.25 --set training.batch=32 --set training.optimizer=sgd --set training.lr=0.01
      --set training.lr_schedule=constant
      --set data.name=synthetic --set data.synthetic_train=256 --set data.synthetic_test=32
      --set training.iterations="$ITERS" --set training.eval=false --set training.checkpoint=false
      --set output.progress=false --set training.log_every=1000
      --set pipeline.schedule=1f1b --set pipeline.stages=2 --set devices.count=2
      --set pipeline.replicas=2 --set distributed.overlap=$ov --set distributed.bucket_mb=$mb
      --set pipeline.microbatches="$MICRO" --set pipeline.stash=keep --set output.dir="$dir")
    timed "$OUT/$name.log" "$BUILD/pipefb_launch" -n 4 -- "$BUILD/pipefb_train" "${args[@]}"
    tp=$(steady_throughput "$dir/rank0/metrics.csv" 32 "$WARMUP")
    loss=$(json "$dir/rank0/summary.json" 'j["final_loss"]')
    echo "$mode,$rep,$tp,$WALL_S,$loss" | tee -a "$CSV"
  done
done
end_results
