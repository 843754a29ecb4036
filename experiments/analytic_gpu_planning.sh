#!/usr/bin/env bash
# Analytic planning for GPUs this machine does not have: GPT-2 XL and VGG16 (full width,
# 224 px, 3 channels, 1000 classes) on the cluster specs configs/clusters/4x-t4-pcie,
# 8x-t4-pcie and 8x-v100-nvlink. Analytic per-layer profiles (FLOPs and bytes with the
# device spec; no model is allocated). For each model x cluster:
#   pipefb_sweep over per-device budgets BUDGETS: which budgets fit for each schedule
#     family, the plan (shape, policies) and the predicted throughput -> sweep.csv
#   pipefb_plan at the devices' full memory: the chosen plan, in words -> plan.txt
#
#   experiments/analytic_gpu_planning.sh                    (after scripts/setup; ~1 minute)
#   BUDGETS=1GiB:16GiB:5 experiments/analytic_gpu_planning.sh
source "$(dirname "$0")/lib.sh"
BUDGETS=${BUDGETS:-1GiB:16GiB:5}
CLUSTERS=${CLUSTERS:-4x-t4-pcie 8x-t4-pcie 8x-v100-nvlink}
need pipefb_sweep pipefb_plan
start_results analytic_gpu_planning
CSV=$OUT/results.csv
echo "model,cluster,family,budget_gib,feasible,stages,microbatches,policies,iteration_s,samples_per_s,peak_gib" >"$CSV"
MIN=$OUT/smallest_budget.csv
echo "model,cluster,family,smallest_budget_gib" >"$MIN"
PLANS=$OUT/plans.csv
echo "model,cluster,plan_at_full_memory" >"$PLANS"

declare -A ARGS
ARGS[gpt2-xl]="--config $ROOT/configs/gpt2-xl.yaml"
ARGS[vgg16]="--config $ROOT/configs/vgg16-single.yaml --set model.width=1 --set model.input_size=224 --set model.channels=3 --set model.num_classes=1000 --set training.batch=128"

for model in gpt2-xl vgg16; do
  for cluster in $CLUSTERS; do
    dir=$OUT/$model-$cluster
    rm -rf "$dir"
    # shellcheck disable=SC2086
    mkdir -p "$dir"
    timed "$dir/sweep.log" "$BUILD/pipefb_sweep" ${ARGS[$model]} --cluster "$cluster" \
      --budgets "$BUDGETS" -o "$dir"
    # shellcheck disable=SC2086
    # Exit 2 = nothing fits at the full memory: a result here (plan.txt says the smallest budget).
    rc=0
    $NICE "$BUILD/pipefb_plan" ${ARGS[$model]} --cluster "$cluster" -o "$dir/plan.yaml" \
      >"$dir/plan.txt" 2>&1 || rc=$?
    [[ $rc == 0 || $rc == 2 ]] || { echo "pipefb_plan failed ($rc), see $dir/plan.txt" >&2; exit 1; }
    "$PY" - "$dir/sweep.csv" "$model" "$cluster" "$CSV" "$MIN" <<'PYEOF'
import csv, sys
path, model, cluster, out, mins = sys.argv[1:]
rows = list(csv.DictReader(open(path)))
gib = lambda b: "%.2f" % (float(b) / 2**30) if b not in ("", None, "-1") and float(b) >= 0 else ""
seen = {}
with open(out, "a") as f, open(mins, "a") as m:
    for r in rows:
        f.write(",".join([model, cluster, r["family"], gib(r["budget_bytes"]), r["feasible"],
                          r["stages"], r["microbatches"], r["policies"], r["iteration_time_s"],
                          r["throughput_samples_s"], gib(r["peak_bytes"])]) + "\n")
        seen.setdefault(r["family"], r["min_feasible_budget_bytes"])
    for fam, b in seen.items():
        m.write("%s,%s,%s,%s\n" % (model, cluster, fam, gib(b)))
PYEOF
    line=$(grep -m1 '^plan written to' "$dir/plan.txt" | sed 's/^plan written to [^:]*: //' || true)
    [[ -n $line ]] || line="nothing fits (exit $rc)"
    echo "$model,$cluster,\"$line\"" >>"$PLANS"
    echo "$model on $cluster: $line"
  done
done
column -s, -t "$MIN"
end_results
