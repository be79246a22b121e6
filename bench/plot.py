#!/usr/bin/env python3
"""bench/plot.py: charts of benchmark results, stepgraph beside PyTorch, as PNG files.

Reads JSON lines written by `stepgraph bench --json` and `python3 bench/torch_ref.py --json`
(lines that do not start with '{' are skipped, so a log with the JSON mixed in works too) and
writes two charts into --out, one panel per model and precision:

    ms_per_step.png      ms per training step (median) of every stepgraph scope next to every
                         PyTorch mode; a black tick marks the GPU-busy time of the step
    launch_overhead.png  each step split into GPU-busy time and the rest (ms_per_step minus
                         GPU-busy: the GPU waits for the host to launch work), as stacked bars,
                         with the rest's share of the step

    python3 bench/plot.py --out docs/img bench/data/*.jsonl

and, with the subcommand `loss`, loss curves from metrics files written by
`stepgraph train --metrics FILE.jsonl` (see main_loss):

    python3 bench/plot.py loss run1.jsonl run2.jsonl -o loss.png

Fields read (shared by both writers): framework, model, scope (stepgraph; files written
before 2026-11-25 call it mode) or mode (PyTorch), precision (absent: fp32),
ms_per_step, host_ms_per_step, gpu_busy_ms_per_step (null: not measured, e.g. on the CPU),
kernels_per_step, steps_per_graph (stepgraph; > 1 labels the row "step xK"); device, commit and
torch_version go into the titles. Rows without ms_per_step (a mode that failed) are skipped
with a note. When one file repeats a row (same model, precision, framework, mode, steps per
graph), the last one counts. Needs matplotlib (pip install matplotlib); no network.
Exit status: 0 charts written, 1 no rows to plot or a malformed line, 2 usage error (a file
that cannot be read included) or matplotlib missing.
"""

import argparse
import json
import os
import sys

# Display order and labels: stepgraph's scopes, then PyTorch's modes (as bench/RESULTS.md).
SCOPES = ("eager", "layer", "model", "step")
TORCH_MODES = {
    "eager": "eager",
    "graph": "torch.cuda.graph (step)",
    "graphed_callables": "make_graphed_callables",
    "graphed_layers": "make_graphed_callables per layer",
    "compile": "compile reduce-overhead",
}
COLORS = {"stepgraph": "#1f77b4", "pytorch": "#ff7f0e"}
BUSY_COLOR, REST_COLOR = "#4c956c", "#d1495b"
DPI = 100


def save(fig, path):
    """PNG at DPI, colours reduced to a palette (flat charts: a third of the bytes, no visible
    change), without the matplotlib version in its metadata (the same data give the same file)."""
    import io
    from PIL import Image
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    Image.open(buf).convert("RGB").quantize(colors=128).save(path, optimize=True)


def fail(code, msg):
    print(f"plot.py: {msg}", file=sys.stderr)
    sys.exit(code)


def read_rows(paths):
    """Every JSON row of the files, in order; malformed JSON names its file and line."""
    rows = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.readlines()
        except OSError as e:
            fail(2, f"cannot read {path}: {e.strerror}")
        for n, line in enumerate(lines, 1):
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                fail(1, f"{path}:{n}: not a JSON object ({e.msg})")
            if not isinstance(row, dict):
                fail(1, f"{path}:{n}: not a JSON object")
            row["_where"] = f"{path}:{n}"
            if row.get("framework") == "stepgraph" and row.get("scope") is not None:
                row["mode"] = row["scope"]  # a stepgraph scope shares the PyTorch mode's column
            rows.append(row)
    return rows


def usable(rows):
    """Rows with the fields the charts need; the others are named on stderr."""
    out = {}
    for r in rows:
        missing = [k for k in ("framework", "model", "mode", "ms_per_step") if r.get(k) is None]
        if "mode" in missing and r.get("framework") == "stepgraph":
            missing[missing.index("mode")] = "scope"
        if missing:
            why = r.get("error") or f"no {', '.join(missing)}"
            print(f"plot.py: note: {r['_where']}: skipped ({why})", file=sys.stderr)
            continue
        key = (r["model"], r.get("precision") or "fp32", r["framework"], r["mode"],
               int(r.get("steps_per_graph") or 1))
        out[key] = r  # a repeated row: the last one counts
    return list(out.values())


