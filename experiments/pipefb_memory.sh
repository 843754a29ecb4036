#!/usr/bin/env bash
# Issue 16 "Memory", planned: each schedule family's smallest feasible budget per device
# (pipefb_plan --budget 1MiB prints it and exits 2), with and without optimizer offload
# (--optimizer-offload none | per-stage), on equal device counts, microbatch 8 (batch 64
# in 8 microbatches). Analytic T4 profiles and the cluster specs; no model is allocated,
# nothing is timed, so the machine's load does not change the numbers.
#   ResNet50 224 px, GPT-2 small 1024 tokens, VGG16 224 px (fc6's floor).
# Families: 1f1b-keep, 1f1b-offload, 1f1b (any policy), gpipe (any), pipedream-offload,
# pipedream (any), and PipeFB: pipefb-sync-offload, pipefb-sync, pipefb-async (folded or
# 2S, any policy). ratios.csv also compares offload alone: pipefb-sync-offload against the
# better of 1f1b-offload and pipedream-offload (the thesis's comparison).
# Then, at the largest of those budgets (where every family fits), each family's fastest
# plan: iteration time from the cost model and from the event simulator.
# -> smallest_budget.csv (one row per model, cluster, optimizer placement, family),
#    ratios.csv (PipeFB's best against the best non-PipeFB family and against 1f1b-keep)
#    and common_budget.csv (samples/s of each family at the common budget).
#
#   experiments/pipefb_memory.sh                  (after scripts/setup; ~1 minute)
#   CLUSTERS=4x-t4-pcie experiments/pipefb_memory.sh
source "$(dirname "$0")/lib.sh"
CLUSTERS=${CLUSTERS:-4x-t4-pcie 8x-t4-pcie}
FAMILIES=${FAMILIES:-1f1b-keep 1f1b-offload 1f1b gpipe pipedream-offload pipedream pipefb-sync-offload pipefb-sync pipefb-async}
need pipefb_plan
start_results pipefb_memory
CSV=$OUT/smallest_budget.csv
echo "model,cluster,optimizer_offload,family,smallest_budget_bytes,plan" >"$CSV"

declare -A ARGS
ARGS[resnet50]="--config $ROOT/configs/resnet50.yaml --set model.width=1 --set model.input_size=224 --set model.channels=3 --set model.num_classes=1000"
ARGS[gpt2-small]="--config $ROOT/configs/gpt2-small.yaml --set model.input_size=1024 --set model.width=1"
ARGS[vgg16]="--config $ROOT/configs/vgg16.yaml --set model.width=1 --set model.input_size=224 --set model.channels=3 --set model.num_classes=1000"

for model in resnet50 gpt2-small vgg16; do
  for cluster in $CLUSTERS; do
    n=${cluster%%x-*}
    for opt in none per-stage; do
      for fam in $FAMILIES; do
        log=$OUT/logs/$model-$cluster-$opt-$fam.txt
        mkdir -p "$OUT/logs"
        rc=0
        # shellcheck disable=SC2086
        $NICE "$BUILD/pipefb_plan" ${ARGS[$model]} --set training.batch=64 \
          --set devices.count="$n" --set pipeline.schedule=1f1b --cluster "$cluster" \
          --microbatches 8 --budget 1MiB --optimizer-offload "$opt" --schedules "$fam" \
          --simulate-top 0 -o /dev/null >"$log" 2>&1 || rc=$?
        [[ $rc == 2 ]] || { echo "pipefb_plan: expected exit 2, got $rc (see $log)" >&2; exit 1; }
        bytes=$(sed -n 's/.*(--budget \(-\?[0-9]*\)).*/\1/p' "$log" | tail -1)
        plan=$(grep -m1 ' stages on ' "$log" | sed 's/: predicted.*//' || true)
        echo "$model,$cluster,$opt,$fam,$bytes,\"$plan\"" >>"$CSV"
      done
    done
  done
done

