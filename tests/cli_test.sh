#!/usr/bin/env bash
# cli_test.sh BIN: the stepgraph command's contract: help texts, usage errors (exit 2 and a
# message naming the bad input), and a short CPU training run that learns.
set -u
bin=$1
fails=0
expect() { # expect CODE REGEX -- ARGS...
    local code=$1 re=$2; shift 3
    out=$("$bin" "$@" 2>&1); rc=$?
    if [ "$rc" != "$code" ] || ! grep -Eq -- "$re" <<<"$out"; then
        echo "FAIL: stepgraph $* -> exit $rc (want $code), output lacks /$re/:"; echo "$out" | head -20
        fails=$((fails + 1))
    else
        echo "ok: stepgraph $*"
    fi
}
expect 0 'commands:' -- --help
expect 0 '--log-every' -- train --help
expect 0 '--repeats' -- bench --help
expect 2 "unknown command 'frobnicate'" -- frobnicate
expect 2 "unknown option '--bogus'" -- train --model mlp-16-1-4 --bogus
expect 2 "--model is required" -- train --steps 3
expect 2 "--steps 'abc' is not a whole number" -- train --model mlp-16-1-4 --steps abc
expect 2 "--steps '0' is not a whole number" -- train --model mlp-16-1-4 --steps 0
expect 2 "--lr 'x' is not a number" -- train --model mlp-16-1-4 --lr x
expect 2 "--backend 'tpu'" -- train --model mlp-16-1-4 --backend tpu
expect 2 "option --model needs a value" -- train --model
expect 1 "unknown model 'mlp-16'" -- train --model mlp-16 --backend cpu
expect 0 'done: 60 steps.*allocations per step after set-up: 0.00' -- train --model mlp-32-2-16 --steps 60 --backend cpu --lr 3e-3
expect 0 'verify' -- verify --help
expect 2 "--scope 'graph': expected eager, layer, model or step" -- train --model mlp-16-1-4 --scope graph
expect 2 "--on-capture-fail 'maybe'" -- train --model mlp-16-1-4 --on-capture-fail maybe
expect 2 "--model and --scope are required" -- verify --model mlp-16-1-4
# advise profiles a CUDA device: the CPU backend is refused clearly (exit 1); help and usage.
expect 0 'usage: stepgraph advise --model NAME' -- advise --help
expect 1 "advise profiles a CUDA device .*--backend cpu has none" -- advise --model mlp-64-2-32 --backend cpu
expect 2 "--model is required" -- advise --no-measure
for sc in layer model step; do
    expect 0 "OK: 12 steps match \(bit-exact\); scope $sc" -- verify --model mlp-32-2-8 --scope $sc --steps 12 --backend cpu --lr-schedule
    expect 0 "graphs: .* replays" -- train --model mlp-32-2-8 --scope $sc --steps 20 --backend cpu --quiet
done
# Variable sequence length (gpt): a length bucket per graph under step scope; usage errors.
expect 0 "bucket cache: 3 graphs held, [0-9]+ hits" -- train --model gpt-64-1-2-32 --backend cpu --seq-lens 8,16,32 --vary-seq --scope step --steps 12
expect 2 "--vary-seq needs --seq-lens" -- train --model gpt-64-1-2-32 --vary-seq
expect 2 "--seq-lens is for gpt models, not 'mlp-16-1-4'" -- train --model mlp-16-1-4 --seq-lens 2,4
expect 2 "--seq-lens '16,8': expected increasing sizes" -- train --model gpt-64-1-2-32 --seq-lens 16,8
expect 1 "sequence length T = 32" -- train --model gpt-64-1-2-32 --backend cpu --seq-lens 16,64 --steps 2
out=$(STEPGRAPH_DISABLE_GRAPHS=1 "$bin" train --model mlp-32-2-8 --scope step --steps 10 --backend cpu --quiet 2>&1); rc=$?
if [ "$rc" != 0 ] || ! grep -q "scope step (STEPGRAPH_DISABLE_GRAPHS=1: run eagerly)" <<<"$out"; then
    echo "FAIL: STEPGRAPH_DISABLE_GRAPHS=1: exit $rc: $out"; fails=$((fails + 1))
else
    echo "ok: STEPGRAPH_DISABLE_GRAPHS=1 is honoured and said"
fi
# A mismatch is caught and named (test hook: nudge one weight of the graph side after step 3).
out=$(SG_VERIFY_INJECT=3 "$bin" verify --model mlp-32-2-8 --scope step --steps 6 --backend cpu 2>&1); rc=$?
if [ "$rc" != 1 ] || ! grep -q "MISMATCH at step 3: first tensor that differs: layers.1.weight" <<<"$out"; then
    echo "FAIL: injected mismatch: exit $rc: $out"; fails=$((fails + 1))
else
    echo "ok: verify names an injected mismatch"
fi
# GPT: checkpoint and resume give the loss curve of an uninterrupted run (dropout and clipping
# on, the resumed half under step scope); sample generates from the checkpoint.
tmp=$(mktemp -d)
g="--model gpt-64-1-2-16 --backend cpu --log-every 5 --dropout 0.1 --clip 1"
full=$("$bin" train $g --steps 20 2>&1 | grep -E '^step ')
"$bin" train $g --steps 10 --save "$tmp/ck.safetensors" >/dev/null 2>&1
half=$("$bin" train $g --steps 10 --resume "$tmp/ck.safetensors" --scope step 2>&1 | grep -E '^step ')
if [ -z "$half" ] || [ "$(tail -n 3 <<<"$full")" != "$(tail -n 3 <<<"$half")" ]; then
    echo "FAIL: resume: uninterrupted tail:"; tail -n 3 <<<"$full"; echo "resumed:"; echo "$half"; fails=$((fails + 1))
