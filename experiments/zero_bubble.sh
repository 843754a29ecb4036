#!/usr/bin/env bash
# Issue 18: the split-backward schedules (zb-h1, zb-h2, zbv, interleaved-1f1b, pipefb-zb)
# against 1f1b and pipefb-sync, in the simulator (uniform costs F = I = W = 1 ms, B = 2 ms;
# zbv and interleaved-1f1b cut the same model into 2S stages of half the cost and stash).
# Deterministic: simulator outputs, no timing.
#   S=4 M=8, one flushed iteration (K=1) and 4 iterations (K=4, steady-state iteration time).
#   -> sim.csv: schedule, stages, devices, iterations, iteration_ms, bubble, peak stash MiB
#      (the largest device's), peak stash MiB per device
#
# Planner (Note [Zero-bubble fill]): pipefb_plan for GPT-2 XL (configs/gpt2-xl.yaml, batch 8)
# on the T4 cluster specs at their full memory, one family at a time -> plans.csv: predicted
# and simulated iteration time, and the speedup over the best 1f1b plan.
#
#   experiments/zero_bubble.sh          (after scripts/setup; under a minute)
source "$(dirname "$0")/lib.sh"
need pipefb_sim pipefb_plan
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
echo "cluster,family,stages,microbatches,predicted_ms,simulated_ms,speedup_vs_1f1b_predicted,speedup_vs_1f1b_simulated" >"$PLANS"
for cluster in 4x-t4-pcie 8x-t4-pcie; do
  for fam in 1f1b zb-h1 zb-h2; do
    d=$OUT/plan-$cluster-$fam
    mkdir -p "$d"
    "$BUILD/pipefb_plan" --config "$ROOT/configs/gpt2-xl.yaml" --cluster "$cluster" \
      --schedules "$fam" -o "$d/plan.yaml" >"$d/plan.txt" 2>&1
  done
  "$PY" - "$OUT" "$cluster" "$PLANS" <<'PYEOF'
import re, sys
out, cluster, csv = sys.argv[1:]
def read(fam):
    t = open("%s/plan-%s-%s/plan.txt" % (out, cluster, fam)).read()
    m = re.search(r"(\d+) stages on \d+ devices, (\d+) microbatches.*predicted iteration "
                  r"([\d.]+) (m?s).*simulated ([\d.]+) (m?s)", t)
    ms = lambda v, u: float(v) * (1 if u == "ms" else 1000)
    return m.group(1), m.group(2), ms(m.group(3), m.group(4)), ms(m.group(5), m.group(6))
base = read("1f1b")
with open(csv, "a") as f:
    for fam in ["1f1b", "zb-h1", "zb-h2"]:
        S, M, p, s = read(fam)
        f.write("%s,%s,%s,%s,%.2f,%.2f,%.2f,%.2f\n" % (cluster, fam, S, M, p, s, base[2] / p, base[3] / s))
PYEOF
done
column -s, -t "$PLANS"
end_results
