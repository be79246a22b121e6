#!/usr/bin/env python3
"""bench/torch_ref.py: the PyTorch reference for stepgraph's canonical MLP and GPT workloads.

Run on the GPU machine in the same run as `stepgraph bench` (only ratios measured in one run
count, see shared/DESIGN.md). Needs PyTorch with CUDA; no network.

    python3 bench/torch_ref.py --model mlp-512-6-32,mlp-2048-6-256 --mode eager --json
    python3 bench/torch_ref.py --model gpt-256-4-8-128 --mode eager,graph --precision bf16 --json

Model mlp-WIDTH-DEPTH-BATCH: input dim WIDTH; DEPTH blocks Linear(WIDTH, WIDTH) + ReLU (the
first takes the input); a Linear(WIDTH, 10) head; cross-entropy loss; torch.optim.Adam (lr 1e-3,
default betas and eps, no weight decay, the implementation PyTorch picks by default: foreach on
CUDA, reported as adam_impl); fp32 with TF32 off (--tf32: on for matmuls). Data: 64 batches
generated on the device once (inputs N(0,1), labels the argmax of a fixed random linear
teacher, as stepgraph's data.c), and step i uses batch i % 64, so a step copies nothing from
the host.

Model gpt-WIDTH-DEPTH-BATCH-SEQ (C, L, B, T), as stepgraph's src/models/gpt.c: a decoder-only
transformer over bytes (vocabulary 256; with --vocab N over a token file's tokens, N rows in the
embedding and the head), heads H = C / 64 (C must be a multiple of 64). Children,
in order (so graphed_layers graphs each one):
  embedding   int64 tokens (B, T) -> x = wte[tokens] + wpe (B, T, C); wte (256, C), wpe (T, C),
              both N(0, 0.02); dropout --dropout (default 0: no dropout op at all)
  block x L   pre-LayerNorm: h = LN1(x); q, k, v = Linear(C, 3C)(h).split(C); causal multi-head
              attention, by default F.scaled_dot_product_attention(is_causal=True), as PyTorch
              users write it; with --attention math the explicit math instead (q @ k^T * 1/8,
              masked_fill of s > t with -inf, softmax, @ v: the steps of stepgraph's unfused
              op); x = x + dropout(Linear(C,
              C)(attn)); x = x + dropout(Linear(4C, C)(GELU-tanh(Linear(C, 4C)(LN2(x)))))
  ln_f        LayerNorm(C)
  head        Linear(C, 256, bias=False), not tied to wte
LayerNorms: eps 1e-5, weight 1, bias 0. Linear weights N(0, 0.02), biases 0. Loss: cross-entropy
of the logits (B*T, 256) against the next byte (B*T). torch.optim.Adam (lr 3e-4, otherwise as
for the MLP). Data: the bytes of a text file (with --vocab: the tokens of a token file, nanoGPT's
raw uint16 or an llm.c shard, as stepgraph reads them; bench/make_tokens.py writes one) (--data; default the first that exists of
/usr/share/common-licenses/GPL-3, GPL-2, Apache-2.0 and /usr/share/dict/words, as stepgraph's
text.c, else a deterministic pseudo-random 100 KiB byte string from a seeded torch Generator,
reported as "data": "synthetic"), its first 90% (n - floor(0.1 n) bytes) as training data; 64 batches of random windows (B, T+1) drawn once on the device (tokens =
window[:, :T], targets = window[:, 1:]); step i uses batch i % 64.

Options for both kinds: --clip X applies torch.nn.utils.clip_grad_norm_(params, X) (foreach,
capturable) between backward and the optimizer step, in every mode (default: no clipping).
--precision fp32|bf16 (default fp32; bf16 for gpt models only): bf16 runs the forward and the loss
under torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False) with fp32 master weights,
fp32 gradients and fp32 Adam; in the graph mode the autocast region lies inside the captured
region. (make_graphed_callables requires the autocast cache off; every mode runs with it off so
that all modes do the same work: each weight is cast once per forward, so the cache would save
no cast.) TF32 stays off in both precisions unless --tf32 (matmuls only).

Variable sequence length (gpt models, --accum 1, modes eager, graph and compile), as
`stepgraph bench --seq-lens 32,64,128 --vary-seq`: --seq-lens L gives increasing bucket lengths
(the largest at most the model's T) and --vary-seq draws step i's length from 1..the largest,
exactly as stepgraph's sg_text_vary_len (vary_len below: splitmix64 of i, 1 + z % max). Every
step draws by its global index: the first step is 0, the warm-up continues the count, then the
timed and the profiled steps. Step i runs at Tb, the smallest bucket >= its length len: tokens
and targets (B, Tb), the first len positions of batch i % 64's windows (a window of len + 1
bytes), then padding (token 0, target -1, the cross-entropy's ignore_index, so the loss is the
mean over the B * len real positions). Attention is causal and the padding comes last, so the
real positions compute what a length-len sequence computes. The embedding adds wpe[:Tb] and the
math attention masks with future[:Tb, :Tb] (without --vary-seq the full T: the same ops as
before). The probe loss reads the batches' first (largest bucket) positions. Per mode:
  eager     the padded (B, Tb) batch is built (a clone and, when len < Tb, a fill per tensor)
            and the step runs as usual
  graph     one torch.cuda.graph per bucket, all in one memory pool (graph_pool_handle()), each
            with its own static (B, Tb) tokens and targets and the capturable Adam inside, as
            the one-shape graph mode; 3 warm-up steps per bucket on a side stream first (at
            the bucket's full length, batch 0). A step copies its batch into its bucket's
            static tensors (and fills the padding) and replays that bucket's graph
  compile   torch.compile(mode="reduce-overhead", dynamic=False): one specialization and one
            CUDA graph (tree) per bucket. Before step 0 every bucket runs 3 steps (batch 0, full
            bucket length: compile, cudagraph-tree warm-up, recording), so no compilation or
            recording falls into the timed steps. Dynamo's recompile limit is raised to the
            bucket count if it is lower
JSON rows of gpt models add vary_seq, seq_lens (null without --seq-lens), tokens_per_step (the
real tokens of an optimizer step: accum * B * T; with --vary-seq B * len averaged over the
timed steps, as stepgraph bench) and tokens_per_s (tokens_per_step / ms_per_step); graph mode
with --vary-seq adds graphs (one per bucket) and capture_ms (capture and instantiation of all
of them, the warm-up excluded).

Modes:
  eager               zero_grad(set_to_none=True), forward, loss, backward, [clip,] step
  graph               the whole step captured with torch.cuda.graph (Adam capturable=True);
                      each step copies its batch into the static inputs, then replays
  graphed_callables   torch.cuda.make_graphed_callables on the whole model (forward and
                      backward graphs); loss and optimizer stay eager
  graphed_layers      make_graphed_callables on each child: MLP blocks (Linear+ReLU) and head;
                      GPT embedding (its sample input: integer tokens), blocks, ln_f, head
  compile             torch.compile(model, mode="reduce-overhead") (model only; loss and
                      optimizer stay eager)
  compile_opt         compile, and the optimizer's step (clipping included) compiled too, as
                      PyTorch's tutorial on compiling the optimizer does (torch.compile of a
                      function that calls opt.step(); the learning rate stays constant, so a
                      float recompiles nothing): Adam as a few fused kernels instead of the foreach
                      loop's launches, which left compile host-bound on gpt-768-12-8-256
  graph_compile       the graph mode's whole-step torch.cuda.graph around compiled code:
                      torch.compile(model) in its default mode (Inductor's fused kernels, no
                      CUDA graphs of its own) and the compiled optimizer step (clipping and
                      Adam capturable=True), both compiled by the side-stream warm-up; no host
                      work a step but the batch copies and one replay

Measured per model, precision and mode, after validating that the loss is finite and falls over
the warm-up (mean loss on batches 0-3, before training and after the warm-up, computed in fp32
without autograd and without dropout from the original modules, which graphs and compiled code
update in place):
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
import collections
import contextlib
import gc
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback

NUM_CLASSES = 10
NUM_BATCHES = 64
MODES = ("eager", "graph", "graphed_callables", "graphed_layers", "compile", "compile_opt",
         "graph_compile")
PRECISIONS = ("fp32", "bf16")
GPT_VOCAB = 256  # --vocab N sets it: --data is then a token file
GPT_HEAD_DIM = 64
# stepgraph's default texts (src/models/text.c), in its order.
GPT_TEXTS = ("/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/GPL-2",
             "/usr/share/common-licenses/Apache-2.0", "/usr/share/dict/words")
GPT_VAL_FRACTION = 0.1  # as text.c: validation = floor(0.1 n) last bytes, training the rest
SYNTHETIC_BYTES = 100 * 1024
LLMC_MAGIC, LLMC_HEADER_BYTES = 20240520, 1024
LR = {"mlp": 1e-3, "gpt": 3e-4}
# --vary-seq: the modes that run steps of several shapes, the padding's target (the
# cross-entropy's ignore_index; PyTorch's default, -100, stays without --vary-seq) and token,
# and stepgraph's limits on --seq-lens (sg_cli_buckets: at most 32 sizes of 1..2^20).
VARY_SEQ_MODES = ("eager", "graph", "compile")
PAD_TARGET, PAD_TOKEN = -1, 0
MAX_SEQ_BUCKETS, MAX_SEQ_LEN = 32, 1 << 20
VARY_WARMUP_PER_BUCKET = 3  # graph: the side-stream recipe's 3; compile: warm-up, record, replay
MASK64 = 0xFFFFFFFFFFFFFFFF

TOKEN_FILE = False  # --vocab given: --data holds tokens, not bytes
torch = None  # imported in main(), so that --help works without PyTorch
nn = None
F = None


ModelSpec = collections.namedtuple("ModelSpec", "kind width depth batch seq")


def parse_model(name):
    """'mlp-512-6-32' -> ModelSpec('mlp', 512, 6, 32, None);
    'gpt-256-4-8-128' -> ModelSpec('gpt', 256, 4, 8, 128)."""
    parts = name.split("-")
    nums = {"mlp": 3, "gpt": 4}.get(parts[0])
    if (nums is None or len(parts) != 1 + nums
            or not all(p.isdigit() for p in parts[1:])):
        raise ValueError(f"model '{name}': expected mlp-WIDTH-DEPTH-BATCH (e.g. mlp-512-6-32) "
                         "or gpt-WIDTH-DEPTH-BATCH-SEQ (e.g. gpt-256-4-8-128)")
    values = [int(p) for p in parts[1:]]
    if any(v <= 0 for v in values):
        what = "width, depth, batch and seq" if parts[0] == "gpt" else "width, depth and batch"
        raise ValueError(f"model '{name}': {what} must be positive")
    if parts[0] == "mlp":
        return ModelSpec("mlp", values[0], values[1], values[2], None)
    if values[0] % GPT_HEAD_DIM:
        raise ValueError(f"model '{name}': width {values[0]} is not a multiple of the head size "
                         f"{GPT_HEAD_DIM}")
    return ModelSpec("gpt", *values)


def vary_len(step, max_len):
    """Step `step`'s sequence length under --vary-seq, uniform over 1..max_len: stepgraph's
    sg_text_vary_len (src/nn/text.h), splitmix64 of the step in 64-bit unsigned arithmetic."""
    if max_len < 1:
        return 0
    z = (step * 0x9e3779b97f4a7c15 + 0x243f6a8885a308d3) & MASK64
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & MASK64
    z ^= z >> 31
    return 1 + z % max_len


def bucket_of(seq_lens, length):
    """The smallest bucket of seq_lens (increasing) that holds length (sg_text_bucket_of)."""
    return next((b for b in seq_lens if b >= length), seq_lens[-1])


def parse_seq_lens(text):
    """'32,64,128' -> [32, 64, 128]: increasing lengths of 1..2^20, at most 32 of them, as
    stepgraph's --seq-lens. Raises ValueError saying what is wrong."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or not 1 <= int(item) <= MAX_SEQ_LEN:
            raise ValueError(f"--seq-lens '{text}': '{item}' is not a length from 1 to "
                             f"{MAX_SEQ_LEN}")
        if out and int(item) <= out[-1]:
            raise ValueError(f"--seq-lens '{text}': expected increasing lengths")
        out.append(int(item))
    if len(out) > MAX_SEQ_BUCKETS:
        raise ValueError(f"--seq-lens '{text}': more than {MAX_SEQ_BUCKETS} lengths")
    return out


