#!/usr/bin/env bash
# cli_test.sh BIN DIGITS: the stepgraph command's contract: help texts, usage errors (exit 2 and
# a message naming the bad input), and short CPU training runs that learn (DIGITS: scikit-learn's
# digits.csv, which the digits_data fixture fetches).
set -u
bin=$1
fails=0
passes=0
# shellcheck source=tests/expect.sh
. "$(dirname "$0")/expect.sh"
pass() { echo "ok: $*"; passes=$((passes + 1)); }
expect() { expect_cmd "stepgraph ${*:4}" "$1" "$2" -- "$bin" "${@:4}"; } # expect CODE REGEX -- ARGS...
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
# Model names are taken whole: trailing text, a sign or a leading zero is a usage error (2).
expect 2 "unknown model 'mlp-16'" -- train --model mlp-16 --backend cpu
expect 2 "unknown model 'mlp-64-2-33x'.*BATCH must be a whole number" -- train --model mlp-64-2-33x --backend cpu
expect 2 "unknown model 'mlp-64-2-32-garbage'" -- train --model mlp-64-2-32-garbage --backend cpu
expect 2 "unknown model 'mlp-064-2-32'" -- train --model mlp-064-2-32 --backend cpu
expect 2 "unknown model 'gpt-64-1-2-16-1'" -- train --model gpt-64-1-2-16-1 --backend cpu
expect 2 "unknown model 'mlp-64-2-32\"x'" -- bench --model 'mlp-64-2-32"x' --backend cpu --json
# A model too large for the device is refused before anything is allocated, with both figures.
expect 1 "'mlp-65536-64-32' needs at least [0-9.]+ GiB .* has [0-9.]+ GiB free of [0-9.]+ GiB" -- train --model mlp-65536-64-32 --backend cpu --steps 1
# --steps-per-graph: step scope only, and it must divide --steps (no silent extra steps).
expect 2 "--steps 10 is not a multiple of --steps-per-graph 3" -- train --model mlp-32-2-8 --backend cpu --scope step --steps-per-graph 3 --steps 10
expect 2 "--steps-per-graph 2 is for --scope step" -- train --model mlp-32-2-8 --backend cpu --steps-per-graph 2 --steps 10
expect 2 "--save-every needs --save" -- train --model mlp-32-2-8 --backend cpu --steps 10 --save-every 5
expect 0 "done: 12 steps, [0-9.]+ ms/step \(steps 9..12\)" -- train --model mlp-32-2-8 --backend cpu --scope step --steps-per-graph 2 --steps 12 --quiet
expect 0 "done: 2 steps, [0-9.]+ ms/step \(all 2 steps, set-up included" -- train --model mlp-32-2-8 --backend cpu --scope step --steps 2 --quiet
# --graph-modules names each module once.
expect 2 "names module 0 \(layers.0\) twice" -- train --model mlp-32-2-8 --backend cpu --scope layer --graph-modules layers.0,layers.0,0 --steps 5
# verify never passes on nothing: too few steps to replay is a usage error, graphs disabled a failure.
expect 2 "--steps 3 with --warmup 3 compares no step replayed from a graph" -- verify --model mlp-32-2-8 --scope step --steps 3 --backend cpu
expect 2 "--steps 4 with --warmup 3 compares one replay only" -- verify --model mlp-32-2-8 --scope model --steps 4 --backend cpu
expect 0 "OK: 5 steps match \(bit-exact\), 2 of them replayed from graphs" -- verify --model mlp-32-2-8 --scope step --steps 5 --backend cpu
out=$(STEPGRAPH_DISABLE_GRAPHS=1 "$bin" verify --model mlp-32-2-8 --scope step --steps 6 --backend cpu 2>&1); rc=$?
if [ "$rc" != 1 ] || ! grep -q "there is no graph to verify" <<<"$out"; then
    echo "FAIL: verify with graphs disabled: exit $rc: $out"; fails=$((fails + 1))
else
    pass "verify refuses to pass with graphs disabled"
fi
expect 0 'done: 60 steps.*allocations per step after set-up: 0.00' -- train --model mlp-32-2-16 --steps 60 --backend cpu --lr 3e-3
expect 0 'verify' -- verify --help
expect 2 "--scope 'graph': expected eager, layer, model or step" -- train --model mlp-16-1-4 --scope graph
expect 2 "--on-capture-fail 'maybe'" -- train --model mlp-16-1-4 --on-capture-fail maybe
expect 2 "--model and --scope are required" -- verify --model mlp-16-1-4
# advise profiles a CUDA device: the CPU backend is refused clearly (exit 1); help and usage.
expect 0 'usage: stepgraph advise --model NAME' -- advise --help
expect 1 "advise profiles a CUDA device .*--backend cpu has none" -- advise --model mlp-64-2-32 --backend cpu
expect 2 "--model is required" -- advise --no-measure
# bench --sol: the CPU backend has no device peaks, and says so; a step's work is still counted.
expect 0 "^mlp-32-2-8 +step +[0-9.]+ +[0-9.e-]+ +[0-9.e-]+ +n/a +n/a$" -- bench --model mlp-32-2-8 --scope step --steps 4 --repeats 1 --warmup 5 --sol --backend cpu
expect 0 "^speed of light: no device peaks on the CPU backend" -- bench --model mlp-32-2-8 --scope eager --steps 4 --repeats 1 --warmup 5 --sol --backend cpu
# advise --generate runs on the CPU backend too (a check of the flow); options of the other kind
# of advice are usage errors.
expect 0 "verdict: (eager|step|loop) predicted fastest.*measured" -- advise --generate --model gpt-64-1-2-16 --backend cpu --prompt-len 3 --length 5 --batch 2 --repeats 2
expect 0 "^loop +[0-9.]+ " -- advise --generate --model gpt-64-1-2-16 --backend cpu --length 4 --prompt-len 2 --no-measure --repeats 1
expect 2 "--batch is for --generate" -- advise --model gpt-64-1-2-16 --batch 2
expect 2 "--accum is for training, not --generate" -- advise --generate --model gpt-64-1-2-16 --accum 2
expect 2 "--generate runs a gpt model, not 'mlp-64-2-32'" -- advise --generate --model mlp-64-2-32
expect 2 "--length '1' is not a whole number" -- advise --generate --model gpt-64-1-2-16 --length 1
expect 2 "a prompt of 15 tokens and 2 new need 17 positions; 'gpt-64-1-2-16' holds 16" -- advise --generate --model gpt-64-1-2-16 --prompt-len 15 --backend cpu
for sc in layer model step; do
    expect 0 "OK: 12 steps match \(bit-exact\), 9 of them replayed from graphs; scope $sc" -- verify --model mlp-32-2-8 --scope $sc --steps 12 --backend cpu --lr-schedule
    expect 0 "graphs: .* replays" -- train --model mlp-32-2-8 --scope $sc --steps 20 --backend cpu --quiet
