#!/usr/bin/env python3
"""ckpt_same.py A.safetensors B.safetensors: whether two checkpoints hold the same tensors bit for
bit (names, dtypes, shapes and bytes; the metadata is not compared). Prints the tensors that
differ and exits 1 if any does. For comparing two builds' training runs."""
import json
import struct
import sys


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    head.pop("__metadata__", None)
    return {k: (v["dtype"], tuple(v["shape"]), data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in head.items()}


a, b = load(sys.argv[1]), load(sys.argv[2])
bad = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
for k in bad[:20]:
    print(f"differs: {k}")
print(f"{len(a)} tensors, {len(bad)} differ")
sys.exit(1 if bad else 0)