def vary_seq_problem(name, mode, accum, seq_lens):
    """Why --vary-seq cannot run model `name` in this mode, or None."""
    if not seq_lens:
        return "--vary-seq needs --seq-lens"
    spec = parse_model(name)
    if spec.kind != "gpt":
        return f"--vary-seq is for gpt models, not '{name}'"
    if mode not in VARY_SEQ_MODES:
        return (f"--vary-seq runs in modes {', '.join(VARY_SEQ_MODES)}, not {mode} (its graphs "
                "hold one input shape)")
    if accum != 1:
        return f"--accum {accum} does not combine with --vary-seq: a padded step is one batch"
    if seq_lens[-1] > spec.seq:
        return (f"--seq-lens: the largest length, {seq_lens[-1]}, exceeds the model's T "
                f"({spec.seq})")
    return None


def mean_real_tokens(batch, seq_lens, first, n):
    """Mean real tokens (batch * drawn length) of the steps first..first+n-1 under --vary-seq."""
    return batch * sum(vary_len(s, seq_lens[-1]) for s in range(first, first + n)) / n


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


def set_tf32(on):
    """TF32 off (or, with --tf32, on for matmuls, as stepgraph's STEPGRAPH_TF32=1; cuDNN's stays
    off, as stepgraph's convolutions) through the legacy flags only: from PyTorch 2.9 on, mixing
    them with the new fp32_precision API leaves a state that some readers (Inductor) refuse."""
    torch.backends.cuda.matmul.allow_tf32 = on
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


