#!/usr/bin/env python3
"""bench/torch_ref.py: the PyTorch reference for stepgraph's canonical MLP workloads.

Run on the GPU machine in the same run as `stepgraph bench` (only ratios measured in one run
count, see shared/DESIGN.md). Needs PyTorch with CUDA; no network.

    python3 bench/torch_ref.py --model mlp-512-6-32,mlp-2048-6-256 --mode eager --json

Model mlp-WIDTH-DEPTH-BATCH: input dim WIDTH; DEPTH blocks Linear(WIDTH, WIDTH) + ReLU (the
first takes the input); a Linear(WIDTH, 10) head; cross-entropy loss; torch.optim.Adam (lr 1e-3,
default betas and eps, no weight decay, the implementation PyTorch picks by default: foreach on
CUDA, reported as adam_impl); fp32 with TF32 off. Data: 64 batches generated on the device once
(inputs N(0,1), labels the argmax of a fixed random linear teacher, as stepgraph's data.c), and
step i uses batch i % 64, so a step copies nothing from the host.

Modes:
  eager               zero_grad(set_to_none=True), forward, loss, backward, step
  graph               the whole step captured with torch.cuda.graph (Adam capturable=True);
                      each step copies its batch into the static inputs, then replays
  graphed_callables   torch.cuda.make_graphed_callables on the whole model (forward and
                      backward graphs); loss and optimizer stay eager
  graphed_layers      make_graphed_callables on each block (Linear+ReLU) and the head
  compile             torch.compile(model, mode="reduce-overhead") (model only; loss and
                      optimizer stay eager)

Measured per model and mode, after validating that the loss is finite and falls over the
warm-up (mean loss on batches 0-3, before training and after the warm-up):
  ms_per_step           median over --repeats blocks of the block's mean, timed with CUDA events
  host_ms_per_step      median over the same blocks of host time spent queuing the block
                        (perf_counter around the loop, no sync inside)
  kernels_per_step      kernels executed per step, from torch.profiler (CUPTI) over a few steps
  gpu_busy_ms_per_step  union of the device activity intervals (kernels, memcpys, memsets) per
                        step over the same profiled steps (stepgraph's sg_prof measures the same)
  peak_mib              torch.cuda.max_memory_allocated over the run (the data set included;
                        data_mib says how much of it is data); peak_reserved_mib is
                        max_memory_reserved, what the caching allocator took from the device
"""

import argparse
import gc
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback

NUM_CLASSES = 10
NUM_BATCHES = 64
MODES = ("eager", "graph", "graphed_callables", "graphed_layers", "compile")

torch = None  # imported in main(), so that --help works without PyTorch
nn = None
F = None


def parse_model(name):
    """'mlp-512-6-32' -> (512, 6, 32)."""
    parts = name.split("-")
    if len(parts) != 4 or parts[0] != "mlp" or not all(p.isdigit() for p in parts[1:]):
        raise ValueError(f"model '{name}': expected mlp-WIDTH-DEPTH-BATCH, e.g. mlp-512-6-32 "
                         "(only the MLP workloads have a PyTorch reference here)")
    width, depth, batch = (int(p) for p in parts[1:])
    if width <= 0 or depth <= 0 or batch <= 0:
        raise ValueError(f"model '{name}': width, depth and batch must be positive")
    return width, depth, batch


def split_list(values, allowed=None, what="value"):
    """Repeated flags and comma lists, flattened, order kept, duplicates dropped."""
    out = []
    for v in values:
        for item in v.split(","):
            item = item.strip()
            if not item:
                continue
            if allowed is not None and item not in allowed:
                raise SystemExit(f"torch_ref.py: unknown {what} '{item}' (one of {', '.join(allowed)})")
            if item not in out:
                out.append(item)
    return out


def set_fp32_no_tf32():
    """TF32 off through the legacy flags only: from PyTorch 2.9 on, mixing them with the new
    fp32_precision API leaves a state that some readers (Inductor) refuse."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for var in ("NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"):
        if os.environ.get(var):
            print(f"torch_ref.py: warning: {var}={os.environ[var]} is set; it can override the "
                  "TF32 setting", file=sys.stderr)


def tf32_state():
    try:
        return {"matmul": bool(torch.backends.cuda.matmul.allow_tf32),
                "cudnn": bool(torch.backends.cudnn.allow_tf32)}
    except RuntimeError as e:  # a mixed-API state: say so rather than fail the run
        return {"error": str(e)[:200]}


def build_mlp(width, depth):
    """Blocks as children, so graphed_layers can graph each one; the kernels are the same as
    a flat Sequential's."""
    blocks = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)]
    return nn.Sequential(*blocks, nn.Linear(width, NUM_CLASSES))


