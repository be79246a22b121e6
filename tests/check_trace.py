#!/usr/bin/env python3
"""check_trace.py FILE [--host N] [--device N] [--graph-events N] [--name NAME ...]

Checks a trace written by sg_prof_write_trace (stepgraph trace) the way a trace viewer reads
it, with the standard library only: a JSON object holding a traceEvents list; every complete
event ("ph": "X") with a string name, numeric ts >= 0 and dur >= 0, integer pid and tid; a
process_name for every process and a thread_name for every track that events use; host events
(process "host") nested properly on each thread, as viewers require; and, when given, the
number of host and device (process "GPU n") events, of device events carrying a graph id, and
names that must appear. Exit status 0 when all hold, 1 otherwise (each failure printed).
"""
import argparse
import json
import numbers
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--host", type=int, help="expected host events (CUDA calls and ranges)")
    ap.add_argument("--device", type=int, help="expected device events (kernels, copies, sets)")
    ap.add_argument("--graph-events", type=int, help="expected device events with a graph id")
    ap.add_argument("--name", action="append", default=[], help="a name some event must have")
    a = ap.parse_args()
    fails = []

    def fail(msg):
        fails.append(msg)
        if len(fails) <= 20:
            print(f"check_trace: {a.file}: {msg}", file=sys.stderr)

    try:
        with open(a.file, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"check_trace: {a.file}: not a readable JSON file: {e}", file=sys.stderr)
        return 1
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        print(f"check_trace: {a.file}: no top-level traceEvents list", file=sys.stderr)
        return 1

    procs, threads, spans = {}, {}, []
    for i, ev in enumerate(doc["traceEvents"]):
        if not isinstance(ev, dict) or "ph" not in ev:
            fail(f"event {i} is not an object with a 'ph'")
            continue
        if ev["ph"] == "M":
            name = ev.get("args", {}).get("name")
            if ev.get("name") == "process_name":
                procs[ev.get("pid")] = name
            elif ev.get("name") == "thread_name":
                threads[(ev.get("pid"), ev.get("tid"))] = name
            continue
        if ev["ph"] != "X":
            continue
        ok = isinstance(ev.get("name"), str) and ev["name"] != ""
        for key in ("ts", "dur"):
            v = ev.get(key)
            if not isinstance(v, numbers.Real) or isinstance(v, bool) or v < 0:
                ok = False
        for key in ("pid", "tid"):
            if not isinstance(ev.get(key), int) or isinstance(ev.get(key), bool):
                ok = False
        if not ok:
            fail(f"event {i} needs a name, ts >= 0, dur >= 0, integer pid and tid: {ev}")
            continue
        spans.append(ev)

    for pid in sorted({e["pid"] for e in spans}):
        if not isinstance(procs.get(pid), str):
            fail(f"process {pid} has events but no process_name")
    for track in sorted({(e["pid"], e["tid"]) for e in spans}):
        if not isinstance(threads.get(track), str):
            fail(f"track pid {track[0]} tid {track[1]} has events but no thread_name")
    host_pids = {p for p, n in procs.items() if n == "host"}
    gpu_pids = {p for p, n in procs.items() if isinstance(n, str) and n.startswith("GPU")}
    host = [e for e in spans if e["pid"] in host_pids]
    device = [e for e in spans if e["pid"] in gpu_pids]
    if len(host) + len(device) != len(spans):
        fail(f"{len(spans) - len(host) - len(device)} events in a process neither 'host' nor 'GPU n'")

    # On one host thread, events nest: each starts after the previous ends or lies inside it.
    eps = 1e-6
    for track in sorted({(e["pid"], e["tid"]) for e in host}):
        evs = sorted((e for e in host if (e["pid"], e["tid"]) == track),
                     key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in evs:
            end = e["ts"] + e["dur"]
            while stack and e["ts"] >= stack[-1][0] - eps:
                stack.pop()
            if stack and end > stack[-1][0] + eps:
                fail(f"host thread {track[1]}: '{e['name']}' at {e['ts']} us overlaps "
                     f"'{stack[-1][1]}' without nesting in it")
            stack.append((end, e["name"]))

    if a.host is not None and len(host) != a.host:
        fail(f"{len(host)} host events, expected {a.host}")
    if a.device is not None and len(device) != a.device:
        fail(f"{len(device)} device events, expected {a.device}")
    graph = sum(1 for e in device if isinstance(e.get("args"), dict) and "graph" in e["args"])
    if a.graph_events is not None and graph != a.graph_events:
        fail(f"{graph} device events carry a graph id, expected {a.graph_events}")
    names = {e["name"] for e in spans}
    for n in a.name:
        if n not in names:
            fail(f"no event named '{n}'")

    if fails:
        print(f"check_trace: {a.file}: {len(fails)} problem(s)", file=sys.stderr)
        return 1
    print(f"check_trace: {a.file}: ok: {len(host)} host events on "
          f"{len({e['tid'] for e in host})} thread(s), {len(device)} device events on "
          f"{len({(e['pid'], e['tid']) for e in device})} stream(s), {graph} from graphs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
