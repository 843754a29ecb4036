#!/usr/bin/env python3
"""Reads the runs of experiments/offload_memory.sh (issue 5, "Memory").

  offload_memory.py run RUN_DIR ROW CHECKS_TXT LABEL
      prints one CSV fragment for runs.csv:
        peak_dev_mib,peak_device,peak_top_category,overlap_pct,stall_s_per_it,copy_s_per_it,host_pool_mib,check
      and appends to CHECKS_TXT the per-device peak breakdown by category and, for
      1f1b-offload and pipefb-sync-offload, the check of the issue with its numbers.
  offload_memory.py table RUNS_CSV TABLE_CSV
      one row per (size, row) over the rounds, and the goal of the issue per size.

Inputs are pipefb_train's run folder: summary.json (pipeline.devices[].category_peaks,
peak_by_category, stash_bytes_per_microbatch, transfers[]), config.yaml (lookahead) and
trace.json (Note [Chrome trace], pipefb/report/ChromeTrace.h: per device a compute track
tid 0 with an X event per action, a copy-engine track tid 1 with an X event per copy job,
'memory' counters at every action's end, 'memory events' counters from the allocation
stream of the first traced iterations). Times in the trace are microseconds.
"""
import bisect
import collections
import csv
import json
import sys

MIB = 2**20


def lookaheads(run_dir, stages):
    la = None
    for line in open(f"{run_dir}/config.yaml"):
        s = line.strip()
        if s.startswith("lookahead:"):
            la = s.split(":", 1)[1].strip()
    if la is None or la in ("", "[]"):
        return [1] * stages
    if la.startswith("["):
        return [int(x) for x in la.strip("[]").split(",")]
    return [int(la)] * stages


def breakdown(cats):
    items = sorted(((v, k) for k, v in cats.items() if v > 0), reverse=True)
    return ", ".join(f"{k} {v / MIB:.1f}" for v, k in items)


def run(run_dir, row, checks_path, label):
    j = json.load(open(f"{run_dir}/summary.json"))
    p = j["pipeline"]
    devs = [d for d in p["devices"] if d["name"] != "host"]
    iters = j["steps"]
    out = [f"## {label}: {run_dir}"]
    out.append(f"partition {p['partition']}; stash of one microbatch per stage (MiB): "
               + ", ".join(f"{b / MIB:.1f}" for b in p["stash_bytes_per_microbatch"]))
    out.append("peak per device (MiB) and its breakdown by category at that instant:")
    for d in devs:
        out.append(f"  {d['name']}: {d['peak_bytes'] / MIB:.1f} = {breakdown(d['peak_by_category'])}"
                   f"  (stash's own peak {d['category_peaks']['stash'] / MIB:.1f})")
    for d in p["devices"]:
        if d["name"] == "host":  # the host domain: the pool's stashes and any host optimizer
            out.append(f"  host domain: {d['peak_bytes'] / MIB:.1f} = {breakdown(d['peak_by_category'])}")
    top = max(devs, key=lambda d: d["peak_bytes"])
    topcat = max(top["peak_by_category"].items(), key=lambda kv: kv[1])
    tr = p["transfers"]
    copy = sum(t["copy_seconds"] for t in tr)
    hidden = sum(t["hidden_seconds"] for t in tr)
    stall = sum(t["stall_seconds"] for t in tr)
    overlap = f"{100 * hidden / copy:.1f}" if copy > 0 else ""
    if copy > 0:
        out.append("transfers per device: " + "; ".join(
            f"{t['name']} D2H {t['bytes_d2h'] / MIB:.0f} MiB H2D {t['bytes_h2d'] / MIB:.0f} MiB "
            f"copy {t['copy_seconds']:.2f} s hidden {t['hidden_seconds']:.2f} s stall {t['stall_seconds']:.2f} s"
            for t in tr))
    check = ""
    if row == "1f1b-offload":
        check = check_1f1b(run_dir, p, devs, out)
    elif row.startswith("pipefb-sync-offload"):
        check = check_pipefb(run_dir, out)
    with open(checks_path, "a") as f:
        f.write("\n".join(out) + "\n\n")
    print(f"{top['peak_bytes'] / MIB:.1f},{top['name']},{topcat[0]} {topcat[1] / MIB:.1f},{overlap},"
          f"{stall / iters:.3f},{copy / iters:.3f},{p['host_pool']['peak_bytes'] / MIB:.1f},{check}")


