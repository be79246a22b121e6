#!/usr/bin/env python3
"""bench/torch_ddp.py: the PyTorch DistributedDataParallel reference for stepgraph's data-parallel
training over NCCL (issue 6). Run it on the multi-GPU machine in the same run as stepgraph's own
multi-GPU runs (only ratios measured in one run count, see shared/DESIGN.md). Needs PyTorch with
CUDA and NCCL; no network, no torchrun.

    python3 bench/torch_ddp.py --model gpt-768-12-8-256 --gpus 1,2 --mode eager,graph \\
        --precision fp32 --json

Workload: bench/torch_ref.py's, imported from it (not copied): the byte-level GPT of
gpt-WIDTH-DEPTH-BATCH-SEQ (C, L, B, T) with its init (seed --seed on every rank; DDP also
broadcasts rank 0's parameters when it wraps the model), F.scaled_dot_product_attention (causal),
no dropout, no clipping; torch.optim.Adam (lr 3e-4, PyTorch's default implementation;
capturable=True in the graph mode); TF32 off; --precision fp32|bf16, bf16 as torch_ref: the
forward and the loss under torch.autocast("cuda", torch.bfloat16, cache_enabled=False), fp32
master weights, gradients and Adam. Only gpt models (the MLP's data has no per-rank form here).

Data parallelism: --gpus N spawns N processes itself (torch.multiprocessing, start method spawn),
one per GPU (rank r on cuda:r), NCCL backend, rendezvous at MASTER_ADDR 127.0.0.1 on a free port.
BATCH in the model name is the per-GPU batch (the issue: "per-GPU batch fixed"), so a step
trains on N * B windows in all. Each rank draws its own 64 batches of random (B, T+1) windows of
the same text (the training 90% of --data, default as torch_ref: the first of
/usr/share/common-licenses/GPL-3, GPL-2, Apache-2.0, /usr/share/dict/words, else seeded synthetic
bytes), from a generator seeded seed + 1 + rank: rank 0's batches are exactly torch_ref's. Step i
uses batch i % 64 on every rank. N = 1 is one spawned process and is still DDP-wrapped (world
size 1), so that every gpus value does the same work per rank; the JSON says "ddp": true.
DDP settings: gradient_as_bucket_view=True, broadcast_buffers=False (the only buffers are the
constant causal masks), default buckets (bucket_cap_mb 25), find_unused_parameters False.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0 is set for the workers).

Modes:
  eager   each step: zero_grad(set_to_none=True), DDP forward, loss, backward (the bucketed
          all-reduces overlap it), Adam step
  graph   the whole step captured once with torch.cuda.graph, following PyTorch's documented
          recipe for capturing DDP with NCCL >= 2.9.6 (CUDA semantics notes, "Usage with
          DistributedDataParallel"): (1) TORCH_NCCL_ASYNC_ERROR_HANDLING=0 before
          init_process_group (set for the whole run when graph is among the modes); (2) DDP
          constructed inside a side-stream context; (3) at least 11 DDP-enabled eager iterations
          before capture (DDP's logger times its first 10 iterations with CUDA events, which
          capture forbids), run on that side stream on batches 0-10 with Adam(capturable=True).
          Then zero_grad(set_to_none=True) and torch.cuda.graph(capture_error_mode=
          "thread_local") around forward, loss, backward (all-reduces included) and Adam step.
          Each step copies its batch into the static input tensors and replays the graph.

Measured per model, precision, mode and gpus value (one process group per gpus value, the
combinations run in turn inside it):
  validation   step 0's loss (loss_first, rank 0's batch) then --warmup untimed steps
               (loss_after_warmup: the last one's loss); every rank checks its losses are
               finite (else an error row). Rank 0 also compares torch_ref's probe loss (mean fp32
               loss on its batches 0-3, from the unwrapped model) before training and after the
               warm-up, and warns on stderr if it did not fall (loss_fell false)
  ms_per_step  --repeats blocks of --steps steps each; before each block every rank
               synchronizes, meets at a barrier, synchronizes again and records a CUDA event;
               after the block it records and waits on another. ms_per_step is rank 0's median
               over the blocks of the block's mean; rank_ms_per_step lists every rank's median
  tokens_per_s global tokens per second: N * B * T / (ms_per_step / 1000)

Output: with --json one JSON line per (model, precision, mode, gpus) on stdout (rank 0 writes
them, the launching process prints them): framework "pytorch-ddp", model, precision, mode, gpus,
per_gpu_batch, seq, ms_per_step, tokens_per_s, loss_first, loss_after_warmup, device
(torch.cuda.get_device_name), torch_version, nccl_version (torch.cuda.nccl.version()), steps (per
block), repeats, warmup, and details (ddp settings, adam_impl, peak_mib, block and per-rank
times, probe losses, data, environment). A combination that fails gives an object with "error"
instead (as does one whose workers crashed or passed --timeout). Without --json a table.

Exit status: 0 all rows good, 1 some error row, 2 bad options, no PyTorch/CUDA, or fewer GPUs
visible than the largest --gpus asks for.
"""

