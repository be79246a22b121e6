#!/usr/bin/env python3
"""bench/torch_attn.py: PyTorch's fused causal attention alone, per backend, on the shapes of
stepgraph's GPT layers: what the fused attention kernels of src/ops/attention_fused_cuda.cu are
measured against (bench/RESULTS.md, session 40). Run on the GPU machine; needs PyTorch with CUDA.

    python3 bench/torch_attn.py                         # gpt-768-12-8-256's and gpt-256-4-8-128's layers
    python3 bench/torch_attn.py --shape 8,12,256,64 --backend cudnn,flash --calls 100

For each shape B,HEADS,T,HEAD_SIZE and each backend (torch.nn.attention.SDPBackend: flash,
cudnn, efficient, math), q, k, v (B, HEADS, T, HEAD_SIZE) bf16 drawn from torch.randn (fresh
each run; --seed repeats one) and dout likewise; F.scaled_dot_product_attention(q, k, v,
is_causal=True) under sdpa_kernel([backend]) alone, --calls calls captured in one
torch.cuda.graph (after 3 warm-up calls on a side stream), replayed --repeats times: the best
replay's time divided by --calls, in us a call, for the forward alone (no_grad) and for the
forward and backward together (o.backward(dout), the gradients set to None between calls: each
call's backward writes fresh ones from the graph's pool); their difference is the backward's.
A backend that refuses the shape prints why instead of times. stepgraph's own kernels are timed
inside its step (`stepgraph trace` and scripts/kernel_times.py), not here."""
import argparse
import sys


def parse_shapes(texts):
    shapes = []
    for text in texts:
        for part in text.split(";"):
            try:
                dims = tuple(int(v) for v in part.split(","))
            except ValueError:
                dims = ()
            if len(dims) != 4 or min(dims) < 1:
                sys.exit(f"torch_attn.py: --shape '{part}': expected B,HEADS,T,HEAD_SIZE, four positive integers")
            shapes.append(dims)
    return shapes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", default=[],
                    help="B,HEADS,T,HEAD_SIZE (repeat, or ';' between; default 8,12,256,64 and 8,4,128,64)")
    ap.add_argument("--backend", default="flash,cudnn,efficient",
                    help="comma list of flash, cudnn, efficient, math (default flash,cudnn,efficient)")
    ap.add_argument("--calls", type=int, default=50, help="calls captured in one graph (default 50)")
    ap.add_argument("--repeats", type=int, default=5, help="replays of the graph, the best kept (default 5)")
    ap.add_argument("--seed", type=int, default=None, help="torch.manual_seed (default: fresh)")
    a = ap.parse_args()
    shapes = parse_shapes(a.shape) if a.shape else [(8, 12, 256, 64), (8, 4, 128, 64)]
    if a.calls < 1 or a.repeats < 1:
        sys.exit("torch_attn.py: --calls and --repeats must be at least 1")
    known = ("flash", "cudnn", "efficient", "math")
    backends = a.backend.split(",")
    for name in backends:
        if name not in known:
            sys.exit(f"torch_attn.py: --backend '{name}': expected one of {', '.join(known)}")

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    if not torch.cuda.is_available():
        sys.exit("torch_attn.py: no CUDA device visible to PyTorch")
    seed = a.seed if a.seed is not None else torch.seed() % (2**31)
    torch.manual_seed(seed)
    print(f"torch_attn.py: seed {seed}; torch {torch.__version__}; {torch.cuda.get_device_name()}; "
          f"{a.calls} calls a graph, best of {a.repeats} replays")

    def best_us(fn):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(a.calls):
                fn()
        best = float("inf")
        for _ in range(a.repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            best = min(best, start.elapsed_time(end) * 1000.0 / a.calls)
        return best

    print(f"{'shape B,heads,T,hs':>20} {'backend':>10} {'fwd us':>9} {'fwd+bwd us':>11} {'bwd us':>9}")
    for shape in shapes:
        q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        dout = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)

        def fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def fwd_bwd():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            o.backward(dout)
            q.grad = k.grad = v.grad = None

        label = ",".join(str(d) for d in shape)
        for name in backends:
            try:
                with sdpa_kernel([names[name]]):
                    tf, tb = best_us(fwd), best_us(fwd_bwd)
                print(f"{label:>20} {name:>10} {tf:9.2f} {tb:11.2f} {tb - tf:9.2f}")
            except Exception as e:  # a backend refusing the shape or the dtype (RuntimeError, usually)
                print(f"{label:>20} {name:>10} refused: {str(e).splitlines()[0][:100]}")


if __name__ == "__main__":
    main()
