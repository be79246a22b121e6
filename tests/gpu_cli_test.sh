#!/usr/bin/env bash
# gpu_cli_test.sh BIN: what `stepgraph train` and `verify` promise, on the CUDA backend (the cli
# test checks the same on the CPU): SIGINT finishes the step in flight under step scope and
# writes a checkpoint that resumes there; --metrics in fp32 and bf16; a model larger than the
# GPU and a stream as data refused before anything is allocated or read; a diverging fp32 run
# stops without saving; verify refuses to pass on nothing; with two GPUs, trace --gpus 2 writes
# rank 0's trace. Exit 77 without a GPU.
set -u
bin=$1
"$bin" train --model mlp-16-1-4 --backend cuda --steps 1 --quiet >/dev/null 2>&1 || { echo "SKIP: no usable GPU"; exit 77; }
fails=0 passes=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass() { echo "ok: $*"; passes=$((passes + 1)); }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
# shellcheck source=tests/expect.sh
. "$(dirname "$0")/expect.sh"
expect() { expect_cmd "stepgraph ${*:4}" "$1" "$2" -- "$bin" "${@:4}"; } # expect CODE REGEX -- ARGS...
g="--model gpt-256-4-8-128 --backend cuda --scope step"
"$bin" train $g --steps 100000000 --log-every 50 --save "$tmp/ck.safetensors" --metrics "$tmp/m.jsonl" >"$tmp/log" 2>&1 &
pid=$!
for _ in $(seq 600); do [ "$(grep -c '^step ' "$tmp/log")" -ge 2 ] && break; sleep 0.1; done
kill -s INT $pid
wait $pid; rc=$?
n=$(sed -nE 's/^stepgraph train: interrupted by SIGINT after step ([0-9]+)$/\1/p' "$tmp/log")
if [ "$rc" != 130 ] || [ -z "$n" ] || ! grep -q "^saved $tmp/ck.safetensors (step $n)$" "$tmp/log"; then
    fail "SIGINT under step scope: exit $rc: $(cat "$tmp/log")"
else
    pass "SIGINT under step scope: step $n finished and saved, exit 130"
    expect 0 "resumed from .* at step $n$" -- train $g --steps 20 --resume "$tmp/ck.safetensors"
fi
if python3 - "$tmp/m.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert lines[0]["run"]["backend"] == "cuda" and lines[0]["run"]["scope"] == "step", lines[0]
steps = [l for l in lines if "loss" in l]  # (keys: the val_loss line has no "loss")
assert len(steps) >= 2 and all(l["tokens_per_s"] > 0 for l in steps[1:]), steps
PY
then pass "--metrics on the GPU: tokens/s on every line after the first"; else fail "--metrics: $(head -c 600 "$tmp/m.jsonl")"; fi
"$bin" train --model gpt-256-4-8-128 --backend cuda --precision bf16 --scope step --steps 40 --log-every 10 --metrics "$tmp/b.jsonl" >/dev/null 2>&1
if python3 -c 'import json,sys; l=[d for d in map(json.loads, open(sys.argv[1])) if "loss" in d]; assert len(l) >= 4 and all(x["loss_scale"] > 0 for x in l), l' "$tmp/b.jsonl"
then pass "--metrics under bf16: the loss scale on every line"; else fail "bf16 --metrics: $(head -c 600 "$tmp/b.jsonl")"; fi
expect 1 "'mlp-65536-64-32' needs at least [0-9.]+ GiB .*NVIDIA.* has [0-9.]+ GiB free of [0-9.]+ GiB" -- train --model mlp-65536-64-32 --backend cuda --steps 1
expect 1 "'/dev/zero' is a character device, not a regular file" -- train --model gpt-64-1-2-16 --backend cuda --steps 1 --data /dev/zero
out=$("$bin" train --model mlp-512-6-32 --backend cuda --optim sgd --lr 10 --steps 400 --log-every 1 --save "$tmp/nan.safetensors" 2>&1); rc=$?
if [ "$rc" != 1 ] || ! grep -Eq "the loss is (NaN|infinite) at step [0-9]+ \(fp32\)" <<<"$out" || [ -e "$tmp/nan.safetensors" ]; then
    fail "a diverging fp32 run on the GPU: exit $rc: $(tail -n 3 <<<"$out")"
else pass "a diverging fp32 run on the GPU stops without saving"; fi
expect 2 "compares no step replayed from a graph" -- verify --model mlp-512-6-32 --scope step --steps 3 --backend cuda
expect 0 "OK: 8 steps match \(bit-exact\), 5 of them replayed from graphs" -- verify --model gpt-256-4-8-128 --scope step --steps 8 --backend cuda --dropout 0.1 --clip 1
# ResNets on the GPU: cuDNN's deterministic convolutions and BatchNorm's statistics bit-exact
# against eager under step and layer scope; no device allocation per step under step scope.
expect 0 "OK: 8 steps match \(bit-exact\), 5 of them replayed from graphs; scope step" -- verify --model resnet18-8-32 --classes 10 --scope step --steps 8 --backend cuda
expect 0 "OK: 6 steps match \(bit-exact\), 3 of them replayed from graphs; scope layer" -- verify --model resnet50-4-64 --classes 100 --scope layer --steps 6 --backend cuda
expect 0 "device allocations per step after set-up: 0.00" -- train --model resnet18-16-32 --classes 10 --scope step --steps 12 --backend cuda
# Data parallelism on two GPUs (skipped with fewer): trace --gpus 2 runs both ranks and writes
# rank 0's trace, which check_trace.py reads as a viewer would.
if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
    expect 0 "rank 0 of 2 of a data-parallel run" -- trace --model gpt-64-2-2-16 --scope step --steps 2 --gpus 2 --out "$tmp/dp.json"
    if python3 "$(dirname "$0")/check_trace.py" "$tmp/dp.json" --name step; then pass "trace --gpus 2 wrote a valid trace"
    else fail "trace --gpus 2: $tmp/dp.json is not a valid trace"; fi
else
    echo "skip: trace --gpus 2 (fewer than 2 GPUs)"
fi
echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
