#!/usr/bin/env python3
"""trace-top.py TRACE.json [N]: the GPU time of a `stepgraph trace` file by kernel name, largest
first (per traced step: divided by the steps the trace holds), to see where a step's time goes."""
import collections
import json
import sys

def main():
    path = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    by = collections.defaultdict(lambda: [0.0, 0])
    steps = sum(1 for e in events if e.get("name") == "step" and e.get("ph") == "X") or 1
    total = 0.0
    for e in events:
        if e.get("cat") != "kernel" or e.get("ph") != "X":
            continue
        name = e.get("name", "?")
        name = name.split("(")[0][:90]
        by[name][0] += e.get("dur", 0.0)
        by[name][1] += 1
        total += e.get("dur", 0.0)
    print(f"{path}: {steps} step(s), kernel time {total / steps / 1000:.3f} ms a step")
    for name, (dur, cnt) in sorted(by.items(), key=lambda kv: -kv[1][0])[:n]:
        print(f"{dur / steps / 1000:9.3f} ms {cnt / steps:7.1f}x  {100 * dur / total:5.1f}%  {name}")

if __name__ == "__main__":
    main()
