#!/usr/bin/env bash
# Issue 18: the split-backward schedules (zb-h1, zb-h2, zbv, interleaved-1f1b, pipefb-zb)
# against 1f1b and pipefb-sync, in the simulator (uniform costs F = I = W = 1 ms, B = 2 ms;
# zbv and interleaved-1f1b cut the same model into 2S stages of half the cost and stash).
# Deterministic: simulator outputs, no timing.
#   S=4 M=8, one flushed iteration (K=1) and 4 iterations (K=4, steady-state iteration time).
#   -> sim.csv: schedule, stages, devices, iterations, iteration_ms, bubble, peak stash MiB
#      (the largest device's), peak stash MiB per device
#
# Planner (Note [Zero-bubble fill], Note [Simulated fill], Note [Shared devices]):
# pipefb_plan for GPT-2 XL (configs/gpt2-xl.yaml, batch 8) on the T4 cluster specs at their
# full memory, one family at a time -> plans.csv: stages, devices, microbatches, predicted
# and simulated iteration time, and the speedup over the best 1f1b plan.
#
# Virtual devices (VIRTUAL=1, a few minutes): VGG16 width 1/4 at 32 px, batch 32, M = 8, on
# 4 virtual CPU devices, profiled once (pipefb_profile); per family the budget B is 1.05 x
# the smallest that fits (pipefb_plan --budget 1KiB says it), pipefb_plan --budget B plans
# and pipefb_train --plan runs it for 3 iterations under devices.memory=B -> virtual.csv:
# per device the predicted and measured peak, and the measured samples/s.
#
#   experiments/zero_bubble.sh          (after scripts/setup; about a minute)
source "$(dirname "$0")/lib.sh"
need pipefb_sim pipefb_plan
FAMILIES="1f1b zb-h1 zb-h2 zbv interleaved-1f1b pipefb-zb"
start_results zero_bubble
CSV=$OUT/sim.csv
echo "schedule,stages,devices,iterations,iteration_ms,bubble,peak_stash_mib,peak_stash_mib_per_device" >"$CSV"
HALF=$OUT/half_stage_costs.json
cat >"$HALF" <<'EOF'
{ "stage": { "forward": "0.5ms", "backward": "1ms", "recompute": "0.5ms", "stash_bytes": "2MiB" } }
EOF

sim() {  # sim KIND STAGES K [extra pipefb_sim args...]
  local kind=$1 stages=$2 k=$3; shift 3
  local j=$OUT/$kind-S$stages-K$k.json
  "$BUILD/pipefb_sim" --schedule "$kind" --stages "$stages" --microbatches 8 --iterations "$k" \
    --json --no-actions --no-memory-timeline "$@" >"$j"
  "$PY" - "$j" "$CSV" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))
mib = [d["peak_stash_bytes"] / 2**20 for d in j["per_device"]]
row = [j["schedule"], j["stages"], j["devices"], j["iterations"],
       "%.3f" % (1e3 * j["iteration_time"]), "%.4f" % j["bubble_fraction"],
       "%.1f" % max(mib), " ".join("%.0f" % m for m in mib)]
open(sys.argv[2], "a").write(",".join(map(str, row)) + "\n")
PYEOF
}

for k in 1 4; do
  sim 1f1b 4 "$k"
  sim zb-h1 4 "$k"
  sim zb-h2 4 "$k"
  sim zbv 8 "$k" --costs "$HALF"
  sim interleaved-1f1b 8 "$k" --costs "$HALF" --virtual-stages 2
  sim pipefb-sync 4 "$k"
  sim pipefb-zb 4 "$k"
done
column -s, -t "$CSV"

PLANS=$OUT/plans.csv
echo "cluster,family,stages,devices,microbatches,predicted_ms,simulated_ms,speedup_vs_1f1b_predicted,speedup_vs_1f1b_simulated" >"$PLANS"
for cluster in 4x-t4-pcie 8x-t4-pcie; do
  for fam in $FAMILIES; do
    d=$OUT/plan-$cluster-$fam
    mkdir -p "$d"
    # (exit 2 when no plan of the family fits: a row of "none")
    "$BUILD/pipefb_plan" --config "$ROOT/configs/gpt2-xl.yaml" --cluster "$cluster" \
      --schedules "$fam" -o "$d/plan.yaml" >"$d/plan.txt" 2>&1 || true
  done
  "$PY" - "$OUT" "$cluster" "$PLANS" $FAMILIES <<'PYEOF'