done
# Variable sequence length (gpt): under step scope one graph holds every length bucket as a
# branch of a SWITCH node (--vary-seq: the device draws the length), or, with conditional nodes
# off, a graph per bucket in the cache (said); a fixed length keeps the cache; usage errors.
expect 0 "graphs: 1 \([0-9]+ nodes\)" -- train --model gpt-64-1-2-32 --backend cpu --seq-lens 8,16,32 --vary-seq --scope step --steps 12
out=$(STEPGRAPH_DISABLE_CONDITIONALS=1 "$bin" train --model gpt-64-1-2-32 --backend cpu --seq-lens 8,16,32 --vary-seq --scope step --steps 12 2>&1); rc=$?
if [ "$rc" != 0 ] || ! grep -q "bucket cache: 3 graphs held" <<<"$out" ||
   ! grep -q "built without conditional nodes: vary_seq's SWITCH" <<<"$out"; then
    echo "FAIL: --vary-seq without conditional nodes: exit $rc: $out"; fails=$((fails + 1))
else
    pass "--vary-seq without conditional nodes: a graph per bucket, and the run says why"
fi
expect 0 "bucket cache: 1 graphs held" -- train --model gpt-64-1-2-32 --backend cpu --seq-lens 8,16,32 --scope step --steps 6
expect 2 "--vary-seq needs --seq-lens" -- train --model gpt-64-1-2-32 --vary-seq
expect 2 "--seq-lens is for gpt models, not 'mlp-16-1-4'" -- train --model mlp-16-1-4 --seq-lens 2,4
expect 2 "--seq-lens '16,8': expected increasing sizes" -- train --model gpt-64-1-2-32 --seq-lens 16,8
expect 2 "sequence length T = 32" -- train --model gpt-64-1-2-32 --backend cpu --seq-lens 16,64 --steps 2
# Control flow on the device (issue 13): --vary-seq with --steps-per-graph, --loop, early stop.
# Each gives the eager run's losses (bit for bit: the printed digits agree); then usage errors.
# last_steps ARGS...: the last three loss lines of a train run.
last_steps() { "$bin" train "$@" 2>&1 | grep -E '^step ' | tail -n 3; }
same_losses() { # same_losses WHAT "EAGER ARGS" "GRAPH ARGS"
    local a b
    a=$(last_steps $2)
    b=$(last_steps $3)
    if [ -z "$a" ] || [ "$a" != "$b" ]; then
        echo "FAIL: $1: eager:"; echo "$a"; echo "graph:"; echo "$b"; fails=$((fails + 1))
    else
        pass "$1 gives the eager losses: $(tail -n 1 <<<"$a")"
    fi
}
cm="--model gpt-64-1-2-16 --backend cpu"
cf="$cm --log-every 4"
same_losses "--vary-seq --steps-per-graph 4 under step scope" "$cf --seq-lens 8,16 --vary-seq --steps 16" \
    "$cf --seq-lens 8,16 --vary-seq --steps 16 --scope step --steps-per-graph 4 --warmup 1"
same_losses "--vary-batch --steps-per-graph 4 under step scope" "--model mlp-32-2-8 --backend cpu --log-every 4 --batch-sizes 3,8 --vary-batch --steps 16" \
    "--model mlp-32-2-8 --backend cpu --log-every 4 --batch-sizes 3,8 --vary-batch --steps 16 --scope step --steps-per-graph 4 --warmup 1"
expect 2 "add --vary-batch" -- train --model mlp-32-2-8 --backend cpu --batch-sizes 4,8 --scope step --steps-per-graph 2 --steps 4
same_losses "--loop with --accum 3 under step scope" "$cf --accum 3 --steps 8" "$cf --accum 3 --steps 8 --scope step --loop --warmup 1"
expect 0 "graphs: 1 \([0-9]+ nodes\), .* 3 replays" -- train $cf --seq-lens 8,16 --vary-seq --steps 16 --scope step --steps-per-graph 4 --warmup 1 --loop
tmp=$(mktemp -d)
out=$("$bin" train $cf --steps 6 --stop-loss 1e9 --save "$tmp/stop.safetensors" 2>&1); rc=$?
if [ "$rc" != 0 ] || ! grep -q "^stepgraph train: stopped early after 1 step: the loss reached 1e+09$" <<<"$out" ||
   ! grep -q "^saved $tmp/stop.safetensors (step 1)$" <<<"$out" || ! grep -q "^done: 1 steps" <<<"$out"; then
    echo "FAIL: --stop-loss 1e9: exit $rc: $out"; fails=$((fails + 1))
else
    pass "--stop-loss 1e9 stops after the first step, exit 0, checkpoint at step 1"
fi
# The same rule stops eager and step scope at one step: 4 steps a launch, the rule on the device
# ending a replayed launch midway (step 14 of this run; any step past the eager first launch does).
stop_at() { "$bin" train $cf --steps 24 --stop-loss 4.5 --save "$tmp/$1.safetensors" "${@:2}" 2>&1 |
            sed -nE "s/^saved .* \(step ([0-9]+)\)$/\1/p"; }
a=$(stop_at eager)
b=$(stop_at step --scope step --steps-per-graph 4 --warmup 1)
if [ -z "$a" ] || [ "$a" != "$b" ] || [ "$a" -ge 24 ] || [ "$a" -le 8 ]; then
    echo "FAIL: --stop-loss 4.5: eager saved at step '$a', step scope with 4 steps a launch at '$b'"; fails=$((fails + 1))
else
    pass "--stop-loss 4.5 stops eager and 4-steps-a-launch step scope at step $a, saved there"
fi
expect 0 "OK: 5 steps match \(bit-exact\), 4 of them replayed" -- verify $cm --stop-loss 4.5 --steps-per-graph 4 --warmup 1 --scope step --steps 5
rm -rf "$tmp"
expect 2 "--stop-nonfinite '0' is not a whole number from 1 to 1073741824" -- train $cf --stop-nonfinite 0
expect 2 "--stop-loss 'nan' is not a number" -- train $cf --stop-loss nan
expect 2 "--loop takes no value \('--loop=1'\)" -- train $cf --scope step --accum 3 --loop=1
expect 2 "unknown option '3'" -- train $cf --scope step --accum 3 --loop 3
expect 2 "--loop: nothing repeats in the step graph" -- train $cf --scope step --loop
expect 2 "--loop is for --scope step" -- train $cf --accum 3 --loop
expect 2 "--skip-if is for --precision bf16" -- train $cf --scope step --skip-if
expect 2 "--steps-per-graph 2 does not combine with --seq-lens: .*add --vary-seq" -- train $cf --scope step --seq-lens 8,16 --steps-per-graph 2 --steps 4
expect 2 "--gpus does not combine with --stop-nonfinite or --stop-loss" -- train --model mlp-32-2-16 --gpus 2 --stop-loss 1
expect 2 "--vary-seq needs --seq-lens" -- verify $cm --scope step --vary-seq
for cmd in bench advise; do
    expect 2 "--vary-seq needs --seq-lens" -- $cmd $cm --vary-seq