def label(r):
    if r["framework"] == "stepgraph":
        k = int(r.get("steps_per_graph") or 1)
        return f"stepgraph {r['mode']}" + (f" x{k}" if k > 1 else "")
    if r["framework"] == "pytorch":
        return f"PyTorch {TORCH_MODES.get(r['mode'], r['mode'])}"
    return f"{r['framework']} {r['mode']}"


def order(r):
    fw = 0 if r["framework"] == "stepgraph" else 1 if r["framework"] == "pytorch" else 2
    modes = SCOPES if fw == 0 else tuple(TORCH_MODES) if fw == 1 else ()
    pos = modes.index(r["mode"]) if r["mode"] in modes else len(modes)
    return (fw, r["framework"], pos, r["mode"], int(r.get("steps_per_graph") or 1))


def panels(rows):
    """{(model, precision): rows in display order}, models sorted, fp32 before bf16."""
    out = {}
    for r in rows:
        out.setdefault((r["model"], r.get("precision") or "fp32"), []).append(r)
    prec = {"fp32": 0, "bf16": 1}
    keys = sorted(out, key=lambda k: (k[0], prec.get(k[1], 2), k[1]))
    return {k: sorted(out[k], key=order) for k in keys}


def busy(r):
    b = r.get("gpu_busy_ms_per_step")
    return float(b) if isinstance(b, (int, float)) else None


def provenance(rows):
    """One line: devices, stepgraph commits, PyTorch versions."""
    def distinct(key, fw=None):
        return sorted({str(r[key]) for r in rows if r.get(key) and (fw is None or r["framework"] == fw)})
    parts = []
    if distinct("device"):
        parts.append(" / ".join(distinct("device")))
    if distinct("commit", "stepgraph"):
        parts.append("stepgraph " + ", ".join(distinct("commit", "stepgraph")))
    if distinct("torch_version", "pytorch"):
        parts.append("PyTorch " + ", ".join(distinct("torch_version", "pytorch")))
    return "; ".join(parts)


def grid(plt, groups):
    """A figure with one panel per group: models down, precisions across."""
    models = sorted({m for m, _ in groups})
    precs = []
    for _, p in groups:
        if p not in precs:
            precs.append(p)
    bars = max(len(v) for v in groups.values())
    fig, axes = plt.subplots(len(models), len(precs), squeeze=False,
                             figsize=(max(6.4 * len(precs), 10), 1.5 + (0.8 + 0.3 * bars) * len(models)))
    where = {}
    for i, m in enumerate(models):
        for j, p in enumerate(precs):
            if (m, p) in groups:
                where[(m, p)] = axes[i][j]
            else:
                axes[i][j].axis("off")
    return fig, where


def finish(fig, title, handles, note, path):
    """Title and legend above the panels, the note (wrapped) below, in fixed inches."""
    import textwrap
    w, h = fig.get_size_inches()
    lines = textwrap.wrap(note, int(w * 15))
    fig.suptitle(title, fontsize=12, y=1 - 0.08 / h, va="top")
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.4 / h), fontsize=8,
               ncol=len(handles), frameon=False)
    fig.text(0.5, 0.05 / h, "\n".join(lines), ha="center", va="bottom", fontsize=8, color="#444444")
    fig.tight_layout(rect=(0, (0.1 + 0.15 * len(lines)) / h, 1, 1 - 0.6 / h))
    save(fig, path)


