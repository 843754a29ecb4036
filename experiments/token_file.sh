#!/usr/bin/env bash
# Issue 34, "the user's data": GPT-2 tiny (configs/gpt2-tiny.yaml: vocabulary 256, 64
# tokens) on token files in the layouts nanoGPT and llm.c write. A Markov chain over 256
# ids (the successor of a fixed permutation 3 times in 4, seed 0), written with numpy: the
# first 50,000 tokens as raw uint16 (nanoGPT's train.bin), the last 10,000 with llm.c's
# 1024-byte header (val.bin). pipefb_train trains 60 steps on one device and evaluates on
# val.bin; the loss starts near ln 256 = 5.55 and the chain's best is about 1.9 nats.
# -> train.bin, val.bin, the run folder, loss.txt (first and last step's loss, test loss).
#   experiments/token_file.sh          (after scripts/setup; ~10 s)
source "$(dirname "$0")/lib.sh"
need pipefb_train
start_results token_file
"$PY" - "$OUT" <<'PY'
import sys
import numpy as np
out = sys.argv[1]
rng = np.random.default_rng(0)
succ = rng.permutation(256)
t = np.empty(60000, dtype=np.uint16)
t[0] = 0
for i in range(1, len(t)):
    t[i] = succ[t[i - 1]] if rng.random() < 0.75 else rng.integers(256)
t[:50000].tofile(f"{out}/train.bin")
header = np.zeros(256, dtype=np.int32)
header[:3] = [20240520, 1, 10000]
with open(f"{out}/val.bin", "wb") as f:
    f.write(header.tobytes())
    f.write(t[50000:].tobytes())
PY
(cd "$OUT" && $NICE "$BUILD/pipefb_train" --config "$ROOT/configs/gpt2-tiny.yaml" \
  --set data.name=tokens --set data.path=train.bin --set data.test_path=val.bin \
  --set training.iterations=60 --set output.dir=run) | tee "$OUT/train.log"
{
  echo "first step loss: $(awk -F, 'NR == 2 {print $3}' "$OUT/run/metrics.csv")"
  echo "last step loss: $(awk -F, 'END {print $3}' "$OUT/run/metrics.csv")"
  grep -o 'test accuracy .*' "$OUT/train.log" | head -1
} | tee "$OUT/loss.txt"
rm -rf "$OUT/train.bin" "$OUT/val.bin" "$OUT/run/model.pt" "$OUT/run/trace.json" \
  "$OUT/run/report.html" "$OUT/run/charts" "$OUT/run/memory.json"
end_results