import argparse
import contextlib
import datetime
import functools
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402  (imports no torch at import time)

PROG = "torch_ddp.py"
MODES = ("eager", "graph")
DDP_CAPTURE_WARMUP = 11  # the documented minimum of DDP-enabled eager iterations before capture
CAPTURE_ERROR_MODE = "thread_local"  # NCCL's watchdog thread may query events during capture
DDP_KW = {"gradient_as_bucket_view": True, "broadcast_buffers": False}

torch = None  # imported in main() and worker(), so that --help works without PyTorch
dist = None


def import_torch():
    """Imports torch and binds it where torch_ref's code looks it up (its module globals)."""
    global torch, dist
    import torch as _torch
    import torch.distributed as _dist
    import torch.nn as _nn
    import torch.nn.functional as _F
    torch, dist = _torch, _dist
    torch_ref.torch, torch_ref.nn, torch_ref.F = _torch, _nn, _F


def nccl_version():
    try:
        return ".".join(str(v) for v in torch.cuda.nccl.version())
    except TypeError:  # older PyTorch: one int (e.g. 2708 or 21805)
        return str(torch.cuda.nccl.version())
    except Exception as e:
        return f"unknown ({type(e).__name__})"


def rank_text_data(batch, seq, seed, path, rank=0):
    """torch_ref.make_text_data with per-rank windows: the text (or the synthetic bytes) from
    seed as torch_ref, so every rank trains on the same text, and the windows from a generator
    seeded seed + rank, so rank 0's batches are torch_ref's and other ranks' differ."""
    text, source = torch_ref.load_text(path, seed)
    n_train = text.numel() - math.floor(torch_ref.GPT_VAL_FRACTION * text.numel())
    if n_train < seq + 1:
        raise ValueError(f"{source}: {n_train} training bytes, too few for windows of {seq + 1}")
    train = text[:n_train].cuda()
    g = torch.Generator(device="cuda")
    g.manual_seed(seed + rank)
    starts = torch.randint(0, n_train - seq, (torch_ref.NUM_BATCHES, batch), device="cuda",
                           generator=g)
    windows = train[starts.unsqueeze(-1) + torch.arange(seq + 1, device="cuda")].long()
    tokens = windows[..., :seq].contiguous()
    targets = windows[..., 1:].contiguous()
    del train, starts, windows
    return tokens, targets, source


