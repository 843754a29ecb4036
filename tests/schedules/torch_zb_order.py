#!/usr/bin/env python3
"""interleaved-zb orders its compute as torch.distributed.pipelining's
ScheduleInterleavedZeroBubble does (Note [Interleaved zero bubble]), and zb-h1 as the same
schedule with one stage per rank.

  torch_zb_order.py PIPEFB_SIM

For each shape (devices D, stages per device v, microbatches M), every device's F, I and W
in pipefb_sim's lowered schedule must be torch's rank order, action by action. torch's
order comes from the schedule's per-rank generator, without processes or a process group.
"""
import subprocess
import sys

from torch.distributed.pipelining.schedules import ScheduleInterleavedZeroBubble as Zb

SHAPES = [(2, 2, 2), (2, 2, 4), (2, 2, 8), (3, 2, 6), (4, 2, 4), (4, 2, 8), (2, 3, 4), (4, 3, 8),
          (2, 1, 2), (2, 1, 4), (3, 1, 6), (4, 1, 8)]  # v = 1: zb-h1
KIND = {"FORWARD": "F", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}


def torch_order(D, v, M):
    z = Zb.__new__(Zb)  # the generator reads these fields only
    z.n_local_stages, z.pp_group_size, z._n_microbatches = v, D, M
    z.number_of_rounds = max(1, M // D)
    z.microbatches_per_round = M // z.number_of_rounds
    return [[(KIND[a.computation_type.name], a.stage_index, a.microbatch_index)
             for a in z._calculate_single_rank_operations(r) if a is not None]
            for r in range(D)]


def pipefb_order(sim, D, v, M):
    args = ["--schedule", "interleaved-zb", "--virtual-stages", str(v)] if v > 1 else \
        ["--schedule", "zb-h1"]
    text = subprocess.run([sim] + args + ["--stages", str(D * v), "--microbatches", str(M),
                                          "--print-schedule"],
                          capture_output=True, text=True, check=True).stdout
    out = []
    for line in text.splitlines():
        if not (line.startswith("device ") and ":" in line):
            continue
        acts = []
        for tok in line.split(":", 1)[1].split():
            if tok[0] in "FIW" and tok[1].isdigit():
                stage, mb = tok[1:].split(".")
                acts.append((tok[0], int(stage), int(mb)))
        out.append(acts)
    return out


def main():
    sim, bad = sys.argv[1], 0
    for D, v, M in SHAPES:
        want, got = torch_order(D, v, M), pipefb_order(sim, D, v, M)
        if len(want) != len(got) or any(len(w) != 3 * v * M for w in want):
            print(f"D={D} v={v} M={M}: {len(got)} devices against torch's {len(want)}")
            bad += 1
            continue
        for d, (w, g) in enumerate(zip(want, got)):
            if w != g:
                k = next((i for i, (a, b) in enumerate(zip(w, g)) if a != b), min(len(w), len(g)))
                print(f"D={D} v={v} M={M} device {d}: action {k} is "
                      f"{g[k] if k < len(g) else 'missing'}, torch's {w[k] if k < len(w) else 'none'}")
                bad += 1
    print(f"{len(SHAPES) - bad} of {len(SHAPES)} shapes in torch's order" if not bad else "")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
