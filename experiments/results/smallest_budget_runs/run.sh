#!/bin/bash
# Issue 15's case: plan at the smallest feasible budget, run it.
C="--config configs/vgg16.yaml --set model.width=0.25 --set training.batch=32 --set devices.count=4"
O=/tmp/lead/smallest
for f in pipefb-sync 1f1b pipedream; do
  B=$(build/pipefb_plan $C --set devices.memory=1GiB --set pipeline.schedule=$f --schedules $f --microbatches 4 --budget 1KiB -q 2>&1 | sed -n 's/.*--budget \([0-9]*\)).*/\1/p')
  build/pipefb_plan $C --set devices.memory=1GiB --set pipeline.schedule=$f --schedules $f --microbatches 4 --budget $B -o $O/$f.yaml > $O/$f.plan.txt 2>&1
  nice build/pipefb_train $C --plan $O/$f.yaml --set devices.memory=$B --set data.name=synthetic --set data.synthetic_train=128 --set training.iterations=2 --set training.eval=false --set output.dir=$O/run-$f > $O/$f.train.txt 2>&1
  echo "$f budget=$B rc=$?"
done