import re, sys
out, cluster, csv = sys.argv[1:4]
def read(fam):
    t = open("%s/plan-%s-%s/plan.txt" % (out, cluster, fam)).read()
    m = re.search(r"(\d+) stages on (\d+) devices.*?, (\d+) microbatches.*predicted iteration "
                  r"([\d.]+) (m?s).*simulated ([\d.]+) (m?s)", t)
    if "plan written" not in t or not m:
        return None
    ms = lambda v, u: float(v) * (1 if u == "ms" else 1000)
    return m.group(1), m.group(2), m.group(3), ms(m.group(4), m.group(5)), ms(m.group(6), m.group(7))
base = read("1f1b")
with open(csv, "a") as f:
    for fam in sys.argv[4:]:
        r = read(fam)
        if r is None:
            f.write("%s,%s,none,none,none,none,none,none,none\n" % (cluster, fam))
            continue
        S, D, M, p, s = r
        f.write("%s,%s,%s,%s,%s,%.2f,%.2f,%.2f,%.2f\n" % (cluster, fam, S, D, M, p, s, base[3] / p, base[4] / s))
PYEOF
done
column -s, -t "$PLANS"

if [[ ${VIRTUAL:-0} == 1 ]]; then
  need pipefb_profile pipefb_train
  VCSV=$OUT/virtual.csv
  echo "family,stages,budget_bytes,device,predicted_bytes,measured_bytes,error,samples_per_s" >"$VCSV"
  SETS="--config $ROOT/configs/vgg16-single.yaml --set model.width=0.25 --set model.input_size=32
    --set training.batch=32 --set pipeline.microbatches=8 --set data.name=synthetic
    --set data.synthetic_train=64 --set data.synthetic_test=32"
  PROF=$OUT/vgg16-w025-mb4.profile.yaml
  # shellcheck disable=SC2086
  [[ -f $PROF ]] || $NICE "$BUILD/pipefb_profile" $SETS --set devices.count=4 --repeats 3 --warmup 1 --out "$PROF" \
    >"$OUT/profile.log" 2>&1
  for fam in 1f1b-keep zb-h1-keep zb-h2-keep zbv-keep interleaved-1f1b-keep pipefb-zb-keep; do
    d=$OUT/virtual-$fam
    mkdir -p "$d"
    # shellcheck disable=SC2086
    "$BUILD/pipefb_plan" $SETS --set devices.count=4 --profile "$PROF" --schedules "$fam" \
      --microbatches 8 --budget 1KiB >"$d/smallest.txt" 2>&1 || true
    B=$("$PY" -c "import re,sys; print(int(1.05*int(re.search(r'--budget ([0-9]+)\)', open(sys.argv[1]).read()).group(1))))" "$d/smallest.txt")
    # shellcheck disable=SC2086
    "$BUILD/pipefb_plan" $SETS --set devices.count=4 --profile "$PROF" --schedules "$fam" \
      --microbatches 8 --budget "$B" -o "$d/plan.yaml" >"$d/plan.txt" 2>&1
    DEV=$("$PY" -c "import yaml,sys; print([o.split('=')[1] for o in yaml.safe_load(open(sys.argv[1]))['overrides'] if o.startswith('devices.count=')][0])" "$d/plan.yaml")
    # shellcheck disable=SC2086
    $NICE "$BUILD/pipefb_train" $SETS --set pipeline.schedule="${fam%-keep}" \
      --set devices.count="$DEV" --plan "$d/plan.yaml" \
      --set devices.memory="$B" --set training.iterations=3 --set training.eval=false \
      --set training.checkpoint=false --set output.dir="$d/run" >"$d/train.log" 2>&1
    "$PY" - "$d" "$fam" "$B" "$VCSV" <<'PYEOF'
import json, sys, yaml
d, fam, B, csv = sys.argv[1:]
plan = yaml.safe_load(open(d + "/plan.yaml"))
pred = plan["predicted"]["peak_memory"]
s = json.load(open(d + "/run/summary.json"))
it = "%.1f" % s["throughput_samples_per_s"]
with open(csv, "a") as f:
    for dev in s["devices"]:
        if not dev["name"].startswith("cpu:"):
            continue
        i = int(dev["name"][4:])
        p, m = pred[i], dev["peak_bytes"]
        f.write("%s,%d,%s,%s,%d,%d,%+.3f,%s\n" % (fam, len(plan["stages"]), B, dev["name"], p, m,
                                               (m - p) / p if p else 0, it))
PYEOF
  done
  column -s, -t "$VCSV"
fi
end_results
