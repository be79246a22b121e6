#!/usr/bin/env python3
"""bench/make_tokens.py: writes a token file for the GPT benchmarks over a large vocabulary.

    python3 bench/make_tokens.py OUT [--tokens N] [--vocab V] [--seed S] [--llmc]

No tokenizer or corpus is needed on the benchmark machine: the tokens are drawn from a fixed
random process with structure a model can learn (so a benchmark's "the loss fell" check
means something): each token is, with probability 0.7, one of four successors fixed for the
token before it, else a Zipf-distributed draw (weight 1/(rank+1)) over the whole vocabulary.
Speed does not depend on what the tokens say, only on their number and the vocabulary.
Format: nanoGPT's raw little-endian uint16 (default), or with --llmc an llm.c shard (a
1024-byte header: int32 magic 20240520, version 1, token count; then uint16 tokens). Both are
what `stepgraph train --data OUT --vocab V` and `bench/torch_ref.py --data OUT --vocab V` read.
Pure Python (the standard library only); 2 M tokens take a few seconds.
"""
import argparse
import array
import random
import sys

LLMC_MAGIC, LLMC_HEADER_INTS = 20240520, 256


def main(argv=None):
    ap = argparse.ArgumentParser(description="write a token file (see the docstring)")
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=2_000_000, help="tokens (default 2000000)")
    ap.add_argument("--vocab", type=int, default=50257,
                    help="tokens are below this (default 50257, GPT-2's; at most 65536)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--llmc", action="store_true", help="write an llm.c shard (header + uint16)")
    a = ap.parse_args(argv)
    if not 2 <= a.vocab <= 65536 or a.tokens < 1 or (a.llmc and a.tokens >= 2**31):
        ap.error("--vocab must be 2..65536 and --tokens >= 1 (below 2^31 with --llmc)")
    r = random.Random(a.seed)
    rank = list(range(a.vocab))
    r.shuffle(rank)
    cum, acc = [], 0.0
    for t in range(a.vocab):
        acc += 1.0 / (rank[t] + 1)
        cum.append(acc)
    draws = r.choices(range(a.vocab), cum_weights=cum, k=a.tokens)
    succ = [r.choices(range(a.vocab), cum_weights=cum, k=4) for _ in range(a.vocab)]
    out = array.array("H", bytes(2 * a.tokens))
    prev = draws[0]
    out[0] = prev
    for i in range(1, a.tokens):
        u = r.random()
        prev = succ[prev][int(u * 4 / 0.7)] if u < 0.7 else draws[i]
        out[i] = prev
    if sys.byteorder != "little":
        out.byteswap()
    with open(a.out, "wb") as f:
        if a.llmc:
            head = array.array("i", [0] * LLMC_HEADER_INTS)
            head[0], head[1], head[2] = LLMC_MAGIC, 1, a.tokens
            if sys.byteorder != "little":
                head.byteswap()
            f.write(head.tobytes())
        f.write(out.tobytes())
    print(f"make_tokens.py: {a.out}: {a.tokens} tokens below {a.vocab} "
          f"({'llm.c shard' if a.llmc else 'raw uint16'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