_GPT_MODULES = None


def gpt_modules():
    """The GPT's own module classes, defined once torch is imported (main() imports it)."""
    global _GPT_MODULES
    if _GPT_MODULES is None:
        _GPT_MODULES = _define_gpt_modules()
    return _GPT_MODULES


def _define_gpt_modules():
    class GPTEmbedding(nn.Module):
        """int64 tokens (B, Tb) -> x (B, Tb, C) = wte[tokens] + wpe[0..Tb-1], then dropout
        (Tb = T but under --vary-seq)."""

        def __init__(self, width, seq, dropout):
            super().__init__()
            self.wte = nn.Parameter(torch.empty(GPT_VOCAB, width))
            self.wpe = nn.Parameter(torch.empty(seq, width))
            self.p = dropout

        def forward(self, tokens):
            return self.run(tokens, self.p if self.training else 0.0)

        def run(self, tokens, p):
            # wpe (T, C) broadcast over the batch; a shorter step (--vary-seq) takes its first
            # rows. The full length adds wpe itself: a slice would add a backward op.
            Tb = tokens.shape[-1]
            wpe = self.wpe if Tb == self.wpe.shape[0] else self.wpe[:Tb]
            x = F.embedding(tokens, self.wte) + wpe
            return F.dropout(x, p) if p > 0 else x

    class GPTBlock(nn.Module):
        """x (B, T, C) -> x + drop(proj(attn(ln1(x)))) -> that + drop(mlp(ln2(that)))."""

        def __init__(self, width, seq, dropout, sdpa):
            super().__init__()
            self.heads = width // GPT_HEAD_DIM
            self.scale = 1.0 / math.sqrt(GPT_HEAD_DIM)
            self.p, self.sdpa = dropout, sdpa
            self.ln1 = nn.LayerNorm(width, eps=1e-5)
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)
            self.ln2 = nn.LayerNorm(width, eps=1e-5)
            self.fc = nn.Linear(width, 4 * width)
            self.mlp_proj = nn.Linear(4 * width, width)
            # True where s > t (the future): those scores become -inf before the softmax.
            self.register_buffer("future", torch.ones(seq, seq, dtype=torch.bool).triu(1),
                                 persistent=False)

        def forward(self, x):
            return self.run(x, self.p if self.training else 0.0)

        def attend(self, q, k, v):
            """q, k, v (B, H, Tb, 64) -> (B, H, Tb, 64), causal (Tb = T but under --vary-seq)."""
            if self.sdpa:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            Tb = q.shape[-2]
            future = self.future if Tb == self.future.shape[0] else self.future[:Tb, :Tb]
            s = torch.matmul(q, k.transpose(-2, -1)) * self.scale
            s = s.masked_fill(future, float("-inf"))
            return torch.matmul(F.softmax(s, dim=-1), v)

        def run(self, x, p):
            B, T, C = x.shape
            H, hs = self.heads, C // self.heads
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
            q, k, v = (t.view(B, T, H, hs).transpose(1, 2) for t in (q, k, v))
            y = self.attend(q, k, v).transpose(1, 2).contiguous().view(B, T, C)
            a = self.proj(y)
            if p > 0:
                a = F.dropout(a, p)
            x = x + a
            m = self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
            if p > 0:
                m = F.dropout(m, p)
            return x + m

    return collections.namedtuple("GPTModules", "Embedding Block")(GPTEmbedding, GPTBlock)


def build_gpt(width, depth, seq, dropout, sdpa):
    """Children [embedding, block x depth, ln_f, head], so graphed_layers can graph each one."""
    mods = gpt_modules()
    embedding = mods.Embedding(width, seq, dropout)
    blocks = [mods.Block(width, seq, dropout, sdpa) for _ in range(depth)]
    model = nn.Sequential(embedding, *blocks, nn.LayerNorm(width, eps=1e-5),
                          nn.Linear(width, GPT_VOCAB, bias=False))
    with torch.no_grad():
        nn.init.normal_(embedding.wte, mean=0.0, std=0.02)
        nn.init.normal_(embedding.wpe, mean=0.0, std=0.02)
        for m in model.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
    return model