class DDPWorkload(torch_ref.Workload):
    """torch_ref's Workload (model, data, loss, autocast, Adam, probe loss) with its eager and
    graph set-ups replaced by DDP ones. self.model stays the unwrapped model (Adam and the probe
    use its parameters); self.ddp is the wrapper the steps run."""

    def __init__(self, name, mode, precision, args, rank):
        self.rank = rank
        self.ddp = None
        self.graph = None
        super().__init__(name, mode, precision, args)  # ends by calling _setup_<mode>

    def _wrap(self):
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(self.model, device_ids=[self.rank],
                                       output_device=self.rank, **DDP_KW)

    def _setup_eager(self):
        self.ddp = self._wrap()
        return self._eager_step(self.ddp, self._adam())

    def _setup_graph(self):
        # (2) DDP constructed in a side-stream context; (3) >= 11 eager DDP iterations on that
        # side stream before capture (optimizer state, cuBLAS handles, DDP's bucket rebuild after
        # its first iteration and its logger's first-10-iterations timing all happen here).
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            self.ddp = self._wrap()
        opt = self._adam(capturable=True)
        static_x, static_y = (t.clone() for t in self._batch(0))
        loss = None
        with torch.cuda.stream(s):
            for i in range(DDP_CAPTURE_WARMUP):
                xb, yb = self._batch(i)
                static_x.copy_(xb)
                static_y.copy_(yb)
                opt.zero_grad(set_to_none=True)
                with self._autocast():
                    loss = self._loss(self.ddp(static_x), static_y)
                loss.backward()
                self._clip_and_step(opt)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        del loss
        graph = torch.cuda.CUDAGraph()
        # Grads to None: the captured backward allocates them in the graph's pool, DDP copies
        # them into its buckets and points .grad at the bucket views (static across replays).
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph, capture_error_mode=CAPTURE_ERROR_MODE):
            with self._autocast():  # bf16: the autocast region lies inside the capture
                static_loss = self._loss(self.ddp(static_x), static_y)
            static_loss.backward()
            self._clip_and_step(opt)
        torch.cuda.synchronize()
        self.graph = graph  # keeps the graph (and its pool) alive

        def step(i):
            xb, yb = self._batch(i)
            static_x.copy_(xb)
            static_y.copy_(yb)
            graph.replay()
            return static_loss
        return step