done
expect 2 "--overflow-every is for --precision bf16" -- bench $cm --overflow-every 4
expect 2 "--overflow-every 3 is not a multiple of --steps-per-graph 2" -- bench $cm --precision bf16 --overflow-every 3 --steps-per-graph 2
expect 0 "OK: 5 steps match \(bit-exact\), 2 of them replayed from graphs" -- verify $cm --vary-seq --seq-lens 8,16 --steps-per-graph 2 --scope step --steps 5
expect 0 "OK: 5 steps match \(bit-exact\), 2 of them replayed from graphs" -- verify --model mlp-32-2-8 --backend cpu --accum 3 --loop --scope step --steps 5
expect 0 "OK: 5 steps match \(bit-exact\), 2 of them replayed from graphs" -- verify $cm --precision bf16 --skip-if --scope step --steps 5
expect 0 '"loop": 1, "skip_if": 1, "vary_seq": 1, "seq_lens": "8,16", "stop_nonfinite": 3, "stop_loss": null, "overflow_every": 2, "cond_note": ""' -- bench $cm --precision bf16 --seq-lens 8,16 --vary-seq --steps-per-graph 2 --overflow-every 2 --skip-if --loop --stop-nonfinite 3 --scope eager,step --steps 4 --repeats 1 --warmup 4 --json
expect 1 "advise profiles a CUDA device" -- advise $cm --precision bf16 --seq-lens 8,16 --vary-seq --steps-per-graph 4 --loop --skip-if --stop-nonfinite 3 --optim-state bf16 --no-measure
out=$(STEPGRAPH_DISABLE_GRAPHS=1 "$bin" train --model mlp-32-2-8 --scope step --steps 10 --backend cpu --quiet 2>&1); rc=$?
if [ "$rc" != 0 ] || ! grep -q "scope step (STEPGRAPH_DISABLE_GRAPHS=1: run eagerly)" <<<"$out"; then
    echo "FAIL: STEPGRAPH_DISABLE_GRAPHS=1: exit $rc: $out"; fails=$((fails + 1))
else
    pass "STEPGRAPH_DISABLE_GRAPHS=1 is honoured and said"
fi
# A mismatch is caught and named (test hook: nudge one weight of the graph side after step 3).
out=$(SG_VERIFY_INJECT=3 "$bin" verify --model mlp-32-2-8 --scope step --steps 6 --backend cpu 2>&1); rc=$?
if [ "$rc" != 1 ] || ! grep -q "MISMATCH at step 3: first tensor that differs: layers.1.weight" <<<"$out"; then
    echo "FAIL: injected mismatch: exit $rc: $out"; fails=$((fails + 1))
else
    pass "verify names an injected mismatch"
fi
# GPT: checkpoint and resume give the loss curve of an uninterrupted run (dropout and clipping
# on, the resumed half under step scope); sample generates from the checkpoint.
tmp=$(mktemp -d)
g="--model gpt-64-1-2-16 --backend cpu --log-every 5 --dropout 0.1 --clip 1"
# check_resume WHAT CKPT ARGS...: 20 steps against 10, saved to CKPT, then 10 resumed under step
# scope; the last two logged steps must agree.
check_resume() {
    local what=$1 ck=$2 full half
    shift 2
    full=$("$bin" train "$@" --steps 20 2>&1 | grep -E '^step ')
    "$bin" train "$@" --steps 10 --save "$ck" >/dev/null 2>&1
    half=$("$bin" train "$@" --steps 10 --resume "$ck" --scope step 2>&1 | grep -E '^step ')
    if [ -z "$half" ] || [ "$(tail -n 2 <<<"$full")" != "$(tail -n 2 <<<"$half")" ]; then
        echo "FAIL: $what: uninterrupted tail:"; tail -n 2 <<<"$full"; echo "resumed:"; echo "$half"; fails=$((fails + 1))
    else
        pass "$what continues the uninterrupted loss curve: $(tail -n 1 <<<"$half")"
    fi
}
# shellcheck disable=SC2086
check_resume resume "$tmp/ck.safetensors" $g
# bf16 optimizer state: resumes the same way (the checkpoint holds it, stochastic rounding's bits
# depend on the step only); a run that keeps f32 state refuses the checkpoint, naming the option.
# shellcheck disable=SC2086
check_resume "resume with --optim-state bf16" "$tmp/ck16.safetensors" $g --optim-state bf16
# shellcheck disable=SC2086
expect 1 "holds bf16 optimizer state, this optimizer keeps f32.*--optim-state bf16" -- train $g --steps 2 --resume "$tmp/ck16.safetensors"
expect 2 "--optim-state 'f16': expected f32 or bf16" -- train --model mlp-16-1-4 --optim-state f16
expect 2 "--optim-state 'x': expected f32 or bf16" -- bench --model mlp-16-1-4 --optim-state x
expect 2 "--optim-state 'x': expected f32 or bf16" -- verify --model mlp-16-1-4 --optim-state x
expect 2 "--optim-state 'x': expected f32 or bf16" -- trace --model mlp-16-1-4 --scope step --out "$tmp/t.json" --optim-state x
expect 2 "--optim-state 'x': expected f32 or bf16" -- advise --model mlp-16-1-4 --optim-state x
expect 2 "--optim-state is for training, not --generate" -- advise --generate --model gpt-64-1-2-16 --optim-state bf16
# bf16 without loss scaling: no scale, no check; verify's scopes stay bit-exact with it.
expect 2 "--loss-scale 'x': expected dynamic or none" -- train --model mlp-16-1-4 --loss-scale x
expect 2 "--loss-scale 'static': expected dynamic or none" -- bench --model mlp-16-1-4 --loss-scale static
expect 2 "--overflow-every needs dynamic loss scaling" -- bench --model gpt-64-1-2-16 --precision bf16 --loss-scale none --overflow-every 4
expect 0 "no loss scaling \(--loss-scale none\): no step skipped" -- train --model gpt-64-1-2-16 --precision bf16 --loss-scale none --steps 3 --backend cpu
expect 0 "OK: 5 steps match \(bit-exact\)" -- verify --model gpt-64-1-2-16 --precision bf16 --loss-scale none --scope step --steps 5 --backend cpu
# Past the model's 16 positions only recompute generates (the window slides); the default mode
# (loop, a KV cache) fits the default --length to the cache: 13 bytes after a 3-byte prompt.
out=$("$bin" sample --model gpt-64-1-2-16 --resume "$tmp/ck.safetensors" --prompt "GNU" --length 30 --mode recompute --backend cpu 2>&1); rc=$?
if [ "$rc" != 0 ] || [ "$(printf '%s' "$out" | head -c 3)" != "GNU" ] || [ "$(printf '%s' "$out" | wc -c)" -lt 33 ]; then
    echo "FAIL: sample --mode recompute: exit $rc: $out"; fails=$((fails + 1))