def run_unwrapped(mod, x):
    """mod's own computation with dropout off. make_graphed_callables replaces the forward of
    the module instance; the class's functions stay the originals, so call those."""
    run = getattr(type(mod), "run", None)
    if run is not None:
        return run(mod, x, 0.0)
    return type(mod).forward(mod, x)


def load_text(path, seed):
    """(bytes as a uint8 CPU tensor, what the JSON row calls the data). path None: the first
    default text that exists, else synthetic bytes."""
    if path is None:
        path = next((t for t in GPT_TEXTS if os.path.isfile(t)), None)
    if path is not None:
        with open(path, "rb") as f:
            raw = f.read()
        if not raw:
            raise ValueError(f"{path}: empty file")
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone(), path
    # No text on this machine: skewed pseudo-random bytes (a random Zipf-like ranking of the 256
    # values), so that the loss can fall below ln 256 and the validation still means something.
    g = torch.Generator()
    g.manual_seed(seed)
    rank = torch.randperm(GPT_VOCAB, generator=g).double()
    probs = 1.0 / (rank + 1.0)
    data = torch.multinomial(probs, SYNTHETIC_BYTES, replacement=True, generator=g)
    return data.to(torch.uint8), "synthetic"


def load_tokens(path, vocab):
    """A token file as stepgraph's text.c reads it (docs/data.md): an llm.c shard (int32 magic
    20240520, version 1 (uint16) or 2 (uint32), token count, in a 1024-byte header) or
    nanoGPT's raw uint16. Returns (int64 CPU tensor, path); refuses a token >= vocab."""
    with open(path, "rb") as f:
        raw = f.read()
    head = torch.frombuffer(bytearray(raw[:12]), dtype=torch.int32) if len(raw) >= 12 else None
    if head is not None and int(head[0]) == LLMC_MAGIC:
        version, count = int(head[1]), int(head[2])
        width = {1: 2, 2: 4}.get(version)
        if width is None or len(raw) != LLMC_HEADER_BYTES + count * width:
            raise ValueError(f"{path}: a bad llm.c header (version {version}, {count} tokens, "
                             f"{len(raw)} bytes)")
        body, dtype = raw[LLMC_HEADER_BYTES:], torch.int16 if width == 2 else torch.int32
    else:
        if len(raw) % 2:
            raise ValueError(f"{path}: {len(raw)} bytes, odd: not raw uint16 tokens")
        body, dtype, width = raw, torch.int16, 2
    t = torch.frombuffer(bytearray(body), dtype=dtype).long()
    if width == 2:
        t &= 0xFFFF  # uint16 read as int16
    if t.numel() == 0:
        raise ValueError(f"{path}: no tokens")
    if int(t.max()) >= vocab:
        raise ValueError(f"{path}: token {int(t.max())} >= --vocab {vocab}")
    return t, path


