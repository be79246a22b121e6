#!/usr/bin/env bash
# gen_torch_test.sh STEPGRAPH REPO: on the GPU machine (exit 77 without a GPU or PyTorch), a
# small GPT trained for 60 steps and saved; `stepgraph sample` greedy (loop mode, fp32) from the
# checkpoint against bench/torch_gen.py --check loading the same file into PyTorch (fp32, TF32
# off): PyTorch's cache decoding must equal its own full recompute, and stepgraph's tokens must
# equal PyTorch's up to the first step whose top-2 logit gap is within the tie tolerance of
# test_generate.c (4 (2L + 2) 2^-24 sqrt(4C) max(1, |top|), L 2, C 128), and at least half the
# tokens must be compared (a trained model is confident).
set -euo pipefail
SG=$1
REPO=$2
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP: no GPU"; exit 77; }
python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null || { echo "SKIP: no PyTorch with CUDA"; exit 77; }
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
MODEL=gpt-128-2-2-32
"$SG" train --model $MODEL --steps 60 --lr 3e-3 --backend cuda --save "$D/ck.safetensors" > "$D/train.log"
PROMPT="It was the "
"$SG" sample --model $MODEL --resume "$D/ck.safetensors" --backend cuda --prompt "$PROMPT" --length 20 \
  --temperature 0 --mode loop --json > "$D/sg.json"
IDS=$(python3 -c "import sys; print(' '.join(str(b) for b in sys.argv[1].encode()))" "$PROMPT")
python3 "$REPO/bench/torch_gen.py" --model $MODEL --checkpoint "$D/ck.safetensors" --prompt-ids "$IDS" \
  --max-new 20 --check > "$D/pt.json"
python3 - "$D/sg.json" "$D/pt.json" <<'PY'
import json, math, sys
sg = json.load(open(sys.argv[1]))["sequences"][0]["tokens"]
pt = json.load(open(sys.argv[2]))
assert pt["tokens"] == pt["recompute_tokens"], f"PyTorch cache {pt['tokens']} != its recompute {pt['recompute_tokens']}"
eps = max(2 ** -24, 2 ** -24 * math.sqrt(4 * 128))
compared = 0
for k, (a, b) in enumerate(zip(sg, pt["tokens"])):
    tol = 4 * (2 * 2 + 2) * eps * max(1.0, abs(pt["top"][k]))
    if pt["gaps"][k] <= tol:
        break
    assert a == b, f"token {k}: stepgraph {a}, PyTorch {b} (gap {pt['gaps'][k]:.3g} > tol {tol:.3g})\n{sg}\n{pt['tokens']}"
    compared += 1
assert compared >= len(sg) // 2, f"only {compared} of {len(sg)} tokens compared (near ties)"
print(f"stepgraph and PyTorch agree on {compared} of {len(sg)} greedy tokens: {sg}")
PY