else
    pass "sample --mode recompute generated $(printf '%s' "$out" | wc -c) bytes past the sequence length"
fi
out=$("$bin" sample --model gpt-64-1-2-16 --resume "$tmp/ck.safetensors" --prompt "GNU" --backend cpu 2>/dev/null | wc -c)
[ "$out" = 17 ] && pass "sample (mode loop): the default --length fills the cache (3 + 13 bytes and a newline)" \
    || { echo "FAIL: sample --prompt GNU: $out bytes, want 17"; fails=$((fails + 1)); }
# sample's generation (issue 14): a KV cache run eagerly (eager), a graph a token (step) or one
# graph with a WHILE node (loop), against recompute (the whole context through the model for
# every token). Greedy output is the same in the four, on a briefly trained gpt and on a deeper
# one's initial weights; a batch of prompts of different lengths gives each line what its
# prompt gives alone; --stop ends a sequence right after the stop text (taken from a greedy
# run, so it occurs); --json parses and has its keys; a sampled run is the same in the three
# cache modes and differs by sequence; then usage and runtime errors.
ss="--model gpt-64-1-2-32 --backend cpu --resume $tmp/s.safetensors"
"$bin" train --model gpt-64-1-2-32 --backend cpu --steps 300 --lr 3e-3 --save "$tmp/s.safetensors" --quiet >/dev/null 2>&1 ||
    { echo "FAIL: training the sample test's checkpoint"; fails=$((fails + 1)); }
