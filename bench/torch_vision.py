#!/usr/bin/env python3
"""bench/torch_vision.py: the PyTorch reference for stepgraph's convolutional workloads (ResNet,
EfficientNet-B0), run as PyTorch's users run convnets at their fastest.

Run on the GPU machine in the same run as `stepgraph bench` (only ratios measured in one run
count, see shared/DESIGN.md). Needs PyTorch with CUDA and torchvision; no network (weights are
random, nothing is downloaded).

    python3 bench/torch_vision.py --model resnet18-32-32,resnet50-32-224 --json
    python3 bench/torch_vision.py --model efficientnet_b0-32-224 --mode eager,graph --precision bf16

Model ARCH-B-R: torchvision.models.ARCH(weights=None, num_classes=--classes) (default 1000), ARCH
one of resnet18, resnet34, resnet50 and efficientnet_b0, torchvision's architectures and
initialisation exactly, taking B images of R x R pixels and 3 channels (resnet: R >= 29, as
stepgraph's src/models/resnet.c). efficientnet_b0's regularisers default to off (--dropout 0
on the classifier, --stochastic-depth 0; torchvision's defaults are 0.2 and 0.2): at 0 both are
no-ops that launch nothing. Model, parameters and inputs are channels_last;
torch.backends.cudnn.benchmark = True. Loss: cross-entropy. torch.optim.Adam (lr 1e-3, default
betas and eps, no weight decay, the implementation PyTorch picks by default: foreach on CUDA,
reported as adam_impl; capturable=True in the graph mode).

Data, as resnet.c: 8 batches made on the device once: images N(0,1), drawn in NHWC order and
viewed as (8, B, 3, R, R), each batch a channels_last (B, 3, R, R) tensor; labels the argmax over
classes of a fixed random linear teacher (classes, 48) of the image's 4 x 4 average-pooled
thumbnail (F.adaptive_avg_pool2d, flattened); step i uses batch i % 8, so a step copies and
converts nothing. (resnet.c's teacher draws other random numbers: the same task.)

--precision fp32|bf16 (repeat or comma list; default fp32): bf16 runs the forward and the loss
under torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False) with fp32 master weights,
fp32 gradients and fp32 Adam; in the graph mode the autocast region lies inside the capture. The
autocast cache is off in every mode, because make_graphed_callables requires it off. TF32 stays
off in both precisions (torch.backends.cuda.matmul.allow_tf32 and cudnn.allow_tf32 False,
reported as "tf32"), because stepgraph's fp32 is true fp32.

Modes (--mode, repeat or comma list; default all five):
  eager               zero_grad(set_to_none=True), forward, loss, backward, step
  graph               the whole step captured with torch.cuda.graph after 3 warm-up steps on a
                      side stream (they train on batch 0; cuDNN autotunes there): forward, loss,
                      backward, Adam (capturable=True), BatchNorm's running statistics; each
                      step copies its batch into the static inputs, then replays
  graphed_callables   torch.cuda.make_graphed_callables(model, (batch 0,)): forward and backward
                      graphs (running statistics updated inside, the model in training mode);
                      loss and optimizer stay eager
  compile             torch.compile(model, mode="reduce-overhead") (model only; loss and
                      optimizer stay eager); cudagraph_skips says how often Inductor fell back
                      from CUDA graphs (null where this PyTorch does not count it)
  graph_compile       the graph mode's whole-step torch.cuda.graph around compiled code:
                      torch.compile(model) in its default mode (Inductor's kernels, no CUDA
                      graphs of its own) and the compiled Adam step (capturable=True), both
                      compiled by the side-stream warm-up (bench/torch_ref.py's mode of the
                      same name, PyTorch's fastest on the GPT in 2026-11)

Measured per model, precision and mode, after validating that the training loss is finite and
falls over the warm-up (loss_first is step 0's loss; cycle_loss_first the mean loss of steps
0-7, one pass over the 8 batches; cycle_loss_after_warmup the mean of the last 8 warm-up steps,
the same 8 batches; each read from the step itself, in the mode under test):
  ms_per_step           median over --repeats blocks (--steps in all, as torch_ref.py) of the
                        block's mean, timed with CUDA events (torch.cuda.synchronize before each)
  host_ms_per_step      median over the same blocks of host time spent queuing the block
  kernels_per_step      kernels executed per step, from torch.profiler (CUPTI) over a few steps
  gpu_busy_ms_per_step  union of the device activity intervals (kernels, memcpys, memsets) per
                        step over the same steps (both by torch_ref.py's own profile_steps)
  allocs_per_100        cudaMalloc calls by PyTorch's caching allocator per 100 timed steps (the
                        change of memory_stats()["segment.all.allocated"] over the timed blocks;
                        allocs_per_100_steps, stepgraph bench's key, is the same number);
                        cudamalloc_total counts them from the start of the set-up (before the
                        data) to the end of the timed blocks. Libraries' own cudaMallocs are not
                        seen; cuDNN autotunes once per shape in the process, so the first mode of
                        a model counts the autotuning's workspaces and later modes do not
  peak_reserved_mib     torch.cuda.max_memory_reserved after the timed blocks, peak stats reset
                        after building the model and the data (so they count) and before the
                        mode's set-up and warm-up; peak_allocated_mib is max_memory_allocated
                        (peak_mib, torch_ref.py's key, is the same number)
A mode that fails (compile unavailable, say) gives a row with an "error" key; the others go on.
"""