def make_text_data(batch, seq, seed, path):
    """(64, B, T) int64 tokens and (64, B, T) int64 next-byte targets on the device, from random
    windows of the training part (the first 90%) of the text; and the data's name."""
    text, source = load_tokens(path, GPT_VOCAB) if TOKEN_FILE else load_text(path, seed)
    n_train = text.numel() - math.floor(GPT_VAL_FRACTION * text.numel())
    if n_train < seq + 1:
        raise ValueError(f"{source}: {n_train} training bytes, too few for windows of {seq + 1}")
    train = text[:n_train].cuda()
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    starts = torch.randint(0, n_train - seq, (NUM_BATCHES, batch), device="cuda", generator=g)
    windows = train[starts.unsqueeze(-1) + torch.arange(seq + 1, device="cuda")].long()
    tokens = windows[..., :seq].contiguous()
    targets = windows[..., 1:].contiguous()
    del train, starts, windows
    return tokens, targets, source


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
    """One model in one precision and mode: step(i) queues training step i and returns the loss
    tensor (no host sync)."""

    def __init__(self, name, mode, precision, args):
        spec = parse_model(name)
        if spec.kind == "mlp" and precision != "fp32":
            raise ValueError(f"{name}: precision {precision} is defined for gpt models only")
        self.name, self.mode, self.spec, self.kind = name, mode, spec, spec.kind
        self.precision, self.clip, self.lr = precision, args.clip, LR[spec.kind]
        self.accum = args.accum  # micro-batches per optimizer step, as stepgraph's --accum
        # --vary-seq: step i runs at the bucket of vary_len(i, the largest); getattr, for
        # callers' argument sets (torch_ddp.py) that predate the flags.
        self.vary_seq = bool(getattr(args, "vary_seq", False))
        self.seq_lens = list(getattr(args, "seq_lens", None) or [])
        if self.vary_seq:
            problem = vary_seq_problem(name, mode, self.accum, self.seq_lens)
            if problem:
                raise ValueError(f"{name} {mode}: {problem}")
        self.ignore_index = PAD_TARGET if self.vary_seq else -100  # -100: PyTorch's default
        self.graph_count, self.capture_ms = None, None  # graph mode with --vary-seq reports them
        seed = args.seed
        torch.manual_seed(seed)
        if self.kind == "mlp":
            self.x, self.y = make_data(spec.width, spec.batch, seed + 1)
            self.data_source = None
        else:
            self.x, self.y, self.data_source = make_text_data(spec.batch, spec.seq, seed + 1,
                                                              args.data)
        self.data_mib = (self.x.numel() * self.x.element_size()
                         + self.y.numel() * self.y.element_size()) / 2**20
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        if self.kind == "mlp":
            self.model = build_mlp(spec.width, spec.depth).cuda()
            self.act_shape = (spec.batch, spec.width)  # what each later child takes
        else:
            self.model = build_gpt(spec.width, spec.depth, spec.seq, args.dropout,
                                   args.attention == "sdpa").cuda()
            self.act_shape = (spec.batch, spec.seq, spec.width)
        # The original children, kept before any mode wraps or patches the model: probe_loss
        # runs them (graphs and compiled code update their parameters in place).
        self.orig_children = tuple(self.model.children())
        self.params = list(self.model.parameters())  # (weight, bias) per layer, in order for mlp
        self.param_count = sum(p.numel() for p in self.params)
        self.probe_before = self.probe_loss()
        self.step = getattr(self, "_setup_" + mode)()

    @torch_no_grad
    def probe_loss(self, nbatches=4):
        """Mean loss over the first batches, computed from the parameters directly (MLP) or by
        the original, unwrapped children (GPT: run_unwrapped, dropout off), so it reads the same
        model in every mode (graphs and compiled code update these tensors in place). The
        validation compares it before training and after the warm-up: one batch's loss against
        another's would be mostly noise. fp32 in both precisions (no autocast)."""
        total = 0.0
        for b in range(nbatches):
            if self.kind == "gpt":
                # --vary-seq: the positions the steps train, those of the largest bucket.
                n = self.seq_lens[-1] if self.vary_seq else self.spec.seq
                h = self.x[b][:, :n]
                for child in self.orig_children:
                    h = run_unwrapped(child, h)
                total += float(self._loss(h, self.y[b][:, :n]))
                continue
            h = self.x[b]
            for k in range(0, len(self.params), 2):
                h = F.linear(h, self.params[k], self.params[k + 1])
                if k + 2 < len(self.params):
                    h = F.relu(h)
            total += float(F.cross_entropy(h, self.y[b]))
        return total / nbatches

    def _batch(self, i):
        return self.x[i % NUM_BATCHES], self.y[i % NUM_BATCHES]

    def _vary_shape(self, i):
        """--vary-seq: step i's length and the bucket it runs at."""
        n = vary_len(i, self.seq_lens[-1])
        return n, bucket_of(self.seq_lens, n)

    def _padded_batch(self, i, n):
        """--vary-seq: batch i's first n positions padded to their bucket Tb, new tensors
        (B, Tb): tokens PAD_TOKEN and targets PAD_TARGET from n on."""
        x, y = self._batch(i)
        tb = bucket_of(self.seq_lens, n)
        xb, yb = x[:, :tb].clone(), y[:, :tb].clone()
        if n < tb:
            xb[:, n:].fill_(PAD_TOKEN)
            yb[:, n:].fill_(PAD_TARGET)
        return xb, yb

    def _loss(self, out, target):
        if self.kind == "gpt":  # logits (B, T, 256) -> (B*T, 256) against targets (B*T)
            # --vary-seq: padding targets are ignore_index, so the mean runs over real tokens.
            return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1),
                                   ignore_index=self.ignore_index)
        return F.cross_entropy(out, target)

    def _autocast(self):
        """The region of the forward and the loss: bf16 autocast, or nothing for fp32."""
        if self.precision == "bf16":
            return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)
        return contextlib.nullcontext()

    def _adam(self, **kw):
        opt = torch.optim.Adam(self.model.parameters(), lr=self.lr, **kw)
        self.adam_impl = adam_impl(self.model.parameters(), opt)
        return opt

    def _clip_and_step(self, opt):
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)  # foreach, no host sync
        opt.step()

    def _micro_batches(self, fwd, batches):
        """Forward and backward of each micro-batch, its loss scaled by 1/accum so that the
        gradients sum to the mean loss's (PyTorch's accumulation recipe); returns the step's
        mean loss (a tensor: no host sync)."""
        total = None
        for xb, yb in batches:
            with self._autocast():
                loss = self._loss(fwd(xb), yb) / self.accum
            loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
        return total

    def _step_batches(self, i):
        """Optimizer step i's micro-batches: batches i*accum .. i*accum + accum-1 (--vary-seq:
        batch i at its drawn length, padded to its bucket; accum is 1)."""
        if self.vary_seq:
            return [self._padded_batch(i, self._vary_shape(i)[0])]
        return [self._batch(i * self.accum + j) for j in range(self.accum)]

    def _eager_batches(self, fwd, opt, batches):
        """One optimizer step over the given micro-batches; returns its loss (a tensor)."""
        opt.zero_grad(set_to_none=True)
        loss = self._micro_batches(fwd, batches)
        self._clip_and_step(opt)
        return loss

    def _eager_step(self, fwd, opt):
        def step(i):
            return self._eager_batches(fwd, opt, self._step_batches(i))
        return step

    def _setup_eager(self):
        return self._eager_step(self.model, self._adam())

    def _setup_graph(self):
        if self.vary_seq:
            return self._setup_graph_vary()
        opt = self._adam(capturable=True)
        return self._whole_step_graph(self.model, lambda: self._clip_and_step(opt), opt)

    def _setup_graph_compile(self):
        # Inductor's kernels (the default mode: no CUDA graphs of its own) for the model, and
        # the clipping and Adam step compiled too, all captured in one whole-step graph; the
        # side-stream warm-up compiles both before the capture.
        opt = self._adam(capturable=True)
        fwd = torch.compile(self.model)
        opt_step = torch.compile(lambda: self._clip_and_step(opt))
        return self._whole_step_graph(fwd, opt_step, opt)

    def _whole_step_graph(self, fwd, opt_step, opt):
        """The whole step (forward, backward and opt_step()) captured in one torch.cuda.graph,
        after 3 warm-up steps on a side stream; the step copies its batch in and replays."""
        # One static input pair per micro-batch: the whole step, all of them, is one graph.
        static = [tuple(t.clone() for t in self._batch(j)) for j in range(self.accum)]
        # Warm up on a side stream (the documented recipe): optimizer state and cuBLAS
        # handles are created here, not during capture. These steps train on the first batches.
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                self._micro_batches(fwd, static)
                opt_step()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)  # grads are allocated inside the graph's pool
        with torch.cuda.graph(graph):  # bf16: the autocast regions lie inside the capture
            static_loss = self._micro_batches(fwd, static)
            opt_step()
        self.graph = graph  # keeps the graph (and its pool) alive

        def step(i):
            for (sx, sy), (xb, yb) in zip(static, self._step_batches(i)):
                sx.copy_(xb)
                sy.copy_(yb)
            graph.replay()
            return static_loss
        return step

    def _setup_graph_vary(self):
        """--vary-seq: a graph per bucket, as _setup_graph's for one shape, all in one pool."""
        opt = self._adam(capturable=True)
        # Static tokens and targets (B, Tb) per bucket, outside the pool; batch 0 at the full
        # bucket length for the warm-up.
        static = {tb: self._padded_batch(0, tb) for tb in self.seq_lens}
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # the side-stream warm-up, every shape (cuBLAS, Adam state)
            for tb in self.seq_lens:
                for _ in range(VARY_WARMUP_PER_BUCKET):
                    self._eager_batches(self.model, opt, [static[tb]])
        torch.cuda.current_stream().wait_stream(s)
        # One pool: a graph's temporaries and gradients are dead once its replay ends (each
        # capture starts from grads set to None, so its backward writes them afresh), and the
        # replays run one at a time on one stream, so the graphs may reuse each other's memory.
        # Only the static inputs and each graph's loss stay live across replays.
        pool = torch.cuda.graph_pool_handle()
        graphs = {}
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for tb in self.seq_lens:
            graph = torch.cuda.CUDAGraph()
            opt.zero_grad(set_to_none=True)  # this graph's grads are allocated in its capture
            with torch.cuda.graph(graph, pool=pool):  # bf16: autocast inside the capture
                loss = self._micro_batches(self.model, [static[tb]])
                self._clip_and_step(opt)
            graphs[tb] = (graph, loss)
        torch.cuda.synchronize()
        # torch.cuda.graph instantiates at the end of each capture: both are in here.
        self.capture_ms = (time.perf_counter() - t0) * 1e3
        self.graph_count = len(graphs)
        self.graphs = graphs  # keeps the graphs (and the pool) alive

        def step(i):
            n, tb = self._vary_shape(i)
            x, y = self._batch(i)
            sx, sy = static[tb]
            sx.copy_(x[:, :tb])
            sy.copy_(y[:, :tb])
            if n < tb:
                sx[:, n:].fill_(PAD_TOKEN)
                sy[:, n:].fill_(PAD_TARGET)
            graph, loss = graphs[tb]
            graph.replay()
            return loss
        return step

    def _setup_graphed_callables(self):
        sample = self._batch(0)[0].clone()  # requires_grad False, as the real inputs
        with self._autocast():  # bf16: warm-up and capture run under the step's autocast
            self.model = torch.cuda.make_graphed_callables(self.model, (sample,))
        return self._eager_step(self.model, self._adam())

    def _setup_graphed_layers(self):
        blocks = self.orig_children
        # The first child's input is data (no grad; integer tokens for the GPT); every later
        # input is a float activation that requires grad (fp32 in both precisions: the GPT's
        # residual stream and LayerNorm outputs stay fp32 under autocast).
        samples = [(self._batch(0)[0].clone(),)]
        samples += [(torch.randn(*self.act_shape, device="cuda", requires_grad=True),)
                    for _ in blocks[1:]]
        with self._autocast():
            graphed = torch.cuda.make_graphed_callables(blocks, tuple(samples))
        self.model = nn.Sequential(*graphed)
        return self._eager_step(self.model, self._adam())

    def _setup_compile_opt(self):
        compiled = torch.compile(self.model, mode="reduce-overhead")
        opt = self._adam()

        @torch.compile(fullgraph=False)
        def opt_step():
            self._clip_and_step(opt)

        def step(i):
            torch.compiler.cudagraph_mark_step_begin()  # a new iteration for cudagraph trees
            opt.zero_grad(set_to_none=True)
            loss = self._micro_batches(compiled, self._step_batches(i))
            opt_step()
            return loss
        return step

    def _setup_compile(self):
        if not self.vary_seq:
            compiled = torch.compile(self.model, mode="reduce-overhead")
        else:
            # A specialization (and CUDA graphs) per bucket, none with dynamic shapes; Dynamo
            # stops recompiling a frame past its limit (8 by default), so raise it to the bucket
            # count. Raising it changes nothing for the one-shape runs that may follow.
            compiled = torch.compile(self.model, mode="reduce-overhead", dynamic=False)
            import importlib  # not "import torch._dynamo": see cleanup()
            cfg = importlib.import_module("torch._dynamo").config
            limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
            if getattr(cfg, limit) < len(self.seq_lens):
                setattr(cfg, limit, len(self.seq_lens))
        opt = self._adam()
        inner = self._eager_step(compiled, opt)

        def step(i):
            torch.compiler.cudagraph_mark_step_begin()  # a new iteration for cudagraph trees
            return inner(i)

        if self.vary_seq:
            # Every bucket compiled, warmed and recorded before step 0: batch 0 at the full
            # bucket length, VARY_WARMUP_PER_BUCKET steps each (compile + cudagraph-tree
            # warm-up, recording, a replay).
            for tb in self.seq_lens:
                batch = self._padded_batch(0, tb)
                for _ in range(VARY_WARMUP_PER_BUCKET):
                    torch.compiler.cudagraph_mark_step_begin()
                    self._eager_batches(compiled, opt, [batch])
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