def make_data(width, batch, seed):
    """(64, B, W) inputs and (64, B) labels on the device; a linear teacher's argmax."""
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    x = torch.randn(NUM_BATCHES, batch, width, device="cuda", generator=g)
    teacher = torch.randn(NUM_CLASSES, width, device="cuda", generator=g)
    y = torch.matmul(x, teacher.t()).argmax(dim=-1)
    return x, y


def adam_impl(params, opt):
    """Which Adam implementation runs: the user's choice, else PyTorch's default."""
    d = opt.defaults
    if d.get("fused"):
        return "fused"
    if d.get("foreach") is not None:
        return "foreach" if d["foreach"] else "single_tensor"
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach
        fused, foreach = _default_to_fused_or_foreach(list(params), False, False)
        return "fused" if fused else ("foreach" if foreach else "single_tensor")
    except Exception:  # a private helper: its absence must not stop the benchmark
        return "default (unknown)"


def torch_no_grad(fn):
    """torch.no_grad() as a decorator, resolved at call time (torch is imported in main)."""
    def wrapped(*args, **kwargs):
        with torch.no_grad():
            return fn(*args, **kwargs)
    return wrapped


class Workload:
    """One model in one mode: step(i) queues training step i and returns the loss tensor
    (no host sync)."""

    def __init__(self, name, mode, seed):
        width, depth, batch = parse_model(name)
        self.name, self.mode = name, mode
        torch.manual_seed(seed)
        self.x, self.y = make_data(width, batch, seed + 1)
        self.data_mib = (self.x.numel() * self.x.element_size()
                         + self.y.numel() * self.y.element_size()) / 2**20
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self.model = build_mlp(width, depth).cuda()
        self.params = list(self.model.parameters())  # (weight, bias) per layer, in order
        self.param_count = sum(p.numel() for p in self.params)
        self.probe_before = self.probe_loss()
        self.step = getattr(self, "_setup_" + mode)(width, depth, batch)

    @torch_no_grad
    def probe_loss(self, nbatches=4):
        """Mean loss over the first batches, computed from the parameters directly, so it reads
        the same model in every mode (graphs and compiled code update these tensors in place).
        The validation compares it before training and after the warm-up: one batch's loss
        against another's would be mostly noise."""
        total = 0.0
        for b in range(nbatches):
            h = self.x[b]
            for k in range(0, len(self.params), 2):
                h = F.linear(h, self.params[k], self.params[k + 1])
                if k + 2 < len(self.params):
                    h = F.relu(h)
            total += float(F.cross_entropy(h, self.y[b]))
        return total / nbatches

    def _batch(self, i):
        return self.x[i % NUM_BATCHES], self.y[i % NUM_BATCHES]

    def _adam(self, **kw):
        opt = torch.optim.Adam(self.model.parameters(), lr=1e-3, **kw)
        self.adam_impl = adam_impl(self.model.parameters(), opt)
        return opt

    def _eager_step(self, fwd, opt):
        def step(i):
            xb, yb = self._batch(i)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(fwd(xb), yb)
            loss.backward()
            opt.step()
            return loss
        return step

    def _setup_eager(self, width, depth, batch):
        return self._eager_step(self.model, self._adam())

    def _setup_graph(self, width, depth, batch):
        opt = self._adam(capturable=True)
        static_x, static_y = (t.clone() for t in self._batch(0))
        # Warm up on a side stream (the documented recipe): optimizer state and cuBLAS
        # handles are created here, not during capture. These steps train on batch 0.
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(self.model(static_x), static_y).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)  # grads are allocated inside the graph's pool
        with torch.cuda.graph(graph):
            static_loss = F.cross_entropy(self.model(static_x), static_y)
            static_loss.backward()
            opt.step()
        self.graph = graph  # keeps the graph (and its pool) alive

        def step(i):
            xb, yb = self._batch(i)
            static_x.copy_(xb)
            static_y.copy_(yb)
            graph.replay()
            return static_loss
        return step

    def _setup_graphed_callables(self, width, depth, batch):
        sample = self._batch(0)[0].clone()  # requires_grad False, as the real inputs
        self.model = torch.cuda.make_graphed_callables(self.model, (sample,))
        return self._eager_step(self.model, self._adam())

    def _setup_graphed_layers(self, width, depth, batch):
        blocks = tuple(self.model.children())
        # The first block's input is data (no grad); every later input is an activation.
        samples = [(self._batch(0)[0].clone(),)]
        samples += [(torch.randn(batch, width, device="cuda", requires_grad=True),)
                    for _ in blocks[1:]]
        graphed = torch.cuda.make_graphed_callables(blocks, tuple(samples))
        self.model = nn.Sequential(*graphed)
        return self._eager_step(self.model, self._adam())

    def _setup_compile(self, width, depth, batch):
        compiled = torch.compile(self.model, mode="reduce-overhead")
        inner = self._eager_step(compiled, self._adam())

        def step(i):
            torch.compiler.cudagraph_mark_step_begin()  # a new iteration for cudagraph trees
            return inner(i)
        return step