def chart_ms(plt, groups, rows, path):
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    fig, where = grid(plt, groups)
    for (model, prec), rs in groups.items():
        ax = where[(model, prec)]
        ys = range(len(rs))
        ms = [float(r["ms_per_step"]) for r in rs]
        ax.barh(ys, ms, color=[COLORS.get(r["framework"], "#888888") for r in rs], height=0.7)
        for y, r in zip(ys, rs):
            if busy(r) is not None:
                ax.plot([busy(r)], [y], marker="|", markersize=13, mew=2, color="black")
        top = max(ms + [busy(r) or 0 for r in rs])
        for y, v in zip(ys, ms):
            ax.text(v + top * 0.01, y, f"{v:.2f}" if v < 10 else f"{v:.1f}", va="center", fontsize=7)
        ax.set_yticks(list(ys), [label(r) for r in rs], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, top * 1.12)
        ax.set_xlabel("ms per step", fontsize=8)
        ax.tick_params(axis="x", labelsize=8)
        ax.set_title(f"{model} {prec}", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    fws = {r["framework"] for r in rows}
    handles = [Patch(color=COLORS[fw], label=name) for fw, name in (("stepgraph", "stepgraph"),
                                                                     ("pytorch", "PyTorch")) if fw in fws]
    note = ".  Bars: ms/step (median)"
    if any(busy(r) is not None for r in rows):
        handles.append(Line2D([], [], color="black", marker="|", markersize=10, mew=2,
                              linestyle="none", label="GPU-busy"))
        note += "; |: GPU-busy ms/step"
    finish(fig, "Training step time: stepgraph scopes and PyTorch modes", handles,
           provenance(rows) + note + ". Numbers: bench/RESULTS.md", path)
    plt.close(fig)


def chart_overhead(plt, groups, rows, path):
    from matplotlib.patches import Patch
    fig, where = grid(plt, groups)
    for (model, prec), rs in groups.items():
        ax = where[(model, prec)]
        ys = range(len(rs))
        ms = [float(r["ms_per_step"]) for r in rs]
        b = [min(busy(r), m) for r, m in zip(rs, ms)]  # profiled apart: may pass ms a little
        rest = [m - x for m, x in zip(ms, b)]
        ax.barh(ys, b, color=BUSY_COLOR, height=0.7)
        ax.barh(ys, rest, left=b, color=REST_COLOR, height=0.7)
        top = max(ms)
        for y, m, x in zip(ys, ms, rest):
            ax.text(m + top * 0.01, y, f"{100 * x / m:.0f}%", va="center", fontsize=7)
        ax.set_yticks(list(ys), [label(r) for r in rs], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, top * 1.12)
        ax.set_xlabel("ms per step", fontsize=8)
        ax.tick_params(axis="x", labelsize=8)
        ax.set_title(f"{model} {prec}", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    finish(fig, "Where the step goes: GPU busy, and GPU waiting for the host",
           [Patch(color=BUSY_COLOR, label="GPU busy"),
            Patch(color=REST_COLOR, label="rest: the GPU waits (host work, launches)")],
           provenance(rows) + ".  Rest = ms/step - GPU-busy: host work and launch overhead the "
           "GPU waits for; % = its share of the step", path)
    plt.close(fig)


def parser(prog, description, epilog, files_help):
    """The command line of plot.py or plot.py loss: FILE... and the caller's options."""
    ap = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog)
    ap.add_argument("files", nargs="+", metavar="FILE", help=files_help)
    return ap


def parse(ap, argv):
    """ap's arguments; a FILE that is not a file is a usage error (2)."""
    args = ap.parse_args(argv)
    for p in args.files:
        if not os.path.isfile(p):
            ap.error(f"{p}: no such file")
    return args


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display); exits 2 when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail(2, "matplotlib is not installed: pip install matplotlib (or the distribution's "
                "python3-matplotlib package)")
    return plt


