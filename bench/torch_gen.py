#!/usr/bin/env python3
"""bench/torch_gen.py: the PyTorch reference for stepgraph's generation (issue 14), run on the
GPU machine in the same run as `stepgraph sample --repeat N --json` (only ratios measured in one
run count). Needs PyTorch with CUDA; no network.

    python3 bench/torch_gen.py --model gpt-768-12-8-256 --precision bf16 --batch 1,8,64 \
        --prompt-len 16 --max-new 200 --mode eager,graph,compile --json
    python3 bench/torch_gen.py --model gpt-128-2-2-32 --checkpoint ck.safetensors \
        --prompt-ids "72 101" --max-new 20 --check

The model is stepgraph's gpt kind (src/models/gpt.c): token + learnt position embedding,
pre-LayerNorm GPT-2 blocks (qkv Linear, causal attention with heads = C / 64, proj; LN, fc,
GELU-tanh, proj; each added to the residual), ln_f, a bias-free head; LayerNorm eps 1e-5. Weights
from a stepgraph checkpoint (safetensors, names as stepgraph's: wte.weight, wpe.weight,
blocks.L.ln1.weight, ..., head.weight), or N(0, 0.02) with --checkpoint absent.

Generation with a static KV cache, as HF's StaticCache and gpt-fast do: caches (L, B, H, T, hs)
allocated once; the prefill runs the prompts (all of --prompt-len tokens) and writes the cache
with index_copy_; a decode step feeds one token per sequence at its position, writes its k and v
with index_copy_ and attends over the cache with F.scaled_dot_product_attention and a mask of
the valid positions; greedy (argmax) on the device. Modes: eager; graph: the decode step
captured once with torch.cuda.graph (static token and position tensors) and replayed per token,
the prefill eager; compile: torch.compile(decode_step, mode="reduce-overhead") with every weight,
cache and state tensor marked static (torch._dynamo.mark_static_address). The host loop
reads nothing back per token (a fixed --max-new, as stepgraph's loop runs to max_new for greedy
without stop tokens), so host time per token is PyTorch's launch cost.

Precision: fp32 with TF32 off, or bf16 (weights and cache bf16, as inference runs).
Timing: --repeat runs after warm-up, medians. prefill_ms: prefill and the first token;
per_token_ms: (full generation - prefill) / (max_new - 1); host_us_per_token: host time of the
decode loop (before the final synchronize) / (max_new - 1).

--check (fp32, eager): greedy tokens with the cache and by full recompute (no cache), and each
step's top-2 logit gap, as one JSON object, for tests comparing stepgraph's tokens.
"""
import argparse
import json
import struct
import sys
import time