import argparse
import collections
import contextlib
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402  (its helpers: list flags, TF32, Adam's name, the profiler)

ARCHS = ("resnet18", "resnet34", "resnet50", "efficientnet_b0")
MODES = ("eager", "graph", "graphed_callables", "compile", "graph_compile")
PRECISIONS = ("fp32", "bf16")
NUM_BATCHES = 8  # as resnet.c's RESNET_BATCHES
THUMB = 4        # the teacher sees 4 x 4 average-pooled images
LR = 1e-3

torch = None  # imported in main(), so that --help works without PyTorch
nn = None
F = None
torchvision = None

ModelSpec = collections.namedtuple("ModelSpec", "arch batch size")


def parse_model(name):
    """'resnet50-32-224' -> ModelSpec('resnet50', 32, 224)."""
    parts = name.split("-")
    if len(parts) != 3 or parts[0] not in ARCHS or not all(p.isdigit() for p in parts[1:]):
        raise ValueError(f"model '{name}': expected ARCH-BATCH-SIZE with ARCH one of "
                         f"{', '.join(ARCHS)} (e.g. resnet50-32-224)")
    batch, size = int(parts[1]), int(parts[2])
    if batch < 1 or size < 1:
        raise ValueError(f"model '{name}': batch and image size must be positive")
    if parts[0].startswith("resnet") and size < 29:
        raise ValueError(f"model '{name}': images of {size} pixels shrink below 1 pixel through "
                         "the stem and three stride-2 stages: expected R >= 29 (as stepgraph)")
    return ModelSpec(parts[0], batch, size)


def make_images(batch, size, classes, seed):
    """(8, B, 3, R, R) images, each batch channels_last, and (8, B) int64 labels on the device."""
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    x = torch.randn(NUM_BATCHES, batch, size, size, 3, device="cuda", generator=g)
    x = x.permute(0, 1, 4, 2, 3)  # a view: x[i] has channels_last strides
    teacher = torch.randn(classes, 3 * THUMB * THUMB, device="cuda", generator=g)
    thumbs = F.adaptive_avg_pool2d(x.flatten(0, 1), THUMB).flatten(1)  # (8B, 48)
    y = torch.matmul(thumbs, teacher.t()).argmax(dim=-1).view(NUM_BATCHES, batch)
    assert x[0].is_contiguous(memory_format=torch.channels_last)
    return x, y


def build_model(spec, classes, dropout, stochastic_depth):
    """torchvision's model with random weights. efficientnet_b0 passes its own dropout (0.2)
    positionally in some torchvision versions, so it is set on the module afterwards."""
    if spec.arch == "efficientnet_b0":
        model = torchvision.models.efficientnet_b0(weights=None, num_classes=classes,
                                                   stochastic_depth_prob=stochastic_depth)
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.p = dropout
        return model
    return getattr(torchvision.models, spec.arch)(weights=None, num_classes=classes)


def cudamalloc_count():
    """cudaMalloc calls the caching allocator has made in this process so far."""
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0))


def cudagraph_skips():
    """Inductor's count of graphs it ran without CUDA graphs, or None where it has no counter."""
    try:
        import importlib
        utils = importlib.import_module("torch._inductor.cudagraph_utils")
        if not hasattr(utils, "log_cudagraph_skip_and_bump_counter"):
            return None
        return int(importlib.import_module("torch._dynamo.utils").counters["inductor"]
                   ["cudagraph_skips"])
    except Exception:  # private modules: their absence must not stop the benchmark
        return None


