#!/usr/bin/env python3
"""Issue 35: pipefb side by side with torch.distributed.pipelining, on the same work.

  build/pipefb-python experiments/peer_pipelining/driver.py
      [--models gpt2-tiny,vgg16-quarter,resnet50-eighth]
      [--schedules gpipe,1f1b] [--rounds 5] [--steps 8]

For each model (models.py) and schedule, both sides train the same module from the same
weights: torch's pipelining runs one process per stage on gloo (localhost); pipefb runs
the module as TorchScript (its own-model path), in-process on virtual devices
(pipefb-virtual) and one process per device under pipefb_launch (pipefb-launch). Same
batch, microbatches, stages, split point, optimizer (SGD) and one intra-op thread per
stage on every side.
  * gradients: the model in float64, one step; each side's gradients against one device's
    float64 autograd (largest difference over the largest gradient, per tensor). pipefb's
    are (w0 - w1) / lr from its model.pt after one SGD step without momentum.
  * speed: float32, `steps` steps, samples/s after the first 2; the sides alternated over
    `rounds` rounds (median, min, max).
-> experiments/results/peer_pipelining/summary.csv and raw/*.txt
"""
import argparse
import csv
import gc
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD = os.environ.get("BUILD", os.path.join(ROOT, "build"))
sys.path.insert(0, HERE)
import models  # noqa: E402