def read_metrics(path):
    """A metrics file of `stepgraph train --metrics`: (run metadata, [step rows]). Lines that
    do not start with '{' are skipped (a log with the JSON mixed in works too); one that does
    but is not JSON fails (1) naming the file and line, except the last one when the file does
    not end in a newline: a run killed while writing it; that line is skipped with a note."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        fail(2, f"cannot read {path}: {e.strerror}")
    except UnicodeDecodeError:
        fail(1, f"{path}: not UTF-8 text (expected JSON lines)")
    lines = text.split("\n")
    run, rows = {}, []
    for n, line in enumerate(lines, 1):
        if not line.lstrip().startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(lines):  # no newline after it: cut off mid-write
                print(f"plot.py: note: {path}:{n}: skipped a truncated last line", file=sys.stderr)
                continue
            fail(1, f"{path}:{n}: not a JSON object ({e.msg})")
        if not isinstance(obj, dict):
            fail(1, f"{path}:{n}: not a JSON object")
        if isinstance(obj.get("run"), dict):
            run = obj["run"]
            continue
        step, loss = obj.get("step"), obj.get("loss")
        if not isinstance(step, (int, float)) or not isinstance(loss, (int, float)):
            print(f"plot.py: note: {path}:{n}: skipped (no numeric step and loss)", file=sys.stderr)
            continue
        rows.append(obj)
    return run, rows


def run_label(run, path):
    """model scope [precision] [backend] from the run's metadata, else the file's name."""
    parts = [str(run[k]) for k in ("model", "scope") if run.get(k)]
    if run.get("precision") and run["precision"] not in ("fp32", "f32"):
        parts.append(str(run["precision"]))
    if run.get("backend") and run["backend"] not in ("cuda", "auto"):
        parts.append(str(run["backend"]))
    return " ".join(parts) if parts else os.path.basename(path)


def main_loss(argv):
    """`plot.py loss FILE... [-o PNG]`: the loss of every logged step against the step, one
    line per metrics file, labelled by its run's model and scope, with the validation loss
    ("val_loss", on the lines where it was measured) as markers of the same colour."""
    ap = parser("plot.py loss",
                "Loss curves (PNG) from metrics files of `stepgraph train --metrics FILE.jsonl`: "
                "loss against step per run, validation loss as markers.",
                "exit status: 0 written, 1 no loss rows or a malformed line, 2 a usage error "
                "(a file that cannot be read included) or matplotlib missing",
                "metrics JSON lines, one file per run")
    ap.add_argument("-o", "--out", default="loss.png", metavar="PNG",
                    help="the chart to write (default: loss.png); its directory is created")
    args = parse(ap, argv)
    runs = []
    for p in args.files:
        run, rows = read_metrics(p)
        if rows:
            runs.append((run_label(run, p), p, rows))
        else:
            print(f"plot.py: note: {p}: no rows with a step and a loss", file=sys.stderr)
    if not runs:
        fail(1, f"no loss rows in {', '.join(args.files)} (expected JSON lines with step and "
                "loss, as `stepgraph train --metrics` writes)")
    labels = [lb for lb, _, _ in runs]
    runs = [(lb if labels.count(lb) == 1 else f"{lb} ({os.path.basename(p)})", p, rows)
            for lb, p, rows in runs]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.8))
    any_val = False
    for i, (lb, _, rows) in enumerate(runs):
        color = f"C{i % 10}"
        ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], color=color, lw=1.2, label=lb)
        val = [(r["step"], r["val_loss"]) for r in rows if isinstance(r.get("val_loss"), (int, float))]
        if val:
            any_val = True
            ax.plot([v[0] for v in val], [v[1] for v in val], color=color, marker="o", ms=5,
                    linestyle="none", markerfacecolor="white")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("Training loss" + ("; o: validation loss" if any_val else ""), fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    if os.path.dirname(args.out):
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
    save(fig, args.out)
    plt.close(fig)
    print(f"wrote {args.out} ({len(runs)} run{'s' if len(runs) > 1 else ''})")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "loss":  # a file named loss: give it as ./loss
        return main_loss(argv[1:])
    ap = parser("plot.py",
                "Charts (PNG) of `stepgraph bench --json` and `bench/torch_ref.py --json` "
                "results: ms/step by scope and mode, and each step's GPU-busy share.",
                "example: python3 bench/plot.py --out docs/img bench/data/*.jsonl; loss curves: "
                "python3 bench/plot.py loss run.jsonl -o loss.png (see plot.py loss --help)",
                "JSON lines, one row per run")
    ap.add_argument("--out", default=".", metavar="DIR",
                    help="directory for the PNG files, created if missing (default: .)")
    args = parse(ap, argv)

    rows = usable(read_rows(args.files))
    if not rows:
        fail(1, f"no benchmark rows in {', '.join(args.files)} (expected JSON lines with "
                "framework, model, scope or mode, and ms_per_step)")

    plt = pyplot()

    os.makedirs(args.out, exist_ok=True)
    groups = panels(rows)
    written = []
    path = os.path.join(args.out, "ms_per_step.png")
    chart_ms(plt, groups, rows, path)
    written.append(path)
    timed = {k: [r for r in v if busy(r) is not None] for k, v in groups.items()}
    timed = {k: v for k, v in timed.items() if v}
    if timed:
        path = os.path.join(args.out, "launch_overhead.png")
        chart_overhead(plt, timed, rows, path)
        written.append(path)
    else:
        print("plot.py: note: no row has gpu_busy_ms_per_step (a CPU run?): no "
              "launch_overhead.png", file=sys.stderr)
    for p in written:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