def interval_union(intervals):
    """Total length of the union of (start, end) pairs."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if cur_e is not None and s <= cur_e:
            cur_e = max(cur_e, e)
        else:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def profile_steps(step, first, n):
    """Kernels per step and GPU-busy ms per step over n steps, from a torch.profiler trace
    (CUPTI underneath). Returns (None, None) when the trace holds no device activity."""
    from torch.profiler import ProfilerActivity, profile
    # A throwaway session first: CUPTI's one-time setup stays out of the measured one.
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]):
        step(first)
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for k in range(n):
            step(first + 1 + k)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    # Kineto's categories: "kernel" (CONCURRENT_KERNEL), "gpu_memcpy", "gpu_memset".
    device = [e for e in events
              if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    kernels = sum(1 for e in device if e.get("cat") == "kernel")
    if not device:
        return None, None
    busy_us = interval_union([(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
                              for e in device])
    return kernels / n, busy_us / 1000.0 / n


def run_one(name, mode, args):
    w = Workload(name, mode, args.seed)
    it = 0
    loss_first = float(w.step(it))  # a host sync, before any timing
    it += 1
    for _ in range(args.warmup):
        w.step(it)
        it += 1
    probe_after = w.probe_loss()
    if not (math.isfinite(loss_first) and math.isfinite(probe_after)):
        raise RuntimeError(f"{name} {mode}: loss is not finite (first step {loss_first}, "
                           f"after warm-up {probe_after})")
    loss_fell = probe_after < w.probe_before
    if not loss_fell:
        print(f"torch_ref.py: warning: {name} {mode}: the loss on batches 0-3 did not fall over "
              f"the set-up and {args.warmup + 1} warm-up steps ({w.probe_before:.4f} -> "
              f"{probe_after:.4f})", file=sys.stderr)

    block = max(1, args.steps // args.repeats)
    dev_ms, host_ms = [], []
    for _ in range(args.repeats):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        e0.record()
        t0 = time.perf_counter()
        for _ in range(block):
            w.step(it)
            it += 1
        t1 = time.perf_counter()
        e1.record()
        e1.synchronize()
        dev_ms.append(e0.elapsed_time(e1) / block)
        host_ms.append((t1 - t0) * 1e3 / block)
    loss_last = float(w.step(it))
    it += 1

    kernels, busy_ms = (None, None)
    if args.profile_steps > 0:
        kernels, busy_ms = profile_steps(w.step, it, args.profile_steps)
        if kernels is None:
            print(f"torch_ref.py: warning: {name} {mode}: the profiler trace holds no device "
                  "activity (CUPTI unavailable?); kernels and GPU-busy are null", file=sys.stderr)
    torch.cuda.synchronize()
    peak_mib = torch.cuda.max_memory_allocated() / 2**20
    peak_reserved_mib = torch.cuda.max_memory_reserved() / 2**20

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    row = {
        "framework": "pytorch",
        "model": name,
        "mode": mode,
        "ms_per_step": round(statistics.median(dev_ms), 5),
        "host_ms_per_step": round(statistics.median(host_ms), 5),
        "kernels_per_step": None if kernels is None else round(kernels, 2),
        "gpu_busy_ms_per_step": None if busy_ms is None else round(busy_ms, 5),
        "peak_mib": round(peak_mib, 1),
        "peak_reserved_mib": round(peak_reserved_mib, 1),
        "device": f"{props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs)",
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "adam_impl": w.adam_impl,
        "tf32": tf32_state(),
        "params": w.param_count,
        "data_mib": round(w.data_mib, 1),
        "warmup": args.warmup,
        "repeats": args.repeats,
        "steps_per_block": block,
        "block_ms_per_step": [round(v, 5) for v in dev_ms],
        "profiled_steps": args.profile_steps,
        "loss_first": round(loss_first, 5),
        "loss_last": round(loss_last, 5),
        "probe_loss_before": round(w.probe_before, 5),
        "probe_loss_after_warmup": round(probe_after, 5),
        "loss_fell": loss_fell,
    }
    del w
    return row


def cleanup(mode):
    """Frees one workload's graphs, pools and compiled code before the next one starts."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    if mode == "compile":
        # importlib, not "import torch._dynamo": that statement would make `torch` a local
        # name of this function and break the calls above.
        import importlib
        importlib.import_module("torch._dynamo").reset()


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def print_table(rows):
    head = (f"{'model':<16} {'mode':<18} {'ms/step':>9} {'host ms':>9} {'kernels':>8} "
            f"{'busy ms':>9} {'peak MiB':>9} {'loss':>15}")
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<16} {r['mode']:<18} ERROR: {r['error']}")
            continue
        loss = f"{r['loss_first']:.3f}->{r['loss_last']:.3f}"
        print(f"{r['model']:<16} {r['mode']:<18} {r['ms_per_step']:>9.4f} "
              f"{r['host_ms_per_step']:>9.4f} {fmt(r['kernels_per_step'], '8.1f'):>8} "
              f"{fmt(r['gpu_busy_ms_per_step'], '9.4f'):>9} {r['peak_mib']:>9.1f} {loss:>15}")
    if rows and "device" in rows[0]:
        print(f"device: {rows[0]['device']}; torch {rows[0]['torch_version']}; "
              f"Adam {rows[0]['adam_impl']}; TF32 {rows[0]['tf32']}")


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="PyTorch reference timings for stepgraph's MLP workloads (see the file's "
                    "docstring for what each number means).")
    ap.add_argument("--model", action="append", required=True,
                    help="mlp-WIDTH-DEPTH-BATCH; repeat the flag or give a comma list")
    ap.add_argument("--mode", action="append", default=None,
                    help=f"one of {', '.join(MODES)} (repeat or comma list; default eager)")
    ap.add_argument("--steps", type=int, default=200,
                    help="timed steps in all, split into --repeats blocks (default 200)")
    ap.add_argument("--repeats", type=int, default=5, help="timed blocks (default 5)")
    ap.add_argument("--warmup", type=int, default=30, help="untimed steps first (default 30)")
    ap.add_argument("--profile-steps", type=int, default=5,
                    help="steps profiled for kernels and GPU-busy (default 5; 0: skip)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", action="store_true", help="one JSON object per line on stdout")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.repeats < 1 or args.warmup < 0 or args.profile_steps < 0:
        ap.error("--steps and --repeats must be >= 1; --warmup and --profile-steps >= 0")
    models = split_list(args.model)
    modes = split_list(args.mode or ["eager"], MODES, "mode")
    for m in models:
        try:
            parse_model(m)
        except ValueError as e:
            ap.error(str(e))

    global torch, nn, F
    try:
        import torch as _torch
        import torch.nn as _nn
        import torch.nn.functional as _F
    except ImportError as e:
        print(f"torch_ref.py: PyTorch is not installed: {e}", file=sys.stderr)
        return 2
    torch, nn, F = _torch, _nn, _F
    if not torch.cuda.is_available():
        print("torch_ref.py: no CUDA device visible to PyTorch; the reference needs a GPU",
              file=sys.stderr)
        return 2
    set_fp32_no_tf32()

    rows, failed = [], False
    for name in models:
        for mode in modes:
            try:
                row = run_one(name, mode, args)
            except Exception as e:  # one failing mode must not hide the others' numbers
                traceback.print_exc()
                failed = True
                row = {"framework": "pytorch", "model": name, "mode": mode,
                       "error": f"{type(e).__name__}: {str(e)[:300]}",
                       "torch_version": torch.__version__}
            cleanup(mode)
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
    if not args.json:
        print_table(rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