def agree(ok):
    """True on every rank when ok is true on every rank (an all-reduce MIN over NCCL)."""
    t = torch.tensor([1 if ok else 0], dtype=torch.int32, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def sync_all(rank):
    torch.cuda.synchronize()
    dist.barrier(device_ids=[rank])
    torch.cuda.synchronize()


def base_row(name, precision, mode, world):
    spec = torch_ref.parse_model(name)
    return {"framework": "pytorch-ddp", "model": name, "precision": precision, "mode": mode,
            "gpus": world, "per_gpu_batch": spec.batch, "seq": spec.seq}


def run_one(name, mode, precision, args, wl_args, rank, world):
    w = DDPWorkload(name, mode, precision, wl_args, rank)
    it = 0
    loss_first = float(w.step(it))  # a host sync, before any timing
    it += 1
    loss_after = loss_first
    for _ in range(args.warmup):
        loss = w.step(it)
        it += 1
    if args.warmup:
        loss_after = float(loss)
        del loss
    probe_after = w.probe_loss() if rank == 0 else None
    losses = [loss_first, loss_after] + ([probe_after] if probe_after is not None else [])
    bad = None
    if not all(math.isfinite(v) for v in losses):
        bad = (f"loss is not finite on rank {rank} (first step {loss_first}, after warm-up "
               f"{loss_after}" + (f", probe {probe_after}" if probe_after is not None else "")
               + ")")
    if not agree(bad is None):
        raise RuntimeError(bad or "loss is not finite on another rank (see its stderr)")
    loss_fell = None
    if rank == 0:
        loss_fell = probe_after < w.probe_before
        if not loss_fell:
            print(f"{PROG}: warning: {name} {precision} {mode} gpus {world}: rank 0's loss on "
                  f"its batches 0-3 did not fall over the set-up and {args.warmup + 1} warm-up "
                  f"steps ({w.probe_before:.4f} -> {probe_after:.4f})", file=sys.stderr)

    dev_ms = []
    for _ in range(args.repeats):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        sync_all(rank)  # the barrier between blocks
        e0.record()
        for _ in range(args.steps):
            w.step(it)
            it += 1
        e1.record()
        e1.synchronize()
        dev_ms.append(e0.elapsed_time(e1) / args.steps)
    sync_all(rank)
    med = statistics.median(dev_ms)
    mine = torch.tensor([med], dtype=torch.float64, device="cuda")
    every = torch.zeros(world, dtype=torch.float64, device="cuda")
    dist.all_gather_into_tensor(every, mine)
    rank_ms = [round(float(v), 5) for v in every.cpu()]
    torch.cuda.synchronize()
    peak_mib = torch.cuda.max_memory_allocated() / 2**20
    peak_reserved_mib = torch.cuda.max_memory_reserved() / 2**20
    if rank != 0:
        del w
        return None

    spec = w.spec
    row = base_row(name, precision, mode, world)
    row.update({
        "ms_per_step": round(med, 5),
        "tokens_per_s": round(world * spec.batch * spec.seq / (med / 1000.0), 1),
        "loss_first": round(loss_first, 5),
        "loss_after_warmup": round(loss_after, 5),
        "device": torch.cuda.get_device_name(rank),
        "torch_version": torch.__version__,
        "nccl_version": nccl_version(),
        "cuda_version": torch.version.cuda,
        "steps": args.steps,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "timed_steps": args.steps * args.repeats,
        "block_ms_per_step": [round(v, 5) for v in dev_ms],
        "rank_ms_per_step": rank_ms,
        "ms_per_step_max_rank": max(rank_ms),
        "global_batch": world * spec.batch,
        "ddp": dict(DDP_KW, wrapped=True, bucket_cap_mb="default (25)",
                    find_unused_parameters=False),
        "graph_eager_warmup": DDP_CAPTURE_WARMUP if mode == "graph" else 0,
        "capture_error_mode": CAPTURE_ERROR_MODE if mode == "graph" else None,
        "zero_grad": "set_to_none",
        "adam_impl": w.adam_impl,
        "lr": w.lr,
        "tf32": torch_ref.tf32_state(),
        "params": w.param_count,
        "heads": spec.width // torch_ref.GPT_HEAD_DIM,
        "attention": "sdpa",
        "data": w.data_source,
        "data_seed": f"{args.seed + 1} + rank",
        "peak_mib": round(peak_mib, 1),
        "peak_reserved_mib": round(peak_reserved_mib, 1),
        "probe_loss_before": round(w.probe_before, 5),
        "probe_loss_after_warmup": round(probe_after, 5),
        "loss_fell": loss_fell,
        "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE",
                                               "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                               "NCCL_ALGO", "NCCL_PROTO")},
    })
    del w
    return row


def worker(rank, world, port, args, result_path):
    """One rank: runs every (model, precision, mode) in turn; rank 0 appends the rows, one JSON
    line each, to result_path."""
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "NCCL_NVLS_ENABLE": "0"})
    if "graph" in args.modes:  # the recipe's step (1), before init_process_group
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
    import_torch()
    torch.cuda.set_device(rank)
    torch_ref.set_tf32(False)
    # torch_ref.Workload draws its data through torch_ref.make_text_data: per-rank windows here
    # (this process's own module, so the swap touches nothing outside this rank).
    torch_ref.make_text_data = functools.partial(rank_text_data, rank=rank)
    wl_args = argparse.Namespace(seed=args.seed, clip=None, data=args.data, dropout=0.0,
                                 attention="sdpa", accum=1)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    out = open(result_path, "a") if rank == 0 else None
    try:
        for name in args.models:
            for precision in args.precisions:
                for mode in args.modes:
                    row, err = None, None
                    try:
                        row = run_one(name, mode, precision, args, wl_args, rank, world)
                    except Exception as e:
                        print(f"{PROG}: rank {rank}: {name} {precision} {mode} gpus {world} "
                              "failed:", file=sys.stderr)
                        traceback.print_exc()
                        err = f"rank {rank}: {type(e).__name__}: {str(e)[:300]}"
                    try:
                        torch_ref.cleanup(mode)
                    except Exception as e:
                        err = err or f"rank {rank}: cleanup: {type(e).__name__}: {str(e)[:200]}"
                    all_ok = agree(err is None)  # raises if NCCL is broken: the launcher reports
                    if rank == 0:
                        if err is not None or not all_ok:
                            row = base_row(name, precision, mode, world)
                            row["error"] = err or "failed on another rank (see its stderr)"
                            row["torch_version"] = torch.__version__
                        out.write(json.dumps(row) + "\n")
                        out.flush()
    finally:
        if out is not None:
            out.close()
        try:
            if dist.is_initialized():
                torch.cuda.synchronize()
                dist.destroy_process_group()
        except Exception as e:  # teardown trouble must not hide the rows already written
            print(f"{PROG}: rank {rank}: destroy_process_group: {type(e).__name__}: {e}",
                  file=sys.stderr)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(world, args, emit):
    """Spawns world ranks, relays rank 0's rows through emit as they appear, and gives an error
    row for every combination that got none (crash, timeout)."""
    import torch.multiprocessing as mp
    fd, path = tempfile.mkstemp(prefix="torch_ddp_", suffix=".jsonl")
    os.close(fd)
    expected = [(n, p, m) for n in args.models for p in args.precisions for m in args.modes]
    seen, pos, failure = set(), 0, None

    def relay():
        nonlocal pos
        with open(path) as f:
            f.seek(pos)
            while True:
                line = f.readline()
                if not line.endswith("\n"):
                    break
                pos = f.tell()
                row = json.loads(line)
                seen.add((row["model"], row["precision"], row["mode"]))
                emit(row)

    try:
        ctx = mp.start_processes(worker, args=(world, free_port(), args, path), nprocs=world,
                                 join=False, start_method="spawn")
        deadline = time.monotonic() + args.timeout
        while True:
            try:
                done = ctx.join(timeout=2)
            except Exception as e:  # a rank exited non-zero; the others have been stopped
                failure = f"workers failed: {type(e).__name__}: {str(e).strip()[-400:]}"
                break
            relay()
            if done:
                break
            if time.monotonic() > deadline:
                failure = f"timed out after {args.timeout} s (--timeout); workers stopped"
                for p in ctx.processes:
                    if p.is_alive():
                        p.terminate()
                for p in ctx.processes:
                    p.join(10)
                    if p.is_alive():
                        p.kill()
                        p.join()
                break
        relay()
    except Exception as e:
        failure = failure or f"launch failed: {type(e).__name__}: {str(e)[:300]}"
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)
    for n, p, m in expected:
        if (n, p, m) not in seen:
            row = base_row(n, p, m, world)
            row["error"] = failure or "no result from rank 0"
            row["torch_version"] = torch.__version__
            emit(row)