class Workload:
    """One model in one precision and mode: step(i) queues training step i and returns the loss
    tensor (no host sync)."""

    def __init__(self, name, mode, precision, args):
        self.spec = spec = parse_model(name)
        self.name, self.mode, self.precision = name, mode, precision
        self.mallocs_start = cudamalloc_count()
        torch.manual_seed(args.seed)
        self.x, self.y = make_images(spec.batch, spec.size, args.classes, args.seed + 1)
        self.data_mib = (self.x.numel() * self.x.element_size()
                         + self.y.numel() * self.y.element_size()) / 2**20
        model = build_model(spec, args.classes, args.dropout, args.stochastic_depth)
        self.model = model.cuda().to(memory_format=torch.channels_last).train()
        self.param_count = sum(p.numel() for p in self.model.parameters())
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self.skips_start = cudagraph_skips() if mode == "compile" else None
        self.step = getattr(self, "_setup_" + mode)()

    def _batch(self, i):
        return self.x[i % NUM_BATCHES], self.y[i % NUM_BATCHES]

    def _autocast(self):
        """The region of the forward and the loss: bf16 autocast, or nothing for fp32."""
        if self.precision == "bf16":
            return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)
        return contextlib.nullcontext()

    def _adam(self, **kw):
        opt = torch.optim.Adam(self.model.parameters(), lr=LR, **kw)
        self.adam_impl = torch_ref.adam_impl(self.model.parameters(), opt)
        return opt

    def _eager_step(self, fwd, opt):
        def step(i):
            xb, yb = self._batch(i)
            opt.zero_grad(set_to_none=True)
            with self._autocast():
                loss = F.cross_entropy(fwd(xb), yb)
            loss.backward()
            opt.step()
            return loss
        return step

    def _setup_eager(self):
        return self._eager_step(self.model, self._adam())

    def _setup_graph(self):
        opt = self._adam(capturable=True)
        return self._whole_step_graph(self.model, opt, opt.step)

    def _setup_graph_compile(self):
        # Inductor's kernels (torch.compile's default mode: no CUDA graphs of its own) for the
        # model and the compiled Adam step (capturable), captured in one whole-step graph; the
        # side-stream warm-up compiles both.
        opt = self._adam(capturable=True)
        return self._whole_step_graph(torch.compile(self.model), opt, torch.compile(opt.step))

    def _whole_step_graph(self, fwd, opt, opt_step):
        """The whole step (forward, loss, backward, opt_step()) captured in one torch.cuda.graph
        after 3 warm-up steps on a side stream; the step copies its batch in and replays."""
        static_x, static_y = (t.clone() for t in self._batch(0))  # clone keeps channels_last
        # Warm up on a side stream (the documented recipe): optimizer state, cuDNN's autotuning
        # and library handles happen here, not during capture. These steps train on batch 0.
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                with self._autocast():
                    loss = F.cross_entropy(fwd(static_x), static_y)
                loss.backward()
                opt_step()
        torch.cuda.current_stream().wait_stream(s)
        del loss
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)  # grads are allocated inside the graph's pool
        with torch.cuda.graph(graph):
            with self._autocast():
                static_loss = F.cross_entropy(fwd(static_x), static_y)
            static_loss.backward()
            opt_step()
        self.graph = graph  # keeps the graph (and its pool) alive

        def step(i):
            xb, yb = self._batch(i)
            static_x.copy_(xb)
            static_y.copy_(yb)
            graph.replay()
            return static_loss
        return step

    def _setup_graphed_callables(self):
        sample = self._batch(0)[0].clone()  # channels_last, requires_grad False as the inputs
        with self._autocast():  # bf16: warm-up and capture run under the step's autocast
            self.model = torch.cuda.make_graphed_callables(self.model, (sample,))
        return self._eager_step(self.model, self._adam())

    def _setup_compile(self):
        compiled = torch.compile(self.model, mode="reduce-overhead")
        inner = self._eager_step(compiled, self._adam())

        def step(i):
            torch.compiler.cudagraph_mark_step_begin()  # a new iteration for cudagraph trees
            return inner(i)
        return step