import torch
import torch.nn.functional as F


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":  # the optimizer's and the generator's state: not weights
            continue
        a, b = info["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(info["shape"])
    return out


def parse_model(name):
    kind, C, L, B, T = name.split("-")
    assert kind == "gpt", name
    return int(C), int(L), int(T)


class GPT:
    def __init__(self, C, L, T, V, H, weights, dtype, device):
        self.C, self.L, self.T, self.V, self.H, self.hs = C, L, T, V, H, C // H
        g = torch.Generator().manual_seed(1)

        def w(name, *shape, init="normal"):
            if weights is not None:
                t = weights[name]
            elif init == "normal":
                t = torch.randn(*shape, generator=g) * 0.02
            elif init == "ones":
                t = torch.ones(*shape)
            else:
                t = torch.zeros(*shape)
            return t.to(device=device, dtype=dtype)

        self.wte, self.wpe = w("wte.weight", V, C), w("wpe.weight", T, C)
        self.blocks = []
        for l in range(L):
            p = f"blocks.{l}."
            self.blocks.append(dict(
                ln1w=w(p + "ln1.weight", C, init="ones"), ln1b=w(p + "ln1.bias", C, init="zeros"),
                qkvw=w(p + "attn.qkv.weight", 3 * C, C), qkvb=w(p + "attn.qkv.bias", 3 * C, init="zeros"),
                projw=w(p + "attn.proj.weight", C, C), projb=w(p + "attn.proj.bias", C, init="zeros"),
                ln2w=w(p + "ln2.weight", C, init="ones"), ln2b=w(p + "ln2.bias", C, init="zeros"),
                fcw=w(p + "mlp.fc.weight", 4 * C, C), fcb=w(p + "mlp.fc.bias", 4 * C, init="zeros"),
                mpw=w(p + "mlp.proj.weight", C, 4 * C), mpb=w(p + "mlp.proj.bias", C, init="zeros")))
        self.lnfw, self.lnfb = w("ln_f.weight", C, init="ones"), w("ln_f.bias", C, init="zeros")
        self.head = w("head.weight", V, C)

    def alloc_cache(self, B, dtype, device):
        self.k = torch.zeros(self.L, B, self.H, self.T, self.hs, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

    def forward(self, tok, pos, mask):
        """tok, pos (B, S) int64; mask (B, 1, S, T) bool: which cache positions each row sees.
        Writes k, v at pos into the cache; returns the logits of the last row (B, V)."""
        B, S = tok.shape
        x = self.wte[tok] + self.wpe[pos]
        idx = pos[0]  # every sequence at the same positions (prompts of one length)
        for l, b in enumerate(self.blocks):
            h = F.layer_norm(x, (self.C,), b["ln1w"], b["ln1b"], 1e-5)
            q, k, v = F.linear(h, b["qkvw"], b["qkvb"]).split(self.C, dim=2)
            q = q.view(B, S, self.H, self.hs).transpose(1, 2)
            k = k.view(B, S, self.H, self.hs).transpose(1, 2)
            v = v.view(B, S, self.H, self.hs).transpose(1, 2)
            self.k[l].index_copy_(2, idx, k)
            self.v[l].index_copy_(2, idx, v)
            a = F.scaled_dot_product_attention(q, self.k[l], self.v[l], attn_mask=mask)
            x = x + F.linear(a.transpose(1, 2).reshape(B, S, self.C), b["projw"], b["projb"])
            h = F.layer_norm(x, (self.C,), b["ln2w"], b["ln2b"], 1e-5)
            x = x + F.linear(F.gelu(F.linear(h, b["fcw"], b["fcb"]), approximate="tanh"), b["mpw"], b["mpb"])
        x = F.layer_norm(x[:, -1], (self.C,), self.lnfw, self.lnfb, 1e-5)
        return F.linear(x, self.head)

    def full(self, tok):
        """No cache: the logits after every prefix of tok (B, S) -> (B, S, V)."""
        B, S = tok.shape
        x = self.wte[tok] + self.wpe[torch.arange(S, device=tok.device)]
        for b in self.blocks:
            h = F.layer_norm(x, (self.C,), b["ln1w"], b["ln1b"], 1e-5)
            q, k, v = F.linear(h, b["qkvw"], b["qkvb"]).split(self.C, dim=2)
            q, k, v = (t.view(B, S, self.H, self.hs).transpose(1, 2) for t in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + F.linear(a.transpose(1, 2).reshape(B, S, self.C), b["projw"], b["projb"])
            h = F.layer_norm(x, (self.C,), b["ln2w"], b["ln2b"], 1e-5)
            x = x + F.linear(F.gelu(F.linear(h, b["fcw"], b["fcb"]), approximate="tanh"), b["mpw"], b["mpb"])
        return F.linear(F.layer_norm(x, (self.C,), self.lnfw, self.lnfb, 1e-5), self.head)


class Generator:
    """Static buffers for one batch size: the decode step reads tok_s, pos_s, mask_s and writes
    next_s, so torch.cuda.graph and compile can capture it."""

    def __init__(self, m, B, device):
        self.m, self.B = m, B
        self.tok_s = torch.zeros(B, 1, dtype=torch.long, device=device)
        self.pos_s = torch.zeros(B, 1, dtype=torch.long, device=device)
        self.mask_s = torch.zeros(B, 1, 1, m.T, dtype=torch.bool, device=device)
        self.ar = torch.arange(m.T, device=device)

    def step(self):
        logits = self.m.forward(self.tok_s, self.pos_s, self.mask_s)
        nxt = logits.argmax(-1, keepdim=True)
        self.tok_s.copy_(nxt)
        self.pos_s.add_(1)
        self.mask_s.copy_((self.ar <= self.pos_s[:, :, None]).unsqueeze(1))
        return nxt

    def prefill(self, prompts):
        B, P = prompts.shape
        pos = torch.arange(P, device=prompts.device).expand(B, P)
        mask = (self.ar[None, :] <= torch.arange(P, device=prompts.device)[:, None]).expand(B, 1, P, self.m.T)
        logits = self.m.forward(prompts, pos, mask)
        nxt = logits.argmax(-1, keepdim=True)
        self.tok_s.copy_(nxt)
        self.pos_s.fill_(P)
        self.mask_s.copy_((self.ar <= self.pos_s[:, :, None]).unsqueeze(1))
        return nxt


def run(gen, prompts, max_new, step_fn, out):
    """A generation; returns the host seconds of the decode loop."""
    out[:, 0:1] = gen.prefill(prompts)
    t0 = time.perf_counter()
    for i in range(1, max_new):
        out[:, i:i + 1] = step_fn()
    return time.perf_counter() - t0


def bench(args, m, B, mode, device):
    torch.manual_seed(0)
    P = args.prompt_len
    text = b"It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness, "
    prompts = torch.tensor([[text[(7 * i + j) % len(text)] for j in range(P)] for i in range(B)], device=device)
    m.alloc_cache(B, m.wte.dtype, device)
    gen = Generator(m, B, device)
    step_fn, compile_mode = gen.step, None
    out = torch.zeros(B, args.max_new, dtype=torch.long, device=device)
    with torch.no_grad():
        if mode == "graph":
            gen.prefill(prompts)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    gen.step()
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            static = {}
            with torch.cuda.graph(graph):
                static["nxt"] = gen.step()

            def step_fn():
                graph.replay()
                return static["nxt"]
        elif mode == "compile":
            compile_mode = "reduce-overhead"
            # Weights, caches and the step's state at static addresses, so that its CUDA graphs
            # may mutate them (unmarked, inductor skipped cudagraphs for "mutated inputs").
            for t in [m.wte, m.wpe, m.lnfw, m.lnfb, m.head, m.k, m.v, gen.tok_s, gen.pos_s, gen.mask_s, gen.ar] + \
                    [t for b in m.blocks for t in b.values()]:
                torch._dynamo.mark_static_address(t)
            step_fn = torch.compile(gen.step, mode="reduce-overhead")
        for _ in range(3):  # warm-up (compile's recompilations and graph records happen here)
            run(gen, prompts, args.max_new, step_fn, out)
        torch.cuda.synchronize()
        walls, hosts, pre = [], [], []
        for _ in range(args.repeat):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            gen.prefill(prompts)
            torch.cuda.synchronize()
            pre.append(time.perf_counter() - t0)
        torch.cuda.reset_peak_memory_stats()
        for _ in range(args.repeat):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            hosts.append(run(gen, prompts, args.max_new, step_fn, out))
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t0)
    med = lambda v: sorted(v)[len(v) // 2]
    total, prefill = med(walls) * 1e3, med(pre) * 1e3
    return dict(impl="pytorch", model=args.model, precision=args.precision, mode=mode, compile_mode=compile_mode,
                batch=B, prompt_len=P, max_new=args.max_new, prefill_ms=prefill,
                per_token_ms=(total - prefill) / (args.max_new - 1), total_ms=total,
                tokens_per_s=B * args.max_new / (total / 1e3),
                host_us_per_token=med(hosts) * 1e6 / (args.max_new - 1),
                peak_mib=torch.cuda.max_memory_allocated() / 2**20, device=torch.cuda.get_device_name(),
                torch=torch.__version__, tokens=out[0, :16].tolist())


def check(args, m, device):
    ids = [int(t) for t in args.prompt_ids.replace(",", " ").split()]
    with torch.no_grad():
        prompts = torch.tensor([ids], device=device)
        m.alloc_cache(1, m.wte.dtype, device)
        gen = Generator(m, 1, device)
        toks = [gen.prefill(prompts).item()]
        for _ in range(1, args.max_new):
            toks.append(gen.step().item())
        ctx, rec, gaps, tops = list(ids), [], [], []
        for _ in range(args.max_new):
            l = m.full(torch.tensor([ctx], device=device))[0, -1].double()
            top = torch.topk(l, 2).values
            gaps.append((top[0] - top[1]).item())
            tops.append(top[0].item())
            rec.append(int(l.argmax()))
            ctx.append(rec[-1])
    print(json.dumps(dict(tokens=toks, recompute_tokens=rec, gaps=gaps, top=tops)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--checkpoint")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--max-new", type=int, default=200)
    ap.add_argument("--mode", default="eager,graph,compile")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--prompt-ids", default="10")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    C, L, T = parse_model(args.model)
    weights = load_safetensors(args.checkpoint) if args.checkpoint else None
    dtype = torch.bfloat16 if args.precision == "bf16" and not args.check else torch.float32
    m = GPT(C, L, T, args.vocab, C // 64, weights, dtype, args.device)
    if args.check:
        return check(args, m, args.device)
    for mode in args.mode.split(","):
        for B in [int(b) for b in args.batch.split(",")]:
            r = bench(args, m, B, mode, args.device)
            if args.json:
                print(json.dumps(r), flush=True)
            else:
                print(f"{r['model']} {r['precision']} {mode} batch {B}: prefill {r['prefill_ms']:.3f} ms, "
                      f"{r['per_token_ms']:.4f} ms/token, {r['tokens_per_s']:.0f} tok/s, "
                      f"host {r['host_us_per_token']:.1f} us/token", flush=True)


if __name__ == "__main__":
    sys.exit(main())