COMMON=$OUT/common_budget.csv
echo "model,cluster,optimizer_offload,family,budget_bytes,predicted_s,simulated_s,samples_per_s_predicted,samples_per_s_simulated,plan" >"$COMMON"
for model in resnet50 gpt2-small vgg16; do
  for cluster in $CLUSTERS; do
    n=${cluster%%x-*}
    for opt in none per-stage; do
      budget=$(awk -F, -v m="$model" -v c="$cluster" -v o="$opt" \
        '$1==m && $2==c && $3==o && $5>b {b=$5} END {print b}' "$CSV")
      for fam in $FAMILIES; do
        own=$(awk -F, -v m="$model" -v c="$cluster" -v o="$opt" -v f="$fam" \
          '$1==m && $2==c && $3==o && $4==f {print $5}' "$CSV")
        if ((own < 0)); then  # fits nowhere within the devices' capacity
          echo "$model,$cluster,$opt,$fam,$budget,,,,,\"none fits the capacity\"" >>"$COMMON"
          continue
        fi
        log=$OUT/logs/$model-$cluster-$opt-$fam-common.txt
        # shellcheck disable=SC2086
        $NICE "$BUILD/pipefb_plan" ${ARGS[$model]} --set training.batch=64 \
          --set devices.count="$n" --set pipeline.schedule=1f1b --cluster "$cluster" \
          --microbatches 8 --budget "$budget" --optimizer-offload "$opt" --schedules "$fam" \
          -o /dev/null >"$log" 2>&1 || { echo "pipefb_plan failed (see $log)" >&2; exit 1; }
        "$PY" - "$log" "$model" "$cluster" "$opt" "$fam" "$budget" >>"$COMMON" <<'PYEOF'
import re, sys
log, model, cluster, opt, fam, budget = sys.argv[1:]
text = open(log).read()
# (A plan the simulator does not run has no "simulated" figure: its columns stay empty.)
line = re.search(r"^(.* stages on .*?): predicted iteration ([0-9.]+) (ms|s|us), [^;\n]*(?:; simulated ([0-9.]+) (ms|s|us))?", text, re.M)
sec = lambda v, u: float(v) * {"s": 1, "ms": 1e-3, "us": 1e-6}[u]
p = sec(line.group(2), line.group(3))
if line.group(4):
    s = sec(line.group(4), line.group(5))
    sim = "%.6f" % s, "%.2f" % (64 / s)
else:
    sim = "", ""
print('%s,%s,%s,%s,%s,%.6f,%s,%.2f,%s,"%s"' % (model, cluster, opt, fam, budget, p, sim[0], 64 / p, sim[1], line.group(1)))
PYEOF
        rm -f "$log"  # its numbers and plan are in the CSV row
      done
    done
  done
done

"$PY" - "$CSV" "$OUT/ratios.csv" <<'PYEOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
by = {}
for r in rows:
    b = int(r["smallest_budget_bytes"])
    by.setdefault((r["model"], r["cluster"], r["optimizer_offload"]), {})[r["family"]] = b
mib = lambda b: "%.2f" % (b / 2**20)
with open(sys.argv[2], "w") as f:
    f.write("model,cluster,optimizer_offload,pipefb_best,pipefb_best_mib,other_best,"
            "other_best_mib,ratio_vs_other_best,keep_mib,ratio_vs_1f1b_keep,"
            "offload_only_ratio\n")
    for (model, cluster, opt), fams in by.items():
        ok = {k: v for k, v in fams.items() if v >= 0}
        pf = {k: v for k, v in ok.items() if k.startswith("pipefb")}
        ot = {k: v for k, v in ok.items() if not k.startswith("pipefb")}
        if not pf or not ot or "1f1b-keep" not in ok:
            continue
        p = min(pf, key=pf.get)
        o = min(ot, key=ot.get)
        k = ok["1f1b-keep"]
        offl = [ok[x] for x in ("1f1b-offload", "pipedream-offload") if x in ok]
        oo = ok["pipefb-sync-offload"] / min(offl) if offl and "pipefb-sync-offload" in ok else -1
        f.write("%s,%s,%s,%s,%s,%s,%s,%.3f,%s,%.3f,%.3f\n" % (model, cluster, opt, p, mib(pf[p]),
                o, mib(ot[o]), pf[p] / ot[o], mib(k), pf[p] / k, oo))
        print("%-10s %-10s opt %-9s PipeFB %-12s %10s MiB | best other %-17s %10s MiB | %.3fx"
              " | 1f1b-keep %10s MiB %.3fx" % (model, cluster, opt, p, mib(pf[p]), o,
                                                mib(ot[o]), pf[p] / ot[o], mib(k), pf[p] / k))
PYEOF
end_results