same_modes() { # same_modes WHAT MODES -- SAMPLE ARGS...: stdout identical in each mode, and not empty
    local what=$1 modes=$2 m ref out
    shift 3
    ref=$("$bin" sample "$@" --mode "${modes%% *}" 2>&1)
    for m in ${modes#* }; do
        out=$("$bin" sample "$@" --mode "$m" 2>&1)
        if [ -z "$ref" ] || [ "$out" != "$ref" ]; then
            echo "FAIL: $what: mode ${modes%% *}:"; echo "$ref"; echo "mode $m:"; echo "$out"; fails=$((fails + 1))
            return
        fi
    done
    pass "$what: the same in modes $modes: $(head -n 1 <<<"$ref" | LC_ALL=C tr -c '[:print:]' '?')"
}
same_modes "greedy, trained" "recompute eager step loop" -- $ss --temperature 0 --length 12 --prompt "The General Public"
same_modes "greedy, --random-init" "recompute eager step loop" -- --model gpt-64-2-2-32 --backend cpu --random-init --temperature 0 --length 20 --prompt "The quick"
same_modes "greedy bf16, --random-init" "eager step loop" -- --model gpt-64-2-2-32 --backend cpu --random-init --precision bf16 --temperature 0 --length 20 --prompt "The quick"
same_modes "sampled (--temperature 0.9 --seed 5 --batch 3)" "eager step loop" -- $ss --temperature 0.9 --seed 5 --batch 3 --length 12 --prompt GNU
out=$("$bin" sample $ss --temperature 0.9 --seed 5 --batch 3 --length 12 --prompt GNU 2>&1)
[ "$(sort -u <<<"$out" | wc -l)" -ge 2 ] && pass "--batch 3 with one prompt: the sequences draw their own tokens" \
    || { echo "FAIL: --batch 3 sampled three equal sequences: $out"; fails=$((fails + 1)); }
printf 'GNU\nThe General Public\nx\r\n' > "$tmp/prompts.txt"
for m in eager step loop recompute; do
    batch=$("$bin" sample $ss --temperature 0 --length 10 --mode $m --prompts "$tmp/prompts.txt" --batch 3 2>&1)
    alone=$(for p in GNU "The General Public" x; do "$bin" sample $ss --temperature 0 --length 10 --mode $m --prompt "$p" 2>&1; done)
    if [ -z "$batch" ] || [ "$batch" != "$alone" ]; then
        echo "FAIL: --prompts of 3 lengths, mode $m: batch:"; echo "$batch"; echo "alone:"; echo "$alone"; fails=$((fails + 1))
    else
        pass "--prompts (3, 18 and 1 bytes) --batch 3, mode $m: each line as its prompt alone"
    fi
done
# --stop: three bytes of the greedy continuation, the first three from byte 2 on that do not
# occur before; the run must end right after them, the printed text without them, the JSON
# tokens with them.
full=$("$bin" sample $ss --temperature 0 --length 12 --prompt "The General Public" 2>/dev/null)
cont=${full#The General Public}
stop='' want=''
for ((k = 2; k + 3 <= ${#cont}; k++)); do
    if [[ "${cont:0:k+2}" != *"${cont:k:3}"* ]]; then stop=${cont:k:3} want="The General Public${cont:0:k}"; break; fi
done
for m in eager step loop recompute; do
    out=$("$bin" sample $ss --temperature 0 --length 12 --prompt "The General Public" --stop "$stop" --mode $m 2>&1)
    if [ -z "$want" ] || [ "$out" != "$want" ]; then
        echo "FAIL: --stop '$stop' (mode $m) after '$cont': got '$out', want '$want'"; fails=$((fails + 1))
    else
        pass "--stop '$stop', mode $m: ends right after it: '$out'"
    fi
done
# --json: one object, its keys; the stop kept in the tokens; --repeat's medians measured.
if command -v python3 >/dev/null; then
    check=$("$bin" advise --generate --model gpt-64-1-2-16 --backend cpu --prompt-len 3 --length 6 --repeats 2 --json 2>/dev/null |
        python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["advice"] == "generate" and d["batch"] == 1 and d["max_new"] == 6 and d["prompt_len"] == 3, d
assert d["decode_step"]["steps"] == 5 and d["decode_step"]["nodes"] > 0 and d["decode_step"]["graph_us"] > 0, d
assert [m["mode"] for m in d["modes"]] == ["eager", "step", "loop"], d["modes"]
for m in d["modes"]:
    assert m["predicted"] and m["measured"] and m["predicted_ms"] > 0, m
    assert abs(m["measured_ms"] - (m["total_ms"] - m["prefill_ms"]) / 5) <= 1e-9 * (1 + abs(m["measured_ms"])), m
print("ok")' 2>&1)
    [ "$check" = ok ] && pass "advise --generate --json: keys, every mode predicted and measured" \
        || { echo "FAIL: advise --generate --json: $check"; fails=$((fails + 1)); }
    for r in 0 2; do
        check=$("$bin" sample $ss --temperature 0 --length 12 --prompt "The General Public" --stop "$stop" --json --repeat $r 2>/dev/null |
            python3 -c '
import json, sys
want_text, stop, rep = sys.argv[1][len("The General Public"):], sys.argv[2], int(sys.argv[3])
d = json.load(sys.stdin)
for k in ("model", "precision", "mode", "batch", "prompt_len", "max_new", "temperature", "top_k", "seed",
          "backend", "device", "prefill_ms", "per_token_ms", "total_ms", "tokens_per_s", "host_us_per_token",
          "wall_ms", "host_us", "steps", "nodes", "graphs", "captured", "sequences"):
    assert k in d, "no key %s: %s" % (k, sorted(d))
assert d["mode"] == "loop" and d["batch"] == 1 and d["prompt_len"] == 18 and d["max_new"] == 12, d
assert (d["prefill_ms"] is None) == (rep == 0) and (d["per_token_ms"] is None) == (rep == 0), d
assert d["total_ms"] > 0 and d["tokens_per_s"] > 0 and d["graphs"] >= 1, d
(s,) = d["sequences"]
assert s["prompt"] == "The General Public" and s["finish"] == "stop", s
assert s["text"] == want_text, (s["text"], want_text)
assert bytes(s["tokens"]).decode() == want_text + stop, s["tokens"]
print("ok")' "$want" "$stop" $r 2>&1)
        [ "$check" = ok ] && pass "sample --json --repeat $r: keys, the sequence, the stop in its tokens" \
            || { echo "FAIL: sample --json --repeat $r: $check"; fails=$((fails + 1)); }
    done
else
    echo "SKIP: sample --json needs python3"
fi
out=$("$bin" sample $ss --temperature 0 --length 8 --prompt GNU --repeat 2 2>&1 >/dev/null)
# The format only: ms a token is a difference of two medians, which timing noise on a model this
# small can make negative (seen once in ten runs on the CPU).
grep -Eq "prefill [0-9.]+ ms, -?[0-9.]+ ms a token \(7 steps\), total [0-9.]+ ms, [0-9.]+ tokens/s, host [0-9.]+ us a token \(medians of 2" <<<"$out" \
    && pass "sample --repeat 2: the medians on stderr" || { echo "FAIL: sample --repeat 2: $out"; fails=$((fails + 1)); }
out=$("$bin" sample --model gpt-64-1-2-32 --backend cpu --random-init --prompt-len 5 --batch 3 --length 4 --temperature 0 2>&1)
[ "$(cut -c 1-5 <<<"$out" | tr '\n' '|')" = "It wa|the b|t of |" ] && pass "--prompt-len 5 --batch 3: sequence i from byte 7*i" \
    || { echo "FAIL: --prompt-len 5 --batch 3: $out"; fails=$((fails + 1)); }
expect 2 "--mode 'bogus': expected loop, step, eager or recompute" -- sample $ss --mode bogus
expect 2 "3 tokens and --length 30 need 33 positions, past the cache's 32 \(the model's sequence length\).*--mode recompute" -- sample $ss --prompt GNU --length 30
expect 2 "3 tokens and --length 6 need 9 positions, past the cache's 8 \(--max-len\).*--mode recompute" -- sample $ss --prompt GNU --length 6 --max-len 8 --mode step
expect 0 "^GNU" -- sample $ss --prompt GNU --length 30 --mode recompute
expect 2 "--prompt and --prompts exclude each other" -- sample $ss --prompt GNU --prompts "$tmp/prompts.txt"
expect 2 "--random-init and --resume exclude each other" -- sample $ss --random-init
expect 2 "--prompt-len and --prompt exclude each other" -- sample $ss --prompt GNU --prompt-len 4
expect 2 "--batch 2 is fewer than the 3 prompts" -- sample $ss --prompts "$tmp/prompts.txt" --batch 2
expect 2 "--max-len 40: the model's sequence length is 32" -- sample $ss --max-len 40
expect 2 "--stop '0123456789abcdefg' holds 17 bytes: expected 1 to 16" -- sample $ss --stop 0123456789abcdefg
printf 'GNU\n\nx\n' > "$tmp/empty_line.txt"
expect 2 "--prompts '$tmp/empty_line.txt' line 2 is empty" -- sample $ss --prompts "$tmp/empty_line.txt"
expect 1 "--prompts '$tmp/missing.txt': cannot read it" -- sample $ss --prompts "$tmp/missing.txt"
out=$(STEPGRAPH_DISABLE_CONDITIONALS=1 "$bin" sample $ss --prompt GNU --length 4 2>&1); rc=$?
[ "$rc" = 1 ] && grep -q "mode loop needs a WHILE conditional node.*use mode step" <<<"$out" \
    && pass "sample --mode loop without conditional nodes: exit 1, naming step" \
    || { echo "FAIL: sample without conditional nodes: exit $rc: $out"; fails=$((fails + 1)); }
# --accum: usage errors; verify bit-exact under step scope; resume of accumulated steps continues
# the uninterrupted curve; another K resumes at the saving run's next batch or is refused.
expect 2 "--accum '0' is not a whole number from 1 to 1024" -- train --model mlp-32-2-8 --backend cpu --accum 0
expect 2 "--accum 2 does not combine with --batch-sizes" -- train --model mlp-32-2-8 --backend cpu --accum 2 --batch-sizes 4,8
expect 0 "OK: 6 steps match \(bit-exact\), 3 of them replayed" -- verify --model mlp-32-2-8 --scope model --steps 6 --accum 3 --backend cpu
expect 0 "3 micro-batches a step \(24 rows\)" -- train --model mlp-32-2-8 --backend cpu --steps 3 --accum 3 --quiet
ga="$g --accum 2"
# shellcheck disable=SC2086
check_resume "resume --accum 2" "$tmp/acc.safetensors" $ga
expect 0 "resumed from .* at step 5 \(batch 20\)" -- train $g --accum 4 --steps 1 --resume "$tmp/acc.safetensors"
expect 1 "its next batch, 20, starts no step of this trainer's 3 batches" -- train $g --accum 3 --steps 1 --resume "$tmp/acc.safetensors"
head -c 100 "$tmp/ck.safetensors" > "$tmp/cut.safetensors"
expect 1 "cut.safetensors" -- train $g --steps 2 --resume "$tmp/cut.safetensors"
expect 1 "/nonexistent/file.txt" -- train --model gpt-64-1-2-16 --backend cpu --steps 1 --data /nonexistent/file.txt
# Token files (--vocab): an llm.c shard to train on and a raw uint16 file (nanoGPT's val.bin) to
# validate on, fresh random tokens below 300; a token >= --vocab and a raw file of an odd length
# are refused naming the file and the byte offset (exit 1); sample reads token ids back.
if python3 - "$tmp" <<'PY'
import random, struct, sys
d = sys.argv[1]
def shard(path, toks, version=1):
    w = 'H' if version == 1 else 'I'
    hdr = [20240520, version, len(toks)] + [0] * 253
    open(path, 'wb').write(struct.pack('<256i', *hdr) + struct.pack('<%d%s' % (len(toks), w), *toks))
train = [random.randrange(300) for _ in range(random.randrange(3000, 6000))]
val = [random.randrange(300) for _ in range(random.randrange(200, 500))]
shard(d + '/train.bin', train)
open(d + '/val.bin', 'wb').write(struct.pack('<%dH' % len(val), *val))
k = random.randrange(len(train))
bad = list(train); bad[k] = 300
shard(d + '/bad.bin', bad)
open(d + '/bad_at', 'w').write('%d %d\n' % (k, 1024 + 2 * k))
open(d + '/odd.bin', 'wb').write(struct.pack('<%dH' % len(val), *val) + b'\x01')
PY
then
    v="--model gpt-64-1-2-16 --backend cpu --vocab 300"
    expect 0 "done: 4 steps" -- train $v --data "$tmp/train.bin" --val-data "$tmp/val.bin" --steps 4 --log-every 2 --save "$tmp/tok.safetensors"
    read -r k off < "$tmp/bad_at"
    expect 1 "'$tmp/bad.bin' \(llm.c v1 \(uint16\)\): token $k \(at byte $off\) is 300, not below the vocabulary size 300" -- train $v --data "$tmp/bad.bin" --steps 1
    expect 1 "'$tmp/odd.bin' holds [0-9]+ bytes, an odd number: .* at byte [0-9]+, is cut short" -- train $v --data "$tmp/train.bin" --val-data "$tmp/odd.bin" --steps 1
    expect 1 "'$tmp/val.bin' \(the validation split\) holds [0-9]+ tokens, too few for one window of 2049 tokens" -- train --model gpt-64-1-2-2048 --backend cpu --vocab 300 --data "$tmp/train.bin" --val-data "$tmp/val.bin" --steps 1
    expect 2 "--vocab '0' is not a whole number from 1 to" -- train $v --data "$tmp/train.bin" --vocab 0
    expect 1 "are for gpt models" -- train --model mlp-32-2-8 --backend cpu --vocab 300 --steps 1
    out=$("$bin" sample $v --data "$tmp/train.bin" --resume "$tmp/tok.safetensors" --prompt "1, 2 3" --length 6 2>&1); rc=$?
    if [ "$rc" != 0 ] || ! awk 'NF != 9 || $1 != 1 || $2 != 2 || $3 != 3 { exit 1 } { for (i = 4; i <= NF; i++) if ($i !~ /^[0-9]+$/ || $i >= 300) exit 1 }' <<<"$out"; then
        echo "FAIL: sample --vocab 300: exit $rc: $out"; fails=$((fails + 1))
    else
        pass "sample --vocab 300 printed the prompt's and 6 generated token ids: $out"
    fi
    expect 2 "--prompt '1 x': 'x' is not a token id \(a whole number below --vocab 300\)" -- sample $v --data "$tmp/train.bin" --resume "$tmp/tok.safetensors" --prompt "1 x"
    expect 2 "--prompt '300': '300' is not a token id" -- sample $v --data "$tmp/train.bin" --resume "$tmp/tok.safetensors" --prompt 300
    expect 2 "--vocab needs --data" -- sample $v --resume "$tmp/tok.safetensors"
    expect 1 "wte.weight.*if it was trained with --vocab N, sample with --vocab N --data PATH" -- sample --model gpt-64-1-2-16 --backend cpu --resume "$tmp/tok.safetensors"
    # bench reads the same files, and names the vocabulary in its rows; bad ones fail as train's do.
    expect 0 '"vocab": 300, "data": "'"$tmp"'/train.bin"' -- bench $v --data "$tmp/train.bin" --steps 2 --repeats 1 --warmup 1 --json
    expect 1 "'$tmp/bad.bin' \(llm.c v1 \(uint16\)\): token $k \(at byte $off\) is 300" -- bench $v --data "$tmp/bad.bin" --steps 1 --repeats 1 --warmup 1
    # bench/make_tokens.py's files (raw and llm.c) are token files stepgraph reads.
    mt=$(dirname "$0")/../bench/make_tokens.py
    for f in "" --llmc; do
        if python3 "$mt" "$tmp/mt.bin" --vocab 300 --tokens 4000 --seed $RANDOM $f >/dev/null; then
            expect 0 "done: 2 steps" -- train $v --data "$tmp/mt.bin" --steps 2
        else
            echo "FAIL: bench/make_tokens.py $f"; fails=$((fails + 1))
        fi
    done
else
    echo "FAIL: python3 could not write the token files"; fails=$((fails + 1))
fi
expect 0 "--val-data PATH" -- train --help
for cmd in train verify; do
    for f in "--loop " "--skip-if " "--stop-nonfinite N" "--stop-loss X" "--vary-seq " "--steps-per-graph K"; do
        expect 0 "^  $f" -- $cmd --help
    done
done
for cmd in train verify; do
    expect 0 "resnet, efficientnet: a digits file" -- $cmd --help
done
expect 0 "--vocab N +the checkpoint's model reads tokens below N" -- sample --help
for f in "--batch N" "--prompts FILE" "--prompt-len N" "--mode M" "--top-k K" "--stop TEXT" "--precision P" "--random-init " "--max-len N" "--repeat N" "--json "; do
    expect 0 "^  $f " -- sample --help
done
expect 0 "^  loop +\(default\) one launch for the whole generation: a graph holding the prefill" -- sample --help
expect 0 "WHILE conditional node" -- sample --help
# Saving: the target is checked before training (no step runs), and nothing is replaced that
# is not a regular file (a FIFO stands in for /dev/null, which a broken check would destroy).
m="--model mlp-32-2-8 --backend cpu --steps 20 --log-every 5"
expect 2 "--save: .*/missing/ck.safetensors" -- train $m --save "$tmp/missing/ck.safetensors"
expect 2 "--save: " -- train $m --save ''
expect 2 "--save: .*$tmp" -- train $m --save "$tmp"
mkfifo "$tmp/fifo"
expect 2 "--save: .*fifo" -- train $m --save "$tmp/fifo"
[ -p "$tmp/fifo" ] && pass "a FIFO save target is left as it was" || { echo "FAIL: the FIFO was replaced"; fails=$((fails + 1)); }
out=$("$bin" train $m --save "$tmp/missing/ck.safetensors" 2>&1)
if grep -q '^step ' <<<"$out"; then echo "FAIL: a bad --save target trained first: $out"; fails=$((fails + 1)); else pass "a bad --save target is refused before training"; fi
# --save-every writes periodic checkpoints; --metrics writes one JSON object a logged step.
out=$("$bin" train $m --save "$tmp/p.safetensors" --save-every 10 --metrics "$tmp/m.jsonl" 2>&1); rc=$?
if [ "$rc" != 0 ] || ! grep -q "^checkpoint $tmp/p.safetensors (step 10)$" <<<"$out" ||
   ! grep -q "^saved $tmp/p.safetensors (step 20)$" <<<"$out" || grep -q "(step 20)" <<<"$(grep '^checkpoint' <<<"$out")"; then
    echo "FAIL: --save-every: exit $rc: $out"; fails=$((fails + 1))
else
    pass "--save-every 10 wrote step 10, then the final save step 20"
fi
if python3 - "$tmp/m.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
run = lines[0]["run"]
assert run["model"] == "mlp-32-2-8" and run["scope"] == "eager" and run["backend"] == "cpu", run
steps = [l for l in lines[1:] if "loss" in l]
assert [l["step"] for l in steps] == [1, 5, 10, 15, 20], [l["step"] for l in steps]
for l in steps:
    assert l["loss"] > 0 and l["lr"] > 0 and l["loss_scale"] is None, l
for l in steps[1:]:
    assert l["ms_per_step"] > 0 and l["samples_per_s"] > 0, l
PY
then pass "--metrics: a run line, then steps 1, 5, 10, 15, 20 with loss, lr, ms/step, samples/s"; else echo "FAIL: --metrics file:"; cat "$tmp/m.jsonl"; fails=$((fails + 1)); fi
# A loss that turns non-finite in fp32 stops the run with an error and saves nothing.
out=$("$bin" train --model mlp-32-2-8 --backend cpu --optim sgd --lr 10 --steps 400 --log-every 1 --save "$tmp/nan.safetensors" 2>&1); rc=$?
if [ "$rc" != 1 ] || ! grep -Eq "the loss is (NaN|infinite) at step [0-9]+ \(fp32\): stopping" <<<"$out" || [ -e "$tmp/nan.safetensors" ]; then
    echo "FAIL: a diverging fp32 run: exit $rc: $(tail -n 3 <<<"$out")"; fails=$((fails + 1))
else
    pass "a diverging fp32 run stops with an error and writes no checkpoint"
fi
# Signals: SIGINT and SIGTERM finish the step in flight, save and exit 130 / 143. The log is
# read while the run goes on: stdout to a file is line-buffered.
for sig in INT TERM; do
    rm -f "$tmp/sig.safetensors" "$tmp/sig.log"
    "$bin" train --model mlp-32-2-8 --backend cpu --steps 100000000 --log-every 500 --save "$tmp/sig.safetensors" >"$tmp/sig.log" 2>&1 &
    pid=$!
    for _ in $(seq 300); do grep -q '^step ' "$tmp/sig.log" 2>/dev/null && break; sleep 0.1; done
    kill -s $sig $pid
    wait $pid; rc=$?
    want=$([ $sig = INT ] && echo 130 || echo 143)
    n=$(sed -nE "s/^stepgraph train: interrupted by SIG$sig after step ([0-9]+)$/\1/p" "$tmp/sig.log")
    if [ "$rc" != "$want" ] || [ -z "$n" ] || ! grep -q "^saved $tmp/sig.safetensors (step $n)$" "$tmp/sig.log" ||
       ! "$bin" train --model mlp-32-2-8 --backend cpu --steps 1 --resume "$tmp/sig.safetensors" 2>&1 | grep -q "at step $n$"; then
        echo "FAIL: SIG$sig: exit $rc (want $want):"; cat "$tmp/sig.log"; fails=$((fails + 1))
    else
        pass "SIG$sig: finished step $n, saved a checkpoint that resumes there, exit $rc"
    fi
done
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
    pass "--gpus 2 (CPU ranks) prints the loss curve of one process: $(tail -n 1 <<<"$one")"
fi
out=$(SG_DIST_INJECT_SEQ=1 "$bin" train $d --gpus 2 --bucket-mib 0.002 2>&1); rc=$?
if [ "$rc" != 1 ] || ! grep -q "rank 1 captured other collectives than rank 0" <<<"$out" ||
   ! grep -Eq "sg_dist_launch: rank [01] \(GPU [01]\) exited with status 1; stopped the other workers" <<<"$out"; then
    echo "FAIL: a failing rank: exit $rc: $out"; fails=$((fails + 1))
else
    pass "a failing rank is named and the run stops"
fi
# A sharded optimizer (--shard-optimizer): usage errors, then a bf16 GPT's checkpoint after 8
# steps, sharded over two CPU ranks, is byte for byte the unsharded run's (the state gathered
# whole), and a sharded run resumes from it.
expect 2 "--shard-optimizer are for data-parallel runs: add --gpus N" -- train --model mlp-32-2-16 --backend cpu --shard-optimizer
# With --clip the global norm is summed over the ranks' shares: the loss curve is the unsharded
# one (the norm's f64 sum runs in another order, far below the 4 printed decimals: one of them
# at most, where a value sits on a rounding boundary).
c="--model gpt-64-1-4-16 --backend cpu --gpus 2 --optim sgd --lr 0.1 --clip 0.05 --steps 8 --quiet"
last() { sed -n 's/.*loss [0-9.]* -> \([0-9.]*\),.*/\1/p' <<<"$1" | head -n 1; }
o1=$("$bin" train $c 2>&1); o2=$("$bin" train $c --shard-optimizer --scope step 2>&1)
l1=$(last "$o1"); l2=$(last "$o2")
if [ -z "$l1" ] || [ -z "$l2" ] || ! awk -v a="$l1" -v b="$l2" 'BEGIN { d = a - b; exit !(d <= 1.5e-4 && d >= -1.5e-4) }'; then
    echo "FAIL: --shard-optimizer --clip: final loss '$l2' against unsharded '$l1': $o2"; fails=$((fails + 1))
else
    pass "--shard-optimizer --clip on two CPU ranks: final loss $l2, unsharded $l1"
fi
tmp=$(mktemp -d)
g="--model gpt-64-1-4-16 --backend cpu --gpus 2 --precision bf16 --optim adamw --steps 8 --quiet"
"$bin" train $g --save "$tmp/plain.ckpt" >/dev/null 2>&1; rc1=$?
out=$("$bin" train $g --shard-optimizer --scope step --save "$tmp/shard.ckpt" 2>&1); rc2=$?
res=$("$bin" train $g --shard-optimizer --resume "$tmp/shard.ckpt" --steps 2 2>&1); rc3=$?
if [ "$rc1" != 0 ] || [ "$rc2" != 0 ] || ! cmp -s "$tmp/plain.ckpt" "$tmp/shard.ckpt" || [ "$rc3" != 0 ] ||
   ! grep -q "resumed from" <<<"$res"; then
    echo "FAIL: --shard-optimizer: exits $rc1 $rc2 $rc3, checkpoints $(cmp "$tmp/plain.ckpt" "$tmp/shard.ckpt" 2>&1 | head -1): $out $res"
    fails=$((fails + 1))
else
    pass "--shard-optimizer on two CPU ranks saves the unsharded run's checkpoint, byte for byte, and resumes"
fi
# With --accum 2 (the step's f32 sums reduce-scattered), at step scope: the same checkpoint again.
"$bin" train $g --accum 2 --save "$tmp/plain2.ckpt" >/dev/null 2>&1; rc1=$?
out=$("$bin" train $g --accum 2 --shard-optimizer --scope step --save "$tmp/shard2.ckpt" 2>&1); rc2=$?
if [ "$rc1" != 0 ] || [ "$rc2" != 0 ] || ! cmp -s "$tmp/plain2.ckpt" "$tmp/shard2.ckpt"; then
    echo "FAIL: --shard-optimizer --accum 2: exits $rc1 $rc2, checkpoints $(cmp "$tmp/plain2.ckpt" "$tmp/shard2.ckpt" 2>&1 | head -1): $out"
    fails=$((fails + 1))
else
    pass "--shard-optimizer --accum 2 saves the unsharded run's checkpoint, byte for byte"
fi
rm -rf "$tmp"
# ResNets (issue 12): verify under step scope (BatchNorm's running statistics compared), --classes
# checked, and the model's form in the unknown-model message.
expect 0 "OK: 5 steps match \(bit-exact\), 2 of them replayed from graphs; scope step" -- verify --model resnet18-2-32 --classes 10 --scope step --steps 5 --backend cpu
expect 2 "--classes .0. is not a whole number from 1" -- train --model resnet18-2-32 --classes 0 --backend cpu
expect 1 "classes are for image models" -- train --model mlp-32-2-8 --classes 10 --steps 1 --backend cpu
expect 2 "resnet50-BATCH-R" -- train --model resnet99-2-32 --steps 1 --backend cpu
expect 1 "expected R >= 29" -- train --model resnet18-2-16 --steps 1 --backend cpu
# scikit-learn's 8 x 8 digits (argument 2, the digits_data fixture's file): a ResNet trained on
# them prints a held-out loss that falls from chance (ln 10 = 2.30) by more than a quarter
# (measured: 2.30 -> 0.92..1.11 over seeds 1-3, 30 s), val_loss in --metrics at the first and
# the last step; verify and bench take the file; a corrupt one is refused naming line and column.
digits=${2:-}
if [ -z "$digits" ] || [ ! -r "$digits" ]; then
    echo "FAIL: no digits file '$digits' (argument 2: the digits_data fixture fetches it)"; fails=$((fails + 1))
else
    tmp=$(mktemp -d)
    out=$("$bin" train --model resnet18-16-32 --data "$digits" --backend cpu --steps 30 --lr 3e-4 --log-every 10 \
          --metrics "$tmp/d.jsonl" --quiet 2>&1); rc=$?
    v=$(sed -nE 's/^validation loss \(23 held-out batches\): ([0-9.]+) -> ([0-9.]+)$/\1 \2/p' <<<"$out")
    if [ "$rc" != 0 ] || [ -z "$v" ] || ! awk -v a="${v% *}" -v b="${v#* }" 'BEGIN { exit !(b < 0.75 * a) }'; then
        echo "FAIL: resnet18 on the digits: exit $rc, the held-out loss did not fall by a quarter: $out"; fails=$((fails + 1))
    elif ! python3 - "$tmp/d.jsonl" ${v% *} ${v#* } <<'PY'
import json, sys
vals = [(l["step"], l["val_loss"]) for l in map(json.loads, open(sys.argv[1])) if "val_loss" in l]
assert [s for s, _ in vals] == [0, 30], vals
assert abs(vals[0][1] - float(sys.argv[2])) < 1e-4 and abs(vals[1][1] - float(sys.argv[3])) < 1e-4, vals
PY
    then
        echo "FAIL: --metrics of the digits run:"; cat "$tmp/d.jsonl"; fails=$((fails + 1))
    else
        pass "resnet18-16-32 on the digits, 30 CPU steps: held-out loss ${v% *} -> ${v#* }, in --metrics at steps 0 and 30"
    fi
    expect 0 "OK: 5 steps match \(bit-exact\), 2 of them replayed from graphs; scope step" -- verify --model resnet18-2-32 --data "$digits" --scope step --steps 5 --backend cpu
    expect 0 "\"model\": \"resnet18-2-32\".*\"data\": \"$digits\"" -- bench --model resnet18-2-32 --data "$digits" --steps 2 --repeats 1 --warmup 1 --backend cpu --json
    expect 1 "the digits have 10 classes, the model 5" -- train --model resnet18-2-32 --data "$digits" --classes 5 --steps 1 --backend cpu
    printf '%s\n0,0,x\n' "$(head -n 1 "$digits")" > "$tmp/bad.csv"
    expect 1 "'$tmp/bad.csv': line 2, column 5 \(field 3\): 'x' is not a whole number" -- train --model resnet18-2-32 --data "$tmp/bad.csv" --steps 1 --backend cpu
    expect 1 "a data path for gpt and image models" -- train --model mlp-32-2-8 --data "$digits" --steps 1 --backend cpu
    rm -rf "$tmp"
fi
# The loss printed at the end is below the first.
out=$("$bin" train --model mlp-32-2-16 --steps 150 --backend cpu --lr 3e-3 --quiet 2>&1)
l=$(sed -nE 's/.*loss ([0-9.]+) -> ([0-9.]+).*/\1 \2/p' <<<"$out")
if ! awk -v a="${l% *}" -v b="${l#* }" 'BEGIN { exit !(b < a / 2) }'; then
    echo "FAIL: loss did not halve in 150 CPU steps: $out"; fails=$((fails + 1))
else
    pass "loss $l"
fi
echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
