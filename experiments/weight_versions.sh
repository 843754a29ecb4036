#!/usr/bin/env bash
# Weight versions in the host pool (issue 5, "Stash kinds", last bullet; Note [Weight-version
# offload] in schedules/Lowering.h): pipedream on the VGG16 of offload_memory.sh (width 1/2,
# 3 channels, Adam, batch 32 in 8 microbatches, 4 virtual devices, the planner's partition,
# lookahead 1), three rows in one run:
#   keep             pipeline.stash keep (versions stay; the graph stash stays)
#   offload-none     pipeline.stash offload, pipeline.offload_weights none (versions stay)
#   offload          pipeline.stash offload, pipeline.offload_weights auto (OFFW/PREW/DROPW)
# Per device, from pipefb_train's summary.json: the peak of category weight_versions (MiB),
# the device's peak (MiB), and the host pool's peak. Weight versions do not depend on the
# image size (the classifier's input is pooled to 7 x 7), so SIZE defaults to 32 px.
# PARTITION=params cuts by parameter bytes instead of the planner's cut, which puts the
# classifier (most of the weights) on the last stage, where pipedream stashes no version.
#
#   experiments/weight_versions.sh                  (after scripts/setup; ~5 minutes)
#   PARTITION=params OUT=experiments/results/weight_versions/params experiments/weight_versions.sh
source "$(dirname "$0")/lib.sh"
SIZE=${SIZE:-32}
ITERS=${ITERS:-4}
WIDTH=${WIDTH:-0.5}
LOOKAHEAD=${LOOKAHEAD:-1}
PARTITION=${PARTITION:-planner}
need pipefb_train
start_results weight_versions
echo "vgg16 width $WIDTH, ${SIZE} px, 3 channels, batch 32, 8 microbatches, 4 devices, adam, pipedream, lookahead $LOOKAHEAD, partition_by $PARTITION, $ITERS iterations" >>"$OUT/machine.txt"
CSV=$OUT/results.csv
echo "row,device,weight_versions_peak_mib,device_peak_mib,host_pool_peak_mib" >"$CSV"
for row in keep offload-none offload; do
  case $row in
    keep) pol=keep; ow=auto ;;
    offload-none) pol=offload; ow=none ;;
    offload) pol=offload; ow=auto ;;
  esac
  dir=$OUT/runs/$row
  rm -rf "$dir"
  echo "== $row (load $(cut -d' ' -f1 /proc/loadavg))"
  timed "$OUT/$row.log" "$BUILD/pipefb_train" --config "$ROOT/configs/vgg16-single.yaml" \
    --set model.width="$WIDTH" --set model.input_size="$SIZE" --set model.channels=3 \
    --set training.batch=32 --set training.optimizer=adam --set training.lr=0.0001 \
    --set training.lr_schedule=constant \
    --set data.name=synthetic --set data.synthetic_train=320 --set data.synthetic_test=32 \
    --set training.iterations="$ITERS" --set training.eval=false --set training.checkpoint=false \
    --set output.progress=false --set training.log_every=1000 \
    --set pipeline.schedule=pipedream --set devices.count=4 --set pipeline.microbatches=8 \
    --set pipeline.stash=$pol --set pipeline.offload_weights=$ow \
    --set pipeline.lookahead="$LOOKAHEAD" --set pipeline.partition_by="$PARTITION" \
    --set output.dir="$dir"
  "$PY" - "$dir/summary.json" "$row" >>"$CSV" <<'PYEOF'
import json, sys
p = json.load(open(sys.argv[1]))["pipeline"]
mib = lambda b: b / 2**20
for d in p["devices"]:
    wv = d["category_peaks"]["weight_versions"]  # the category's own peak
    print(f"{sys.argv[2]},{d['name']},{mib(wv):.1f},{mib(d['peak_bytes']):.1f},"
          f"{mib(p['host_pool']['peak_bytes']):.1f}")
PYEOF
done
column -s, -t "$CSV" | tee "$OUT/table.txt"
end_results
