#!/usr/bin/env python3
"""overlap.py TRACE.json [STEPS] [TAIL]: how a data-parallel step's collectives overlap its compute, from
a trace that `stepgraph trace` wrote (with --gpus N, rank 0's GPU): over the traced window,
divided by STEPS (default 5), the window's length, the compute kernels' summed time and the time
some compute kernel runs (union), the NCCL kernels' summed time and union, how much of the NCCL
time has no compute kernel beside it (exposed), the GPU's idle time, and the median gap from
one compute kernel's end to the next one's start (in graph replays of gpt-256-4 bf16 on an
H200: 0.1 us alone, 0.4 us once NCCL kernels are in the graph; bench/RESULTS.md, session 29).
Compute kernels whose summed time grows between a 1-GPU and a 2-GPU trace were slowed by the
collectives beside them: compare two traces' kernel tables with scripts/kernel_times.py. With
TAIL, also the window's last TAIL kernels in start order (start and gap to the kernel before it
on any stream, duration, stream): how the last step's backward, all-reduces and update follow
each other; and the window's largest idle gaps (no kernel on any stream), with the kernels on
either side, per step."""
import json
import statistics
import sys

path = sys.argv[1]
steps = float(sys.argv[2]) if len(sys.argv) > 2 else 5.0
tail = int(sys.argv[3]) if len(sys.argv) > 3 else 0
events = json.load(open(path))
events = events["traceEvents"] if isinstance(events, dict) else events
gpu = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
       and str(e.get("args", {}).get("name", "")).startswith("GPU")}
comp, comm, seq = [], [], []
for e in events:
    if e.get("ph") == "X" and e.get("pid") in gpu:
        (comm if "nccl" in e["name"].lower() else comp).append((e["ts"], e["ts"] + e["dur"]))
        seq.append((e["ts"], e["dur"], e.get("tid"), e["name"]))


def union(iv):
    iv = sorted(iv)
    out = []
    for a, b in iv:
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def length(iv):
    return sum(b - a for a, b in iv)


def minus(a, b):
    """Length of union a not covered by union b (both sorted, disjoint)."""
    tot, j = 0.0, 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                tot += b[k][0] - cur
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            tot += e - cur
    return tot


if not comp:
    sys.exit("overlap.py: no GPU kernels in " + path)
allk = comp + comm
t0, t1 = min(a for a, _ in allk), max(b for _, b in allk)
uc, un, ua = union(comp), union(comm), union(allk)
rows = [("window", t1 - t0), ("compute kernels, summed", sum(b - a for a, b in comp)),
        ("compute busy (union)", length(uc)), ("NCCL kernels, summed", sum(b - a for a, b in comm)),
        ("NCCL busy (union)", length(un)), ("NCCL exposed (no compute beside it)", minus(un, uc)),
        ("GPU idle", (t1 - t0) - length(ua))]
print(f"{path}: {len(comp) / steps:.0f} compute and {len(comm) / steps:.0f} NCCL kernels a step")
for name, us in rows:
    print(f"  {name:38s} {us / steps:9.1f} us a step")
# From each compute kernel's end to the next one's start (start order, those that do not
# overlap): in a graph replay, what the GPU takes to start the next kernel.
cs = sorted(comp)
cgaps = [b[0] - a[1] for a, b in zip(cs, cs[1:]) if b[0] >= a[1]]
if cgaps:
    print(f"  {'median gap between compute kernels':38s} {statistics.median(cgaps):9.2f} us")
if tail:
    seq.sort()
    t_end = seq[-tail - 1][0] + seq[-tail - 1][1] if len(seq) > tail else seq[0][0]
    print(f"the last {tail} kernels (us from the first; gap after the latest end before it):")
    for ts, dur, tid, name in seq[-tail:]:
        print(f"  {ts - seq[-tail][0]:9.1f} gap {ts - t_end:7.1f} {dur:8.1f}  stream {tid}  {name[:60]}")
        t_end = max(t_end, ts + dur)
    seq_all = sorted(seq)
    gaps, t_end, last = [], seq_all[0][0], seq_all[0]
    for ev in seq_all:
        if ev[0] > t_end:
            gaps.append((ev[0] - t_end, last[3], ev[3]))
        if ev[0] + ev[1] > t_end:
            t_end, last = ev[0] + ev[1], ev
    agg = {}
    for g, a, b in gaps:
        k = (a[:40], b[:40])
        agg[k] = agg.get(k, 0.0) + g
    print("idle gaps by the kernels on either side, us a step (largest 8):")
    for (a, b), g in sorted(agg.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {g / steps:7.1f}  after {a}  before {b}")