def profile_steps(step, first, n, keep=None):
    """Kernels per step and GPU-busy ms per step over n steps, from a torch.profiler trace
    (CUPTI underneath). Returns (None, None) when the trace holds no device activity. keep: a
    path to write the trace to as well (Chrome trace JSON)."""
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
        if keep:
            shutil.copyfile(path, keep)
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


def add_trace_dir(ap):
    """--trace-dir DIR (torch_ref.py and torch_vision.py)."""
    ap.add_argument("--trace-dir", default=None, metavar="DIR",
                    help="keep each run's profiled steps as DIR/MODEL-PRECISION-MODE.json "
                         "(torch.profiler's Chrome trace of the --profile-steps steps, kernels "
                         "and copies); needs --profile-steps > 0")


def check_trace_dir(ap, args):
    """--trace-dir: an existing writable directory, and profiled steps to put in it."""
    if args.trace_dir is None:
        return
    if args.profile_steps < 1:
        ap.error("--trace-dir needs --profile-steps of at least 1")
    if not os.path.isdir(args.trace_dir) or not os.access(args.trace_dir, os.W_OK):
        ap.error(f"--trace-dir {args.trace_dir}: not a writable directory")


def trace_path(args, name, precision, mode):
    """Where --trace-dir keeps a run's trace, or None."""
    if args.trace_dir is None:
        return None
    return os.path.join(args.trace_dir, f"{name}-{precision}-{mode}.json")