def run_one(name, mode, precision, args):
    w = Workload(name, mode, precision, args)
    it, losses = 0, []
    for _ in range(1 + args.warmup):  # host syncs here are fine: nothing is timed yet
        losses.append(float(w.step(it)))
        it += 1
    n = min(NUM_BATCHES, len(losses) // 2)
    cycle_first = statistics.fmean(losses[:n]) if n else losses[0]
    cycle_after = statistics.fmean(losses[-n:]) if n else losses[-1]
    if not all(math.isfinite(v) for v in (losses[0], cycle_first, cycle_after)):
        raise RuntimeError(f"{name} {precision} {mode}: loss is not finite (first step "
                           f"{losses[0]}, first cycle {cycle_first}, after warm-up {cycle_after})")
    loss_fell = n > 0 and cycle_after < cycle_first
    if not loss_fell:
        print(f"torch_vision.py: warning: {name} {precision} {mode}: the mean loss of {n} "
              f"steps did not fall from the first steps to the last of {args.warmup} warm-up "
              f"steps ({cycle_first:.4f} -> {cycle_after:.4f})", file=sys.stderr)
    skips = cudagraph_skips() if mode == "compile" else None
    if skips is not None and w.skips_start is not None:
        skips -= w.skips_start

    torch.cuda.synchronize()
    mallocs_timed = cudamalloc_count()
    dev_ms, host_ms, block, it = torch_ref.timed_blocks(w.step, it, args.steps, args.repeats)
    mallocs_end = cudamalloc_count()
    peak_reserved_mib = torch.cuda.max_memory_reserved() / 2**20
    peak_allocated_mib = torch.cuda.max_memory_allocated() / 2**20
    loss_last = float(w.step(it))
    it += 1

    kernels, busy_ms = (None, None)
    if args.profile_steps > 0:
        kernels, busy_ms = torch_ref.profile_steps(w.step, it, args.profile_steps,
                                                   torch_ref.trace_path(args, name, precision, mode))
        if kernels is None:
            print(f"torch_vision.py: warning: {name} {precision} {mode}: the profiler trace "
                  "holds no device activity (CUPTI unavailable?); kernels and GPU-busy are null",
                  file=sys.stderr)
    torch.cuda.synchronize()

    allocs_100 = 100.0 * (mallocs_end - mallocs_timed) / (block * args.repeats)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    row = {
        "framework": "pytorch",
        "model": name,
        "mode": mode,
        "precision": precision,
        "ms_per_step": round(statistics.median(dev_ms), 5),
        "host_ms_per_step": round(statistics.median(host_ms), 5),
        "kernels_per_step": None if kernels is None else round(kernels, 2),
        "gpu_busy_ms_per_step": None if busy_ms is None else round(busy_ms, 5),
        "allocs_per_100": round(allocs_100, 2),
        "allocs_per_100_steps": round(allocs_100, 2),
        "cudamalloc_total": mallocs_end - w.mallocs_start,
        "peak_reserved_mib": round(peak_reserved_mib, 1),
        "peak_allocated_mib": round(peak_allocated_mib, 1),
        "peak_mib": round(peak_allocated_mib, 1),
        "cudagraph_skips": skips,
        "device": f"{props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs)",
        "torch_version": torch.__version__,
        "torchvision_version": torchvision.__version__,
        "cuda_version": torch.version.cuda,
        "cudnn_version": torch.backends.cudnn.version(),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "channels_last": True,
        "tf32": torch_ref.tf32_state(),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "adam_impl": w.adam_impl,
        "lr": LR,
        "arch": w.spec.arch,
        "batch": w.spec.batch,
        "image_size": w.spec.size,
        "classes": args.classes,
        "params": w.param_count,
        "data_mib": round(w.data_mib, 1),
        "warmup": args.warmup,
        "repeats": args.repeats,
        "steps_per_block": block,
        "block_ms_per_step": [round(v, 5) for v in dev_ms],
        "profiled_steps": args.profile_steps,
        "loss_first": round(losses[0], 5),
        "loss_last": round(loss_last, 5),
        "cycle_loss_first": round(cycle_first, 5),
        "cycle_loss_after_warmup": round(cycle_after, 5),
        "loss_fell": loss_fell,
    }
    if w.spec.arch == "efficientnet_b0":
        row.update({"dropout": args.dropout, "stochastic_depth": args.stochastic_depth})
    del w
    return row


cleanup = torch_ref.cleanup  # frees one workload's graphs, pools and compiled code


def print_table(rows):
    head = (f"{'model':<24} {'prec':<5} {'mode':<18} {'ms/step':>9} {'host ms':>9} {'kernels':>8} "
            f"{'busy ms':>9} {'alloc/100':>9} {'peak MiB':>9} {'loss':>15}")
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<24} {r['precision']:<5} {r['mode']:<18} ERROR: {r['error']}")
            continue
        loss = f"{r['loss_first']:.3f}->{r['loss_last']:.3f}"
        print(f"{r['model']:<24} {r['precision']:<5} {r['mode']:<18} {r['ms_per_step']:>9.4f} "
              f"{r['host_ms_per_step']:>9.4f} {torch_ref.fmt(r['kernels_per_step'], '8.1f'):>8} "
              f"{torch_ref.fmt(r['gpu_busy_ms_per_step'], '9.4f'):>9} {r['allocs_per_100']:>9.2f} "
              f"{r['peak_reserved_mib']:>9.1f} {loss:>15}")
    ok = [r for r in rows if "device" in r]
    if ok:
        print(f"device: {ok[0]['device']}; torch {ok[0]['torch_version']}, torchvision "
              f"{ok[0]['torchvision_version']}, cuDNN {ok[0]['cudnn_version']}; Adam "
              f"{ok[0]['adam_impl']}; TF32 {ok[0]['tf32']}; peak MiB: reserved")


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="PyTorch reference timings for stepgraph's ResNet and EfficientNet "
                    "workloads (see the file's docstring for what each number means).")
    ap.add_argument("--model", action="append", required=True,
                    help="ARCH-BATCH-SIZE, ARCH one of " + ", ".join(ARCHS) + "; repeat the "
                         "flag or give a comma list")
    ap.add_argument("--mode", action="append", default=None,
                    help=f"one of {', '.join(MODES)} (repeat or comma list; default all)")
    ap.add_argument("--precision", action="append", default=None,
                    help="fp32 or bf16 (autocast), repeat or comma list (default fp32)")
    ap.add_argument("--classes", type=int, default=1000,
                    help="classes of the head and the synthetic labels (default 1000)")
    ap.add_argument("--steps", type=int, default=200,
                    help="timed steps in all, split into --repeats blocks (default 200)")
    ap.add_argument("--repeats", type=int, default=5, help="timed blocks (default 5)")
    ap.add_argument("--warmup", type=int, default=30, help="untimed steps first (default 30)")
    ap.add_argument("--profile-steps", type=int, default=5,
                    help="steps profiled for kernels and GPU-busy (default 5; 0: skip)")
    torch_ref.add_trace_dir(ap)
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="efficientnet_b0: the classifier's dropout (default 0; torchvision's 0.2)")
    ap.add_argument("--stochastic-depth", type=float, default=0.0,
                    help="efficientnet_b0: stochastic_depth_prob (default 0; torchvision's 0.2)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", action="store_true", help="one JSON object per line on stdout")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.repeats < 1 or args.warmup < 0 or args.profile_steps < 0:
        ap.error("--steps and --repeats must be >= 1; --warmup and --profile-steps >= 0")
    torch_ref.check_trace_dir(ap, args)
    if args.classes < 1:
        ap.error("--classes must be >= 1")
    if not (0.0 <= args.dropout < 1.0 and 0.0 <= args.stochastic_depth < 1.0):
        ap.error("--dropout and --stochastic-depth must be in [0, 1)")
    try:
        models = torch_ref.split_list(args.model)
        modes = torch_ref.split_list(args.mode or list(MODES), MODES, "mode")
        precisions = torch_ref.split_list(args.precision or ["fp32"], PRECISIONS, "precision")
    except SystemExit as e:  # split_list names torch_ref.py in its message
        ap.error(str(e).replace("torch_ref.py: ", ""))
    for m in models:
        try:
            parse_model(m)
        except ValueError as e:
            ap.error(str(e))

    global torch, nn, F, torchvision
    try:
        import torch as _torch
        import torch.nn as _nn
        import torch.nn.functional as _F
        import torchvision as _torchvision
    except ImportError as e:
        print(f"torch_vision.py: PyTorch or torchvision is not installed: {e}", file=sys.stderr)
        return 2
    torch, nn, F, torchvision = _torch, _nn, _F, _torchvision
    torch_ref.torch = torch  # its helpers read the module-level name torch_ref.torch
    if not torch.cuda.is_available():
        print("torch_vision.py: no CUDA device visible to PyTorch; the reference needs a GPU",
              file=sys.stderr)
        return 2
    torch_ref.set_tf32(False)
    torch.backends.cudnn.benchmark = True

    runs = [(name, precision) for name in models for precision in precisions]
    return torch_ref.run_all(runs, modes, run_one, cleanup, print_table, args)


if __name__ == "__main__":
    sys.exit(main())