else
    echo "ok: resume continues the uninterrupted loss curve: $(tail -n 1 <<<"$half")"
fi
out=$("$bin" sample --model gpt-64-1-2-16 --resume "$tmp/ck.safetensors" --prompt "GNU" --length 30 --backend cpu 2>&1); rc=$?
if [ "$rc" != 0 ] || [ "$(printf '%s' "$out" | head -c 3)" != "GNU" ] || [ "$(printf '%s' "$out" | wc -c)" -lt 33 ]; then
    echo "FAIL: sample: exit $rc: $out"; fails=$((fails + 1))
else
    echo "ok: sample generated $(printf '%s' "$out" | wc -c) bytes"
fi
head -c 100 "$tmp/ck.safetensors" > "$tmp/cut.safetensors"
expect 1 "cut.safetensors" -- train $g --steps 2 --resume "$tmp/cut.safetensors"
expect 1 "/nonexistent/file.txt" -- train --model gpt-64-1-2-16 --backend cpu --steps 1 --data /nonexistent/file.txt
rm -rf "$tmp"
# Memory report (bench --memory): host memory stands in on the CPU; the static buffers, the
# graphs' pool and executable graphs, and no allocation per 100 steps eagerly or under replay.
m="--backend cpu --steps 5 --repeats 1 --warmup 2 --memory"
expect 0 "memory in MiB \(CPU backend: host memory stands in for device memory\)" -- bench --model mlp-64-2-32 $m
expect 0 "^mlp-64-2-32 +step( +[0-9]+\.[0-9]+){9} +0\.00 +0\.00$" -- bench --model mlp-64-2-32 $m --scope all
expect 0 "^gpt-64-1-2-16 +eager( +[0-9]+\.[0-9]+){9} +0\.00 +n/a$" -- bench --model gpt-64-1-2-16 $m --scope eager,step
expect 0 "\"memory_of\": \"host\".*\"params_mib\": [0-9.]+.*\"allocs_per_100_replay\": 0\.00" -- bench --model gpt-64-1-2-16 $m --scope step --json
expect 2 "--model is required" -- bench --memory
# Data parallelism (--gpus): usage errors before any process starts; then two CPU ranks (local
# sockets) print the loss curve of one process with the whole batch, and a rank that fails (test
# hook: rank 1 captures other collectives) is named while the other stops.
d="--model mlp-32-2-16 --backend cpu"
expect 2 "--gpus '0' is not a whole number from 1 to 64" -- train $d --gpus 0
expect 2 "the global batch 16 of mlp-32-2-16 does not split into 3 equal parts" -- train $d --gpus 3
expect 2 "--nnodes > 1 needs --master ADDR:PORT" -- train --model mlp-32-2-16 --gpus 2 --nnodes 2
expect 2 "--node-rank 2: expected 0 to 1 \(--nnodes 2\)" -- train --model mlp-32-2-16 --gpus 2 --nnodes 2 --node-rank 2 --master 127.0.0.1:29500
expect 2 "--master 'localhost': expected ADDR:PORT" -- train --model mlp-32-2-16 --gpus 2 --nnodes 2 --master localhost
expect 2 "are for data-parallel runs: add --gpus N" -- train $d --bucket-mib 1
expect 2 "--master and --node-rank are for runs on several hosts" -- train $d --gpus 2 --master 127.0.0.1:29500
expect 2 "--gpus does not combine with --batch-sizes or --seq-lens" -- train $d --gpus 2 --batch-sizes 4,8
expect 2 "--nnodes needs the CUDA backend" -- train $d --gpus 2 --nnodes 2 --master 127.0.0.1:29500
d="$d --steps 30 --scope step --optim sgd --lr 0.05 --log-every 10"
one=$("$bin" train $d 2>&1 | grep '^step ')
two=$("$bin" train $d --gpus 2 --bucket-mib 0.002 2>&1); rc=$?
if [ "$rc" != 0 ] || [ -z "$one" ] || [ "$one" != "$(grep '^step ' <<<"$two")" ] || ! grep -q "data parallel: 2 ranks" <<<"$two"; then
    echo "FAIL: --gpus 2 on the CPU: exit $rc; one rank:"; echo "$one"; echo "two ranks:"; echo "$two" | head -20
    fails=$((fails + 1))
else
    echo "ok: --gpus 2 (CPU ranks) prints the loss curve of one process: $(tail -n 1 <<<"$one")"
fi
out=$(SG_DIST_INJECT_SEQ=1 "$bin" train $d --gpus 2 --bucket-mib 0.002 2>&1); rc=$?
if [ "$rc" != 1 ] || ! grep -q "rank 1 captured other collectives than rank 0" <<<"$out" ||
   ! grep -Eq "sg_dist_launch: rank [01] \(GPU [01]\) exited with status 1; stopped the other workers" <<<"$out"; then
    echo "FAIL: a failing rank: exit $rc: $out"; fails=$((fails + 1))
else
    echo "ok: a failing rank is named and the run stops"
fi
# The loss printed at the end is below the first.
out=$("$bin" train --model mlp-32-2-16 --steps 150 --backend cpu --lr 3e-3 --quiet 2>&1)
l=$(sed -nE 's/.*loss ([0-9.]+) -> ([0-9.]+).*/\1 \2/p' <<<"$out")
if ! awk -v a="${l% *}" -v b="${l#* }" 'BEGIN { exit !(b < a / 2) }'; then
    echo "FAIL: loss did not halve in 150 CPU steps: $out"; fails=$((fails + 1))
else
    echo "ok: loss $l"
fi
echo "$((37 + 6 + 11 - fails)) passed, $fails failed"
[ "$fails" = 0 ]