def print_table(rows):
    head = (f"{'model':<18} {'prec':<5} {'mode':<6} {'gpus':>4} {'ms/step':>9} {'tokens/s':>11} "
            f"{'max rank ms':>11} {'loss':>15}")
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<18} {r['precision']:<5} {r['mode']:<6} {r['gpus']:>4} "
                  f"ERROR: {r['error']}")
            continue
        loss = f"{r['loss_first']:.3f}->{r['loss_after_warmup']:.3f}"
        print(f"{r['model']:<18} {r['precision']:<5} {r['mode']:<6} {r['gpus']:>4} "
              f"{r['ms_per_step']:>9.4f} {r['tokens_per_s']:>11.0f} "
              f"{r['ms_per_step_max_rank']:>11.4f} {loss:>15}")
    good = [r for r in rows if "error" not in r]
    if good:
        r = good[0]
        print(f"device: {r['device']}; torch {r['torch_version']}; NCCL {r['nccl_version']}; "
              f"Adam {r['adam_impl']}; TF32 {r['tf32']}; per-GPU batch, tokens/s global")


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter, description=__doc__)
    ap.add_argument("--model", action="append", required=True,
                    help="gpt-WIDTH-DEPTH-BATCH-SEQ, BATCH per GPU (repeat or comma list)")
    ap.add_argument("--gpus", action="append", default=None,
                    help="processes/GPUs per run, e.g. 1,2 (repeat or comma list; default 1)")
    ap.add_argument("--mode", action="append", default=None,
                    help="eager or graph (repeat or comma list; default eager)")
    ap.add_argument("--precision", action="append", default=None,
                    help="fp32 or bf16 (repeat or comma list; default fp32)")
    ap.add_argument("--steps", type=int, default=50, help="timed steps per block (default 50)")
    ap.add_argument("--repeats", type=int, default=3, help="timed blocks (default 3)")
    ap.add_argument("--warmup", type=int, default=15,
                    help="untimed steps after the first, before timing (default 15)")
    ap.add_argument("--data", default=None,
                    help="text file to train on (default: as torch_ref.py)")
    ap.add_argument("--seed", type=int, default=1234,
                    help="model init seed; data windows use seed + 1 + rank (default 1234)")
    ap.add_argument("--timeout", type=int, default=300,
                    help="seconds one --gpus value may take in all before its workers are "
                         "stopped (also the process group's timeout; default 300)")
    ap.add_argument("--json", action="store_true", help="one JSON object per line on stdout")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.repeats < 1 or args.warmup < 0 or args.timeout < 1:
        ap.error("--steps, --repeats and --timeout must be >= 1; --warmup >= 0")
    if args.data is not None and not os.path.isfile(args.data):
        ap.error(f"--data {args.data}: no such file")
    args.models = torch_ref.split_list(args.model)
    for m in args.models:
        try:
            spec = torch_ref.parse_model(m)
        except ValueError as e:
            ap.error(str(e))
        if spec.kind != "gpt":
            ap.error(f"model '{m}': only gpt-WIDTH-DEPTH-BATCH-SEQ models are supported here")
    args.modes = torch_ref.split_list(args.mode or ["eager"])
    args.precisions = torch_ref.split_list(args.precision or ["fp32"])
    for values, allowed, what in ((args.modes, MODES, "mode"),
                                  (args.precisions, torch_ref.PRECISIONS, "precision")):
        for v in values:
            if v not in allowed:
                ap.error(f"unknown {what} '{v}' (one of {', '.join(allowed)})")
    gpus = []
    for g in torch_ref.split_list(args.gpus or ["1"]):
        if not g.isdigit() or int(g) < 1:
            ap.error(f"--gpus {g}: expected a positive integer")
        if int(g) not in gpus:
            gpus.append(int(g))

    try:
        import_torch()
    except ImportError as e:
        print(f"{PROG}: PyTorch is not installed: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"{PROG}: no CUDA device visible to PyTorch; the reference needs GPUs",
              file=sys.stderr)
        return 2
    if not dist.is_available() or not dist.is_nccl_available():
        print(f"{PROG}: this PyTorch has no NCCL backend (torch.distributed)", file=sys.stderr)
        return 2
    visible = torch.cuda.device_count()
    if max(gpus) > visible:
        print(f"{PROG}: --gpus asks for {max(gpus)} GPUs but only {visible} "
              f"{'is' if visible == 1 else 'are'} visible (CUDA_VISIBLE_DEVICES="
              f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})", file=sys.stderr)
        return 2
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast off, inherited by the workers

    rows = []

    def emit(row):
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)

    for world in gpus:
        run_world(world, args, emit)
    if not args.json:
        print_table(rows)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