def timed_blocks(step, it, steps, repeats):
    """Runs step(it), step(it + 1), ... in `repeats` blocks of steps // repeats (at least 1):
    per block, device ms per step (CUDA events) and host ms per step (queuing). Returns both
    lists, the block size and the next iteration."""
    block = max(1, steps // repeats)
    dev_ms, host_ms = [], []
    for _ in range(repeats):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        e0.record()
        t0 = time.perf_counter()
        for _ in range(block):
            step(it)
            it += 1
        t1 = time.perf_counter()
        e1.record()
        e1.synchronize()
        dev_ms.append(e0.elapsed_time(e1) / block)
        host_ms.append((t1 - t0) * 1e3 / block)
    return dev_ms, host_ms, block, it


def run_one(name, mode, precision, args):
    w = Workload(name, mode, precision, args)
    it = 0
    loss_first = float(w.step(it))  # a host sync, before any timing
    it += 1
    for _ in range(args.warmup):
        w.step(it)
        it += 1
    probe_after = w.probe_loss()
    if not (math.isfinite(loss_first) and math.isfinite(probe_after)):
        raise RuntimeError(f"{name} {precision} {mode}: loss is not finite (first step "
                           f"{loss_first}, after warm-up {probe_after})")
    loss_fell = probe_after < w.probe_before
    if not loss_fell:
        print(f"torch_ref.py: warning: {name} {precision} {mode}: the loss on batches 0-3 did "
              f"not fall over the set-up and {args.warmup + 1} warm-up steps "
              f"({w.probe_before:.4f} -> {probe_after:.4f})", file=sys.stderr)

    timed_from = it
    dev_ms, host_ms, block, it = timed_blocks(w.step, it, args.steps, args.repeats)
    loss_last = float(w.step(it))
    it += 1

    kernels, busy_ms = (None, None)
    if args.profile_steps > 0:
        kernels, busy_ms = profile_steps(w.step, it, args.profile_steps, trace_path(args, name, precision, mode))
        if kernels is None:
            print(f"torch_ref.py: warning: {name} {precision} {mode}: the profiler trace holds "
                  "no device activity (CUPTI unavailable?); kernels and GPU-busy are null",
                  file=sys.stderr)
    torch.cuda.synchronize()
    peak_mib = torch.cuda.max_memory_allocated() / 2**20
    peak_reserved_mib = torch.cuda.max_memory_reserved() / 2**20

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    row = {
        "framework": "pytorch",
        "model": name,
        "mode": mode,
        "accum": w.accum,
        "precision": precision,
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
        "lr": w.lr,
        "clip": w.clip,
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
    if w.kind == "gpt":
        # Real tokens per optimizer step, as stepgraph bench's tokens_per_step: --vary-seq
        # averages B * len over the timed steps (timed_from .. it - 1).
        if w.vary_seq:
            tokens = mean_real_tokens(w.spec.batch, w.seq_lens, timed_from, it - timed_from)
        else:
            tokens = w.accum * w.spec.batch * w.spec.seq
        ms = row["ms_per_step"]
        row.update({
            "seq": w.spec.seq,
            "heads": w.spec.width // GPT_HEAD_DIM,
            "vocab": GPT_VOCAB,
            "dropout": args.dropout,
            "attention": args.attention,
            "data": w.data_source,
            "vary_seq": w.vary_seq,
            "seq_lens": w.seq_lens or None,
            "tokens_per_step": round(tokens, 1),
            "tokens_per_s": round(tokens * 1e3 / ms, 1) if ms > 0 else None,
        })
        if w.graph_count is not None:
            row.update({"graphs": w.graph_count, "capture_ms": round(w.capture_ms, 3)})
    del w
    return row


def cleanup(mode):
    """Frees one workload's graphs, pools and compiled code before the next one starts."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    if mode in ("compile", "compile_opt", "graph_compile"):
        # importlib, not "import torch._dynamo": that statement would make `torch` a local
        # name of this function and break the calls above.
        import importlib
        importlib.import_module("torch._dynamo").reset()


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def print_table(rows):
    head = (f"{'model':<16} {'prec':<5} {'mode':<18} {'ms/step':>9} {'host ms':>9} {'kernels':>8} "
            f"{'busy ms':>9} {'peak MiB':>9} {'loss':>15}")
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<16} {r['precision']:<5} {r['mode']:<18} ERROR: {r['error']}")
            continue
        loss = f"{r['loss_first']:.3f}->{r['loss_last']:.3f}"
        print(f"{r['model']:<16} {r['precision']:<5} {r['mode']:<18} {r['ms_per_step']:>9.4f} "
              f"{r['host_ms_per_step']:>9.4f} {fmt(r['kernels_per_step'], '8.1f'):>8} "
              f"{fmt(r['gpu_busy_ms_per_step'], '9.4f'):>9} {r['peak_mib']:>9.1f} {loss:>15}")
    if rows and "device" in rows[0]:
        print(f"device: {rows[0]['device']}; torch {rows[0]['torch_version']}; "
              f"Adam {rows[0]['adam_impl']}; TF32 {rows[0]['tf32']}")


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="PyTorch reference timings for stepgraph's MLP and GPT workloads (see the "
                    "file's docstring for what each number means).")
    ap.add_argument("--model", action="append", required=True,
                    help="mlp-WIDTH-DEPTH-BATCH or gpt-WIDTH-DEPTH-BATCH-SEQ; repeat the flag "
                         "or give a comma list")
    ap.add_argument("--mode", action="append", default=None,
                    help=f"one of {', '.join(MODES)} (repeat or comma list; default eager)")
    ap.add_argument("--precision", action="append", default=None,
                    help="fp32 or bf16 (autocast; gpt models only), repeat or comma list "
                         "(default fp32)")
    ap.add_argument("--steps", type=int, default=200,
                    help="timed steps in all, split into --repeats blocks (default 200)")
    ap.add_argument("--repeats", type=int, default=5, help="timed blocks (default 5)")
    ap.add_argument("--warmup", type=int, default=30, help="untimed steps first (default 30)")
    ap.add_argument("--profile-steps", type=int, default=5,
                    help="steps profiled for kernels and GPU-busy (default 5; 0: skip)")
    add_trace_dir(ap)
    ap.add_argument("--clip", type=float, default=None,
                    help="clip_grad_norm_ to this norm before each optimizer step (default: "
                         "no clipping)")
    ap.add_argument("--data", default=None,
                    help="gpt: text file to train on (default: the first of "
                         f"{', '.join(GPT_TEXTS)} that exists, else synthetic bytes)")
    ap.add_argument("--vocab", type=int, default=None, metavar="N",
                    help="gpt: --data is a token file (nanoGPT's raw uint16 or an llm.c shard, "
                         "as stepgraph --vocab reads it) of tokens below N; embedding and head "
                         "get N rows (default: bytes, 256)")
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="gpt: dropout probability on the embedding and after each attention "
                         "and MLP projection (default 0)")
    ap.add_argument("--attention", choices=("sdpa", "math"), default="sdpa",
                    help="gpt: sdpa (default): F.scaled_dot_product_attention(is_causal=True), "
                         "as PyTorch users write it; math: the explicit matmul, masked_fill, "
                         "softmax, matmul")
    ap.add_argument("--tf32", action="store_true",
                    help="fp32 matmuls in TF32 (torch.backends.cuda.matmul.allow_tf32), to compare "
                         "with stepgraph under STEPGRAPH_TF32=1 (default: TF32 off)")
    ap.add_argument("--sdpa", action="store_const", const="sdpa", dest="attention",
                    help="the same as --attention sdpa (the default; kept for older scripts)")
    ap.add_argument("--accum", type=int, default=1, metavar="K",
                    help="micro-batches per optimizer step, their losses scaled by 1/K and "
                         "their gradients summed before one clip and update, as stepgraph's "
                         "--accum (default 1); graph mode captures all K in the step's graph")
    ap.add_argument("--seq-lens", default=None, metavar="L",
                    help="gpt, with --vary-seq: increasing sequence-length buckets, e.g. "
                         "32,64,128 (the largest at most the model's SEQ), as stepgraph bench")
    ap.add_argument("--vary-seq", action="store_true",
                    help="gpt, --accum 1, modes eager, graph and compile: step i's length drawn "
                         "from 1..the largest bucket as stepgraph's sg_vary_len, run padded to "
                         "its bucket (graph: a graph per bucket in one pool; compile: "
                         "dynamic=False, a specialization per bucket)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", action="store_true", help="one JSON object per line on stdout")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.repeats < 1 or args.warmup < 0 or args.profile_steps < 0:
        ap.error("--steps and --repeats must be >= 1; --warmup and --profile-steps >= 0")
    check_trace_dir(ap, args)
    if args.clip is not None and not (math.isfinite(args.clip) and args.clip > 0):
        ap.error("--clip must be a positive number")
    if not 1 <= args.accum <= 1024:
        ap.error("--accum must be from 1 to 1024")
    if not 0.0 <= args.dropout < 1.0:
        ap.error("--dropout must be in [0, 1)")
    if args.data is not None and not os.path.isfile(args.data):
        ap.error(f"--data {args.data}: no such file")
    if args.vocab is not None:
        if args.data is None or not 1 <= args.vocab <= 2**31 - 1:
            ap.error("--vocab needs --data (a token file) and a vocabulary >= 1")
        global GPT_VOCAB, TOKEN_FILE
        GPT_VOCAB, TOKEN_FILE = args.vocab, True
    models = split_list(args.model)
    modes = split_list(args.mode or ["eager"], MODES, "mode")
    precisions = split_list(args.precision or ["fp32"], PRECISIONS, "precision")
    kinds = {}
    for m in models:
        try:
            kinds[m] = parse_model(m).kind
        except ValueError as e:
            ap.error(str(e))
    if args.seq_lens is not None:
        if not args.vary_seq:
            ap.error("--seq-lens is for --vary-seq (it times steps of drawn lengths)")
        try:
            args.seq_lens = parse_seq_lens(args.seq_lens)
        except ValueError as e:
            ap.error(str(e))
    if args.vary_seq:
        for m in models:
            for mode in modes:
                problem = vary_seq_problem(m, mode, args.accum, args.seq_lens)
                if problem:
                    ap.error(problem)
    # bf16 is defined for the GPT workloads only: (mlp, bf16) pairs are left out.
    runs = [(name, prec) for name in models for prec in precisions
            if kinds[name] == "gpt" or prec == "fp32"]
    skipped = [f"{name} {prec}" for name in models for prec in precisions
               if (name, prec) not in runs]
    if not runs:
        ap.error("--precision bf16 applies to gpt models only")
    if skipped:
        print(f"torch_ref.py: note: bf16 is defined for gpt models only; skipping "
              f"{', '.join(skipped)}", file=sys.stderr)

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
    set_tf32(args.tf32)

    return run_all(runs, modes, run_one, cleanup, print_table, args)


def run_all(runs, modes, run_one, cleanup, print_table, args):
    """Every (model, precision) of runs in every mode: run_one(name, mode, precision, args) gives
    a row; a mode that raises gives a row with an "error" key and the others go on; cleanup(mode)
    after each. Rows printed as JSON lines as they come (--json), else print_table(rows) at the
    end. Returns the exit status: 1 if any mode failed. (torch_vision.py runs its own through it.)"""
    rows, failed = [], False
    for name, precision in runs:
        for mode in modes:
            try:
                row = run_one(name, mode, precision, args)
            except Exception as e:  # one failing mode must not hide the others' numbers
                traceback.print_exc()
                failed = True
                row = {"framework": "pytorch", "model": name, "mode": mode,
                       "precision": precision,
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