def trace_events(run_dir):
    t = json.load(open(f"{run_dir}/trace.json"))
    return t["traceEvents"] if isinstance(t, dict) else t


def check_1f1b(run_dir, p, devs, out):
    # One microbatch's stash as it comes back: what its OFF copied (the saved tensors,
    # the stage input included: on the forward side that input is still charged to
    # comm_buffers, so stash_bytes_per_microbatch, measured at the first F, leaves it out).
    per_mb = p["stash_bytes_per_microbatch"]
    la = lookaheads(run_dir, len(per_mb))
    between = collections.defaultdict(int)  # pid -> max stash at an action's end
    for e in trace_events(run_dir):
        if e.get("ph") == "C" and e.get("name") == "memory":
            between[e["pid"]] = max(between[e["pid"]], e["args"].get("stash", 0))
    ok = True
    out.append("CHECK 1f1b-offload: resident stash per device (held between actions, all iterations) "
               "<= (1 + lookahead) x (one microbatch's stash + 1 KiB)")
    for s, d in enumerate(devs):  # 1f1b: stage s on cpu:s
        t = p["transfers"][s]
        unit = max(per_mb[s], t["bytes_d2h"] // max(1, t["offloads"]))
        res = between[s]
        inst = d["category_peaks"]["stash"]
        # + 1 KiB per microbatch: the stash entry's hollowed graph root and input, 0-dim
        # placeholders of 4 B each charged to the stash (Note [Asynchronous host copies]).
        bound = (1 + la[s]) * (unit + 1024)
        ok &= res <= bound
        out.append(f"  {d['name']} (stage {s}, lookahead {la[s]}): one microbatch {unit / MIB:.2f} MiB "
                   f"(at F {per_mb[s] / MIB:.2f}); resident {res / MIB:.2f} MiB = {res / unit:.2f} microbatches, "
                   f"bound {bound / MIB:.2f} MiB: {'ok' if res <= bound else 'EXCEEDED by %.2f MiB' % ((res - bound) / MIB)}; "
                   f"instantaneous peak (during an F or B) {inst / MIB:.2f} MiB = {inst / unit:.2f}")
    out.append(f"  => {'PASS' if ok else 'FAIL'}")
    return "pass" if ok else "fail"


def check_pipefb(run_dir, out):
    ev = trace_events(run_dir)
    compute = collections.defaultdict(list)   # pid -> compute-track X events, in time order
    copies = collections.defaultdict(list)    # pid -> D2H copy jobs
    after = collections.defaultdict(list)     # pid -> 'memory' samples (action ends)
    stream = collections.defaultdict(list)    # pid -> 'memory events' samples
    for e in ev:
        ph, pid = e.get("ph"), e.get("pid")
        if ph == "X" and e.get("tid") == 0:
            compute[pid].append(e)
        elif ph == "X" and e.get("cat") == "offload":
            copies[pid].append(e)
        elif ph == "C" and e.get("name") == "memory":
            after[pid].append(e)
        elif ph == "C" and e.get("name") == "memory events":
            stream[pid].append(e)
    fwd = sorted(pid for pid, xs in compute.items()
                 if any(x["cat"] == "F" for x in xs) and not any(x["cat"] == "B" for x in xs))
    ok = True
    out.append("CHECK pipefb-sync: the forward devices hold no stash between actions")
    for pid in fwd:
        xs = sorted(compute[pid], key=lambda x: x["ts"])
        samples = sorted(after[pid], key=lambda x: x["ts"])
        # (1) every iteration ends with the device's RW (it receives the new weights):
        # the stash left on the device then, over all iterations.
        ends = [s["args"]["stash"] for x, s in zip(xs, samples) if x["cat"] == "RW"]
        # (2) at each F's start in the traced iterations: the stash live beyond the bytes
        # its copy engine is still copying out (OFF issued, D2H job not finished).
        st = sorted(stream[pid], key=lambda x: x["ts"])
        times = [s["ts"] for s in st]
        off_end = {(x["args"]["stage"], x["args"]["index"]): x["ts"] + x["dur"]
                   for x in xs if x["cat"] == "OFF"}
        jobs = [(off_end.get((c["args"]["stage"], c["args"]["index"]), c["ts"]), c["ts"] + c["dur"],
                 c["args"]["bytes"]) for c in copies[pid]]
        residual, inflight_max, nf = 0, 0, 0
        for x in xs:
            if x["cat"] != "F" or not times or x["ts"] > times[-1]:
                continue
            i = bisect.bisect_right(times, x["ts"]) - 1
            live = st[i]["args"]["stash"] if i >= 0 else 0
            inflight = sum(b for (issued, end, b) in jobs if issued <= x["ts"] < end)
            residual = max(residual, live - inflight)
            inflight_max = max(inflight_max, inflight)
            nf += 1
        # A split stage's stash entry keeps its hollowed graph root/input (0-dim
        # placeholders of 4 B each, Note [Asynchronous host copies]) until B frees it.
        good = max(ends, default=0) == 0 and residual <= 1024
        ok &= good
        out.append(f"  cpu:{pid}: stash at the end of each of {len(ends)} iterations: max {max(ends, default=0)} B; "
                   f"at the start of {nf} forwards (traced iterations): beyond copies in flight max {residual} B "
                   f"(in flight then: max {inflight_max / MIB:.1f} MiB): {'ok' if good else 'HOLDS STASH'}")
    out.append(f"  => {'PASS' if ok else 'FAIL'}")
    return "pass" if ok else "fail"


def table(runs_csv, table_csv):
    rows = list(csv.DictReader(open(runs_csv)))
    groups = collections.OrderedDict()
    for r in rows:
        groups.setdefault((r["size"], r["row"]), []).append(r)
    res = collections.OrderedDict()
    with open(table_csv, "w") as f:
        f.write("size,row,peak_dev_mib,peak_device,peak_top_category,samples_per_s,samples_per_s_rounds,"
                "overlap_pct,stall_s_per_it,copy_s_per_it,host_pool_mib,check\n")
        for (size, row), rs in groups.items():
            top = max(rs, key=lambda r: float(r["peak_dev_mib"]))
            tps = [float(r["samples_per_s"]) for r in rs]
            mean = lambda k: sum(float(r[k]) for r in rs if r[k]) / max(1, sum(1 for r in rs if r[k]))
            ov = f"{mean('overlap_pct'):.1f}" if any(r["overlap_pct"] for r in rs) else ""
            checks = " ".join(r["check"] for r in rs if r["check"])
            v = dict(peak=float(top["peak_dev_mib"]), tp=sum(tps) / len(tps), ov=ov,
                     stall=mean("stall_s_per_it"), copy=mean("copy_s_per_it"))
            res[(size, row)] = v
            f.write(f"{size},{row},{v['peak']:.1f},{top['peak_device']},{top['peak_top_category']},{v['tp']:.2f},"
                    f"{' '.join('%.2f' % x for x in tps)},{ov},{v['stall']:.3f},{v['copy']:.3f},"
                    f"{max(float(r['host_pool_mib']) for r in rs):.1f},{checks}\n")
    for line in csv.reader(open(table_csv)):
        print("  ".join(f"{c:>14}" if i else c for i, c in enumerate(line)))
    for size, fbrow in ((s, r) for s in sorted({k[0] for k in res}, key=int)
                        for r in ("pipefb-sync-offload", "pipefb-sync-offload-optoff")):
        keep, fb = res.get((size, "1f1b-keep")), res.get((size, fbrow))
        if not keep or not fb:
            continue
        pr, tr = fb["peak"] / keep["peak"], fb["tp"] / keep["tp"]
        ov = float(fb["ov"]) if fb["ov"] else 0.0
        print(f"GOAL {size}px {fbrow}: peak {fb['peak']:.1f} / 1f1b-keep {keep['peak']:.1f} MiB = {pr:.3f}x "
              f"(goal <= 0.5: {'met' if pr <= 0.5 else 'missed'}); throughput {fb['tp']:.2f} / {keep['tp']:.2f} "
              f"= {tr:.3f}x (goal >= 0.9: {'met' if tr >= 0.9 else 'missed'}); copy time hidden {ov:.1f}% "
              f"(goal >= 90: {'met' if ov >= 90 else 'missed'})")


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "run":
        run(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "table":
        table(*sys.argv[2:])
    else:
        sys.exit(__doc__)