# schedule: (torch's class, torch's stages, their placement on the 2 ranks, pipefb's
# schedule, pipefb's stages). "one": stage r on rank r; "loop": r and r + 2; "v": r and
# 3 - r. torch's zero-bubble schedule for one stage per rank is its interleaved one with a
# single stage on each rank: its order is then ZB-H1's (pipefb's zb-h1); with two stages a
# rank it is ZB1P over two chunks (pipefb's interleaved-zb, in the same order).
SCHEDULES = {
    "gpipe": ("ScheduleGPipe", 2, "one", "gpipe", 2),
    "1f1b": ("Schedule1F1B", 2, "one", "1f1b", 2),
    "interleaved-1f1b": ("ScheduleInterleaved1F1B", 4, "loop", "interleaved-1f1b", 4),
    "zb-h1": ("ScheduleInterleavedZeroBubble", 2, "one", "zb-h1", 2),
    "interleaved-zb": ("ScheduleInterleavedZeroBubble", 4, "loop", "interleaved-zb", 4),
    "zbv": ("ScheduleZBVZeroBubble", 4, "v", "zbv", 4),
    # Not a default pair: pipefb has no DualPipeV; its nearest is zbv (the same V placement).
    "dualpipev": ("ScheduleDualPipeV", 4, "v", "zbv", 4),
}
STAGES, MICROBATCHES, BATCH, LR, WARMUP = 2, 4, 16, 0.05, 2  # STAGES: ranks, devices


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cuts(name, stages):
    """Even cuts of the model's children into `stages` (the same on both sides)."""
    n = len(list(models.MODELS[name][0]().children()))
    return [n * i // stages for i in range(1, stages)]


def rank_stages(schedule, rank):
    _, total, placement, _, _ = SCHEDULES[schedule]
    return {"one": [rank], "loop": [rank, rank + STAGES], "v": [rank, 2 * STAGES - 1 - rank]}[
        placement]


# ---- torch.distributed.pipelining: one process per stage --------------------------------
def torch_worker(rank, name, schedule, double, steps, port, out, memory=False, timing=False):
    """double: one float64 step, gradients saved. memory: the steps under torch.profiler's
    memory events, the peak of live tensor bytes saved (the rank's weights, and what is
    allocated after them). Otherwise float32 `steps` steps, timed."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=STAGES)
    torch.set_num_threads(1)
    from torch.distributed import pipelining


    full = models.MODELS[name][0]()
    if double:
        full = full.double()
    children = list(full.named_children())
    cls, total, _, _, _ = SCHEDULES[schedule]
    bounds = [0] + cuts(name, total) + [len(children)]
    mine = rank_stages(schedule, rank)
    stage_mod = nn.Sequential()  # this rank's children, under their own names
    stages = []
    for s in mine:
        sub = nn.Sequential()
        for n, m in children[bounds[s]:bounds[s + 1]]:
            sub.add_module(n, m)
            stage_mod.add_module(n, m)
        stages.append(pipelining.PipelineStage(sub, s, total, torch.device("cpu")))
    multi = issubclass(getattr(pipelining, cls), pipelining.schedules.PipelineScheduleMulti)
    sched = getattr(pipelining, cls)(stages if multi else stages[0],
                                     n_microbatches=MICROBATCHES, loss_fn=models.loss_fn)
    opt = torch.optim.SGD(stage_mod.parameters(), lr=LR)
    first, last = 0 in mine, total - 1 in mine
    # Every rank built the whole model: the other ranks' layers go before anything is
    # counted. The memory run counts from here: this rank's weights, then every allocation
    # (gradients, receive buffers, activations) as torch.profiler's memory events see it.
    del full, children
    gc.collect()
    base = sum(t.nbytes for t in stage_mod.state_dict().values())
    held = {"now": 0, "max": 0}  # zero-bubble: intermediate gradients kept from I to W
    calls = []  # timing: (kind, seconds) of each forward, B, I and W
    if timing:
        time_compute(calls)
    if memory:
        count_held_gradients(held)
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                      profile_memory=True)
        prof.__enter__()
    times, peak = [], None
    n = 1 if double else steps
    for step in range(n):
        x, y = models.batch(name, BATCH, 100 + step)
        if double and x.is_floating_point():
            x = x.double()
        dist.barrier()
        t0 = time.perf_counter()
        # The memory run zeroes .grad in place, as pipefb keeps it (the same bytes on both
        # sides); torch's default frees it, and backward allocates it again: GPT-2 tiny
        # gpipe's first device peaked at 12.28 MB so, 13.24 MB in place (pipefb: 13.88).
        opt.zero_grad(set_to_none=not memory)
        args = (x,) if first else ()
        # return_outputs=False: the last stage does not keep every microbatch's output to
        # merge them (pipefb keeps none either).
        if last:
            sched.step(*args, target=y, losses=[], return_outputs=False)
        else:
            sched.step(*args, return_outputs=False)
        if not double:
            opt.step()
        dist.barrier()
        times.append(time.perf_counter() - t0)
    if memory:
        prof.__exit__(None, None, None)
        trace = os.path.join(out, f"trace-{rank}.json")
        prof.export_chrome_trace(trace)
        events = json.load(open(trace))["traceEvents"]
        peak = base + max(e["args"].get("Total Allocated", 0) for e in events
                          if e.get("name") == "[memory]")
        os.remove(trace)
        # What the stages hold for receiving: a buffer per microbatch for every activation
        # and gradient a stage receives (stage.py allocates them at its first step and keeps
        # them), counted tensor by tensor.
        recv = sum(i.buffer.nbytes for st in stages
                   for infos in list(st.args_recv_info.values()) + list(st.grad_recv_info.values())
                   for i in infos if isinstance(getattr(i, "buffer", None), torch.Tensor))
        with open(os.path.join(out, f"recv-{rank}.json"), "w") as f:
            json.dump({"recv_buffer_bytes": recv, "held_intermediate_grad_bytes": held["max"]},
                      f)
    if timing:
        with open(os.path.join(out, f"timing-{rank}.json"), "w") as f:
            json.dump(calls, f)
    if double:
        torch.save({n: p.grad for n, p in stage_mod.named_parameters()},
                   os.path.join(out, f"grads-{rank}.pt"))
    else:
        with open(os.path.join(out, f"speed-{rank}.json"), "w") as f:
            json.dump({"samples_per_s": BATCH * len(times[WARMUP:]) / sum(times[WARMUP:]),
                       "peak": peak}, f)
    dist.destroy_process_group()


def count_held_gradients(held):
    """torch's split backward (stage_backward_input) keeps, from I to W, the gradient flowing
    into each autograd node that leads to a weight (param_groups' "grads"), besides the
    retained graph. Counts their bytes as I stores them and W consumes them: held["max"]
    is the most a rank held at once."""
    from torch.distributed.pipelining import stage as st

    def nbytes(groups):
        return sum(t.nbytes for g in groups for grads in (g.get("grads") or [])
                   for t in (grads or ()) if isinstance(t, torch.Tensor))

    orig_i, orig_w = st.stage_backward_input, st.stage_backward_weight

    def backward_input(*args, **kwargs):
        dinputs, groups = orig_i(*args, **kwargs)
        held["now"] += nbytes(groups)
        held["max"] = max(held["max"], held["now"])
        return dinputs, groups

    def backward_weight(weights, groups, *args, **kwargs):
        held["now"] -= nbytes(groups)
        return orig_w(weights, groups, *args, **kwargs)

    st.stage_backward_input, st.stage_backward_weight = backward_input, backward_weight


def time_compute(calls):
    """Wraps the stage's forward and torch's backward functions (full, input, weight: the
    same calls its schedules make) with a clock: calls gets (kind, seconds) for each."""
    from torch.distributed.pipelining import stage as st

    def timed(kind, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            r = fn(*args, **kwargs)
            calls.append((kind, time.perf_counter() - t0))
            return r
        return wrapper

    st.stage_backward = timed("B", st.stage_backward)
    st.stage_backward_input = timed("I", st.stage_backward_input)
    st.stage_backward_weight = timed("W", st.stage_backward_weight)
    base = st._PipelineStageBase
    base.forward_one_chunk = timed("F", base.forward_one_chunk)


def run_torch(name, schedule, double, steps, out, memory=False, timing=False):
    mp.spawn(torch_worker, args=(name, schedule, double, steps, free_port(), out, memory, timing),
             nprocs=STAGES, join=True)
    if double:
        grads = {}
        for r in range(STAGES):
            grads.update(torch.load(os.path.join(out, f"grads-{r}.pt")))
        return grads
    r = [json.load(open(os.path.join(out, f"speed-{k}.json"))) for k in range(STAGES)]
    return r[0]["samples_per_s"], [x["peak"] for x in r]


# ---- pipefb: the same module as TorchScript ----------------------------------------------
def pipefb_files(name, double, steps, work):
    """The TorchScript file, the tensors file of `steps` batches and the initial weights."""
    build, shape, dtype, classes = models.MODELS[name]
    m = build()
    if double:
        m = m.double()
    path = os.path.join(work, f"{name}-{'f64' if double else 'f32'}.pt")
    torch.jit.save(torch.jit.script(m), path)
    xs, ys = zip(*(models.batch(name, BATCH, 100 + s) for s in range(1 if double else steps)))
    data = os.path.join(work, f"{name}-data-{'f64' if double else 'f32'}.pt")
    x = torch.cat(xs)
    torch.save({"x": x.double() if double and x.is_floating_point() else x, "y": torch.cat(ys)},
               data)
    return path, data, {k: v.detach().clone() for k, v in m.state_dict().items()}


def run_pipefb(name, schedule, side, double, steps, work, out, trace=False):
    path, data, w0 = pipefb_files(name, double, steps, work)
    _, shape, dtype, classes = models.MODELS[name]
    input_dtype = "int64" if dtype == torch.long else ("float64" if double else "float32")
    run = os.path.join(out, "run")
    config = os.path.join(out, "config.yaml")
    _, _, _, pschedule, pstages = SCHEDULES[schedule]
    virtual = ", virtual_stages: 2" if pschedule.startswith("interleaved") else ""
    with open(config, "w") as f:
        f.write(f"""model: {{name: torchscript, path: {path}, sample_shape: {shape},
  input_dtype: {input_dtype}, num_classes: {classes}}}
data: {{name: tensors, path: {data}, shuffle: false}}
training: {{batch: {BATCH}, iterations: {1 if double else steps}, optimizer: sgd, lr: {LR},
  momentum: 0, eval: false, checkpoint: {'true' if double else 'false'}, threads: 1}}
devices: {{count: {STAGES}}}
pipeline: {{schedule: {pschedule}, stages: {pstages}, microbatches: {MICROBATCHES}, stash: keep,
  partition: {cuts(name, pstages)}{virtual}}}
output: {{dir: {run}{f", trace_steps: [{WARMUP}, {steps - WARMUP}]" if trace else ""}}}
""")
    cmd = [os.path.join(BUILD, "pipefb_train"), "--config", config]
    if side == "pipefb-launch":
        cmd = [os.path.join(BUILD, "pipefb_launch"), "-n", str(STAGES), "--"] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True)
    with open(os.path.join(out, "log.txt"), "w") as f:
        f.write(r.stdout + r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"{side} {name} {schedule} failed: see {out}/log.txt")
    if double:
        # Under pipefb_launch each rank's model.pt holds its own stages (docs/distributed.md).
        w1 = {}
        for f in ([os.path.join(run, f"rank{r}", "model.pt") for r in range(STAGES)]
                  if side == "pipefb-launch" else [os.path.join(run, "model.pt")]):
            w1.update(torch.load(f))
        return {k: (w0[k] - w1[k].double()) / LR for k in w1 if w0[k].is_floating_point()
                and k in dict(models.MODELS[name][0]().named_parameters())}
    # Under pipefb_launch every rank writes run/rank<r>: rank 0's steps end when the
    # pipeline's do (its last B is the iteration's last action).
    metrics = os.path.join(run, "rank0" if side == "pipefb-launch" else "", "metrics.csv")
    rows = list(csv.reader(open(metrics)))
    elapsed = [float(r[5]) for r in rows[1:]]  # cumulative seconds per step
    speed = BATCH * (len(elapsed) - WARMUP) / (elapsed[-1] - elapsed[WARMUP - 1])
    # Each device's peak of tracked (live tensor) bytes.
    if side == "pipefb-launch":
        peaks = [json.load(open(os.path.join(run, f"rank{r}", "memory.json")))["devices"][r]
                 ["peak_bytes"] for r in range(STAGES)]
    else:
        peaks = [d["peak_bytes"] for d in json.load(open(os.path.join(run, "memory.json")))
                 ["devices"] if d["name"].startswith("cpu")]
    return speed, peaks


def beyond(name, torch_peak, rounds, steps, work, out_dir):
    """Goal 3: half of torch 1F1B's largest stage peak as every device's budget on the same
    2 devices; pipefb's planner (any family, on the measured profile) and the plan run,
    alternated round by round with torch's unconstrained 1F1B. -> (budget, pipefb's
    samples/s per round, its device peaks, torch's samples/s per round)"""
    budget = torch_peak // 2
    path, data, _ = pipefb_files(name, False, steps, work)
    _, shape, dtype, classes = models.MODELS[name]
    config = os.path.join(work, "beyond.yaml")
    with open(config, "w") as f:
        f.write(f"""model: {{name: torchscript, path: {path}, sample_shape: {shape},
  input_dtype: {'int64' if dtype == torch.long else 'float32'}, num_classes: {classes}}}
data: {{name: tensors, path: {data}, shuffle: false}}
training: {{batch: {BATCH}, iterations: {steps}, optimizer: sgd, lr: {LR}, momentum: 0,
  eval: false, checkpoint: false, threads: 1}}
devices: {{count: {STAGES}}}
pipeline: {{schedule: pipefb-sync, microbatches: {MICROBATCHES}}}
""")
    prof, plan = os.path.join(work, "beyond-profile.yaml"), os.path.join(out_dir, "beyond-plan.yaml")
    for cmd in (["pipefb_profile", "--config", config, "-o", prof],
                ["pipefb_plan", "--config", config, "--profile", prof, "--budget", str(budget),
                 "-o", plan]):
        r = subprocess.run([os.path.join(BUILD, cmd[0])] + cmd[1:], capture_output=True, text=True)
        with open(os.path.join(out_dir, "raw", f"beyond-{cmd[0]}.txt"), "w") as f:
            f.write(r.stdout + r.stderr)
        if r.returncode != 0:
            return budget, None, None, None
    speeds, peaks, torch_speeds = [], None, []
    for _ in range(rounds):
        torch_speeds.append(run_torch(name, "1f1b", False, steps, tempfile.mkdtemp(dir=work))[0])
        run = tempfile.mkdtemp(dir=work)
        r = subprocess.run([os.path.join(BUILD, "pipefb_train"), "--config", config, "--plan", plan,
                            "--set", f"devices.memory={budget}", "--set", f"output.dir={run}"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            with open(os.path.join(out_dir, "raw", "beyond-train.txt"), "w") as f:
                f.write(r.stdout + r.stderr)
            return budget, None, None, None
        rows = list(csv.reader(open(os.path.join(run, "metrics.csv"))))
        elapsed = [float(x[5]) for x in rows[1:]]
        speeds.append(BATCH * (len(elapsed) - WARMUP) / (elapsed[-1] - elapsed[WARMUP - 1]))
        peaks = [d["peak_bytes"] for d in json.load(open(os.path.join(run, "memory.json")))
                 ["devices"] if d["name"].startswith("cpu")]
    return budget, speeds, peaks, torch_speeds


def write_beyond(name, torch_peak, a, work):
    """raw/beyond.txt: the plan at half torch 1F1B's largest stage peak against torch's 1F1B."""
    budget, bs, bp, ts = beyond(name, torch_peak, a.rounds, a.steps, work, a.out)
    with open(os.path.join(a.out, "raw", "beyond.txt"), "w") as f:
        f.write(f"torch 1F1B largest stage peak {torch_peak} bytes; budget {budget} bytes a device\n")
        if bs is None:
            f.write("pipefb: no plan ran at that budget (raw/beyond-*.txt)\n")
        else:
            f.write(f"pipefb's plan: samples/s per round {bs}, median "
                    f"{statistics.median(bs):.2f}; device peaks {bp}\n"
                    f"torch 1F1B unconstrained, alternated with it: samples/s per round {ts}, "
                    f"median {statistics.median(ts):.2f}: ratio "
                    f"{statistics.median(bs) / statistics.median(ts):.3f}\n")
    print(open(os.path.join(a.out, "raw", "beyond.txt")).read(), flush=True)


def reference(name):
    """One device, float64: the mean loss over the batch, summed over microbatches."""
    m = models.MODELS[name][0]().double()
    x, y = models.batch(name, BATCH, 100)
    if x.is_floating_point():
        x = x.double()
    for xm, ym in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES)):
        (models.loss_fn(m(xm), ym) / MICROBATCHES).backward()
    return {n: p.grad for n, p in m.named_parameters()}


def rel_err(got, want):
    worst, where = 0.0, ""
    for k, w in want.items():
        if k not in got:
            return float("inf"), f"{k} missing"
        e = ((got[k].double() - w).abs().max() / w.abs().max().clamp_min(1e-300)).item()
        if e > worst:
            worst, where = e, k
    return worst, where


def write_summary(out, rows):
    with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def update_summary(a, update):
    """Runs update(row, work folder) on every row of an existing summary.csv, and writes it
    back (the --*-only passes: the other columns stay)."""
    rows = list(csv.DictReader(open(os.path.join(a.out, "summary.csv"))))
    work = tempfile.mkdtemp()
    try:
        for r in rows:
            update(r, work)
    finally:
        shutil.rmtree(work)
    write_summary(a.out, rows)


def grads_only(a):
    refs = {}

    def update(r, work):
        if r["grad_rel_err"] == "failed":
            return
        name, schedule, side = r["model"], r["schedule"], r["side"]
        if name not in refs:
            refs[name] = reference(name)
        out = tempfile.mkdtemp(dir=work)
        g = run_torch(name, schedule, True, 1, out) if side == "torch" else \
            run_pipefb(name, schedule, side, True, 1, work, out)
        e, where = rel_err(g, refs[name])
        r["grad_rel_err"] = f"{e:.3g}"
        print(f"{name} {schedule} {side}: largest relative gradient error {e:.3g} ({where})",
              flush=True)

    update_summary(a, update)


def torch_memory(name, schedule, work):
    """torch's device peaks from a run of their own under the profiler, and the lines that
    say what its stages hold beyond pipefb (raw/*-torch.txt)."""
    out = tempfile.mkdtemp(dir=work)
    _, peaks = run_torch(name, schedule, False, WARMUP + 2, out, memory=True)
    extra = [json.load(open(os.path.join(out, f"recv-{k}.json"))) for k in range(STAGES)]
    return peaks, [f"receive buffers held per device: "
                   f"{[x['recv_buffer_bytes'] for x in extra]}",
                   f"intermediate gradients held from I to W per device (most at once): "
                   f"{[x['held_intermediate_grad_bytes'] for x in extra]}"]


def torch_memory_only(a):
    def update(r, work):
        if r["side"] != "torch" or r["grad_rel_err"] == "failed":
            return
        peaks, held = torch_memory(r["model"], r["schedule"], work)
        r["peak_stage_bytes"] = max(peaks)
        raw = os.path.join(a.out, "raw", f"{r['model']}-{r['schedule']}-torch.txt")
        lines = [x for x in open(raw).read().splitlines()
                 if not x.startswith(("peak", "receive buffers", "intermediate gradients"))]
        with open(raw, "w") as f:
            f.write("\n".join(lines + [f"peak live tensor bytes per device: {peaks}"] + held) +
                    "\n")
        print(f"{r['model']} {r['schedule']} torch: device peaks {peaks}; " + "; ".join(held),
              flush=True)

    update_summary(a, update)


def zb_profile(a):
    """Where the zero-bubble pairs' time goes: the mean F, B, I and W of each rank (device),
    torch's from its own calls, pipefb's (in-process) from its trace, for 1f1b and zb-h1,
    steps 3 to `steps`. -> raw/zb-profile.txt"""
    work = tempfile.mkdtemp()
    lines = ["mean ms per action, steps after the first 2; torch: its stage's forward and "
             "backward calls (2 processes); pipefb: its trace (pipefb-virtual)",
             "model schedule side device: F B I W | I+W over 1f1b's B"]
    for name in a.models.split(","):
        b1f1b = {}
        for schedule in ("1f1b", "zb-h1"):
            out = tempfile.mkdtemp(dir=work)
            run_torch(name, schedule, False, a.steps, out, timing=True)
            per = {}
            for r in range(STAGES):
                calls = json.load(open(os.path.join(out, f"timing-{r}.json")))
                per[r] = {}
                for kind in "FBIW":
                    t = [x for k, x in calls if k == kind]
                    t = t[WARMUP * MICROBATCHES:]  # each kind runs once a microbatch
                    per[r][kind] = 1e3 * statistics.mean(t) if t else 0.0
            out = tempfile.mkdtemp(dir=work)
            run_pipefb(name, schedule, "pipefb-virtual", False, a.steps, work, out,
                       trace=True)
            events = json.load(open(os.path.join(out, "run", "trace.json")))["traceEvents"]
            pper = {}
            for d in range(STAGES):
                pper[d] = {}
                for kind in "FBIW":
                    t = [e["dur"] / 1e3 for e in events if e.get("ph") == "X" and
                         e.get("cat") == kind and e["pid"] == d and
                         e["args"]["index"] // MICROBATCHES >= WARMUP]
                    pper[d][kind] = statistics.mean(t) if t else 0.0
            for side, res in (("torch", per), ("pipefb", pper)):
                for d in range(STAGES):
                    m = res[d]
                    if schedule == "1f1b":
                        b1f1b[(side, d)] = m["B"]
                    ratio = ((m["I"] + m["W"]) / b1f1b[(side, d)]
                             if schedule != "1f1b" and b1f1b.get((side, d)) else float("nan"))
                    lines.append(f"{name} {schedule} {side} {d}: " +
                                 " ".join(f"{m[k]:.2f}" for k in "FBIW") + f" | {ratio:.2f}")
                    print(lines[-1], flush=True)
    with open(os.path.join(a.out, "raw", "zb-profile.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    shutil.rmtree(work)


def table(a):
    rows = list(csv.DictReader(open(os.path.join(a.out, "summary.csv"))))
    by = {(r["model"], r["schedule"], r["side"]): r for r in rows}

    def peaks(model, schedule, side):
        raw = os.path.join(a.out, "raw", f"{model}-{schedule}-{side}.txt")
        for line in open(raw):
            if line.startswith("peak"):
                return ", ".join(f"{int(x) / 1e6:.2f}" for x in
                                 line.split("[")[1].split("]")[0].split(","))
        return "–"

    print("| model | schedule (pipefb / torch) | samples/s torch | pipefb-launch (× torch) | "
          "pipefb-virtual (× torch) | device peaks, MB: torch / pipefb-virtual | gradient error "
          "torch / launch / virtual |")
    print("|---|---|---|---|---|---|---|")
    for (model, schedule, side), r in by.items():
        if side != "torch":
            continue
        t = r["samples_per_s_median"]
        cells = []
        for s in ("pipefb-launch", "pipefb-virtual"):
            v = by[(model, schedule, s)]["samples_per_s_median"]
            cells.append(f"{float(v):.1f} ({float(v) / float(t):.2f}×)" if t else f"{float(v):.1f}")
        cls, _, _, psched, pstages = SCHEDULES[schedule]
        name = f"{psched} / {cls}" + (" (4 stages)" if pstages == 4 else "")
        errs = " / ".join(by[(model, schedule, s)]["grad_rel_err"] for s in
                          ("torch", "pipefb-launch", "pipefb-virtual"))
        print(f"| {model} | {name} | {float(t):.1f} | {cells[0]} | {cells[1]} | "
              f"{peaks(model, schedule, 'torch')} / {peaks(model, schedule, 'pipefb-virtual')} | "
              f"{errs} |" if t else
              f"| {model} | {name} | fails on gloo | {cells[0]} | {cells[1]} | – / "
              f"{peaks(model, schedule, 'pipefb-virtual')} | {errs} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt2-tiny,vgg16-quarter")
    ap.add_argument("--schedules", default="gpipe,1f1b,interleaved-1f1b,zb-h1,interleaved-zb,zbv")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default=os.path.join(ROOT, "experiments", "results", "peer_pipelining"))
    ap.add_argument("--grads-only", action="store_true",
                    help="measure the gradients only, into the grad_rel_err column of an "
                         "existing summary.csv (its speed and memory columns stay)")
    ap.add_argument("--torch-memory-only", action="store_true",
                    help="measure torch's device peaks only, into an existing summary.csv's "
                         "peak column and raw/*-torch.txt")
    ap.add_argument("--zb-profile", action="store_true",
                    help="where the zero-bubble pairs' time goes: mean F, B, I, W per device "
                         "on both sides (raw/zb-profile.txt)")
    ap.add_argument("--beyond-only", action="store_true",
                    help="only the plan at half torch 1F1B's largest stage peak on GPT-2 tiny "
                         "(the peak from summary.csv), alternated with torch's 1F1B "
                         "(raw/beyond.txt)")
    ap.add_argument("--table", action="store_true",
                    help="print experiments/README.md's table from summary.csv and raw/*.txt")
    a = ap.parse_args()
    if a.table:
        return table(a)
    if a.zb_profile:
        return zb_profile(a)
    if a.grads_only:
        return grads_only(a)
    if a.torch_memory_only:
        return torch_memory_only(a)
    if a.beyond_only:
        with open(os.path.join(a.out, "summary.csv")) as f:
            peak = next(int(r["peak_stage_bytes"]) for r in csv.DictReader(f)
                        if (r["model"], r["schedule"], r["side"]) == ("gpt2-tiny", "1f1b", "torch"))
        return write_beyond("gpt2-tiny", peak, a, tempfile.mkdtemp())
    os.makedirs(os.path.join(a.out, "raw"), exist_ok=True)
    work = tempfile.mkdtemp()
    sides = ["torch", "pipefb-launch", "pipefb-virtual"]
    rows = []
    jobs = [(m, s) for m in a.models.split(",") for s in a.schedules.split(",")]
    begin = time.time()
    for j, (name, schedule) in enumerate(jobs):
        ref = reference(name)
        errs, speeds, peaks, failed = {}, {s: [] for s in sides}, {}, {}
        for side in sides:
            out = tempfile.mkdtemp(dir=work)
            try:
                g = run_torch(name, schedule, True, 1, out) if side == "torch" else \
                    run_pipefb(name, schedule, side, True, 1, work, out)
                errs[side] = rel_err(g, ref)
            except Exception as e:  # recorded, and the side is left out of this pair
                failed[side] = str(e).strip().splitlines()[-1]
                errs[side] = (float("nan"), "failed")
        for r in range(a.rounds):
            for side in sides:  # alternated: each round runs every side once
                if side in failed:
                    continue
                out = tempfile.mkdtemp(dir=work)
                speed, peaks[side] = (run_torch(name, schedule, False, a.steps, out)
                                      if side == "torch" else
                                      run_pipefb(name, schedule, side, False, a.steps, work, out))
                speeds[side].append(speed)
            done = j * a.rounds + r + 1
            eta = (time.time() - begin) / done * (len(jobs) * a.rounds - done)
            print(f"{name} {schedule}: round {r + 1} of {a.rounds} "
                  f"(ETA {eta:.0f} s)", flush=True)
        held = []
        if "torch" not in failed:  # its peaks from a run of its own, under the profiler
            peaks["torch"], held = torch_memory(name, schedule, work)
        for side in sides:
            v = speeds[side]
            with open(os.path.join(a.out, "raw", f"{name}-{schedule}-{side}.txt"), "w") as f:
                if side in failed:
                    f.write(f"failed: {failed[side]}\n")
                    rows.append({"model": name, "schedule": schedule, "side": side,
                                 "samples_per_s_median": "", "samples_per_s_min": "",
                                 "samples_per_s_max": "", "peak_stage_bytes": "",
                                 "grad_rel_err": "failed"})
                    continue
                f.write(f"samples/s per round: {v}\nlargest relative gradient error: "
                        f"{errs[side][0]:.3g} ({errs[side][1]})\n"
                        f"peak live tensor bytes per device (last round): {peaks[side]}\n" +
                        ("".join(x + "\n" for x in held) if side == "torch" else ""))
            rows.append({"model": name, "schedule": schedule, "side": side,
                         "samples_per_s_median": f"{statistics.median(v):.2f}",
                         "samples_per_s_min": f"{min(v):.2f}",
                         "samples_per_s_max": f"{max(v):.2f}",
                         "peak_stage_bytes": max(peaks[side]),
                         "grad_rel_err": f"{errs[side][0]:.3g}"})
        print("\n".join(f"  {r['side']}: {r['samples_per_s_median']} samples/s, grad err "
                        f"{r['grad_rel_err']}, device peaks {peaks.get(r['side'])}"
                        for r in rows[-3:]), flush=True)
        if name == "gpt2-tiny" and schedule == "1f1b" and "torch" in peaks:
            write_beyond(name, max(peaks["torch"]), a, work)
    # Rows of models and schedules this run left out stay (a run of --models resnet50-eighth
    # adds to the others').
    path = os.path.join(a.out, "summary.csv")
    ran = {(r["model"], r["schedule"]) for r in rows}
    kept = [r for r in csv.DictReader(open(path)) if (r["model"], r["schedule"]) not in ran] \
        if os.path.exists(path) else []
    write_summary(a.out, kept + rows)
    shutil.rmtree(work)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
