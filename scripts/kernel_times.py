#!/usr/bin/env python3
"""kernel_times.py TRACE.json [STEPS] [TOP] [NAME]: the device time of each kernel name in a
trace that `stepgraph trace` wrote (processes named "GPU n"), summed and divided by STEPS
(default 5), the largest TOP (default 30) first: where a step's GPU time goes, kernel by kernel.
With NAME, also each call of the kernels whose name contains NAME in the first traced step, in
launch order (which call of a family is the slow one)."""
import json
import sys
from collections import defaultdict

if len(sys.argv) < 2:
    sys.exit(__doc__)
path = sys.argv[1]
steps = float(sys.argv[2]) if len(sys.argv) > 2 else 5.0
if steps <= 0:
    sys.exit(f"kernel_times.py: STEPS must be positive, not {sys.argv[2]}")
top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
pick = sys.argv[4] if len(sys.argv) > 4 else None
try:
    with open(path) as f:
        events = json.load(f)
except (OSError, ValueError) as e:
    sys.exit(f"kernel_times.py: {path}: {e}")
events = events["traceEvents"] if isinstance(events, dict) else events
gpu = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
       and str(e.get("args", {}).get("name", "")).startswith("GPU")}
tot, cnt = defaultdict(float), defaultdict(int)
calls = []
for e in events:
    if e.get("ph") == "X" and e.get("pid") in gpu:
        tot[e["name"]] += e["dur"]
        cnt[e["name"]] += 1
        if pick and pick in e["name"]:
            calls.append((e["ts"], e["dur"], e["name"]))
allus = sum(tot.values())
print(f"{'us/step':>9} {'calls':>6} {'us/call':>8}  kernel   (all: {allus / steps:.1f} us a step)")
for name, us in sorted(tot.items(), key=lambda kv: -kv[1])[:top]:
    print(f"{us / steps:9.1f} {cnt[name] / steps:6.0f} {us / cnt[name]:8.2f}  {name[:110]}")
if pick:
    calls.sort()
    per = int(len(calls) / steps)
    print(f"\nthe first step's {per} calls of *{pick}*, in order (us):")
    print(" ".join(f"{d:.1f}" for _, d, _ in calls[:per]))
