#!/usr/bin/env bash
# trace_test.sh TEST_PROF STEPGRAPH: the trace export and `stepgraph trace`'s contract, without
# a GPU. test_prof writes the trace of a synthetic window and says what it holds; check_trace.py
# parses it as a viewer would. Then the command's help, usage errors (exit 2) and runtime
# errors (exit 1: a path that cannot be written, no GPU, --gpus 2 without two GPUs). Exit 77
# (skipped) without python3.
set -u
test_prof=$1
bin=$2
here=$(cd "$(dirname "$0")" && pwd)
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# shellcheck source=tests/expect.sh
. "$(dirname "$0")/expect.sh"
expect() { expect_cmd "stepgraph ${*:4}" "$1" "$2" -- "$bin" "${@:4}"; } # expect CODE REGEX -- ARGS...

expect 0 'usage: stepgraph trace' -- trace --help
expect 0 'trace    write a Perfetto' -- --help
expect 2 "--model, --scope and --out are required" -- trace --model mlp-16-1-4 --scope step
expect 2 "--scope 'graph': expected eager, layer, model or step" -- trace --model mlp-16-1-4 --scope graph --out "$tmp/t.json"
expect 2 "--steps '0' is not a whole number" -- trace --model mlp-16-1-4 --scope step --out "$tmp/t.json" --steps 0
expect 2 "unknown option '--bogus'" -- trace --model mlp-16-1-4 --scope step --out "$tmp/t.json" --bogus
expect 2 "--backend cpu: trace needs a CUDA GPU and CUPTI" -- trace --model mlp-16-1-4 --scope step --out "$tmp/t.json" --backend cpu
expect 1 "--out '/nonexistent-dir/t.json': cannot write there" -- trace --model mlp-16-1-4 --scope step --out /nonexistent-dir/t.json
# --gpus N: a data-parallel step, rank 0 traced; its options checked before any rank starts.
expect 0 '--gpus N +trace a data-parallel step' -- trace --help
expect 0 '--bucket-mib X' -- trace --help
expect 2 "--gpus '0' is not a whole number from 1 to 64" -- trace --model mlp-16-1-4 --scope step --out "$tmp/t.json" --gpus 0
expect 2 "--gpus '-2' is not a whole number from 1 to 64" -- trace --model mlp-16-1-4 --scope step --out "$tmp/t.json" --gpus -2
expect 2 "--bucket-mib and --shard-optimizer are for data-parallel runs: add --gpus N" -- trace --model mlp-16-1-4 --scope step --out "$tmp/t.json" --bucket-mib 4
expect 2 "--shard-optimizer are for data-parallel runs: add --gpus N" -- trace --model mlp-16-1-4 --scope step --out "$tmp/t.json" --shard-optimizer
expect 2 "--gpus 3: the global batch 4 of mlp-16-1-4 does not split into 3 equal parts" -- trace --model mlp-16-1-4 --scope step --out "$tmp/t.json" --gpus 3
expect 2 "--gpus does not combine with --stop-nonfinite or --stop-loss" -- trace --model mlp-16-1-4 --scope step --out "$tmp/t.json" --gpus 2 --stop-loss 1
if [ ! -e "$tmp/t.json" ]; then echo "ok: no file left by failed runs"; else echo "FAIL: a failed run left $tmp/t.json"; fails=$((fails + 1)); fi
# Without a usable GPU (this machine, in CI) the command says what it needs; with one it writes.
# So does --gpus 2, in bounded time (timeout: 124 if it hung); with one GPU the rank that has
# none is named. --optim-state bf16 travels to the ranks in their command line.
for dp in "" "--gpus 2" "--optim-state bf16" "--gpus 2 --optim-state bf16"; do
    rm -f "$tmp/gpu.json"
    # shellcheck disable=SC2086
    out=$(timeout 60 "$bin" trace --model mlp-16-1-4 --scope step --out "$tmp/gpu.json" --steps 2 $dp 2>&1); rc=$?
    if [ "$rc" = 1 ] && grep -Eq "trace needs a CUDA GPU and CUPTI|rank [01] " <<<"$out"; then
        echo "ok: stepgraph trace $dp without a GPU or CUPTI: $(tail -n 1 <<<"$out")"
    elif [ "$rc" = 0 ] && [ -s "$tmp/gpu.json" ]; then
        echo "ok: stepgraph trace $dp on a GPU wrote $(wc -c <"$tmp/gpu.json") bytes"
    else
        echo "FAIL: stepgraph trace --steps 2 $dp: exit $rc (want 1 without a GPU): $out"; fails=$((fails + 1))
    fi
done

skip=0
out=$("$test_prof" trace "$tmp/synthetic.json"); rc=$?
expect_args=$(sed -n 's/^expect: //p' <<<"$out")
if [ "$rc" != 0 ] || [ -z "$expect_args" ]; then
    echo "FAIL: test_prof trace: exit $rc: $out"; fails=$((fails + 1))
elif ! command -v python3 >/dev/null 2>&1; then
    echo "SKIP: no python3 to run check_trace.py (test_prof cpu parses traces in C)"; skip=1
else
    # shellcheck disable=SC2086
    if python3 "$here/check_trace.py" "$tmp/synthetic.json" $expect_args; then
        echo "ok: check_trace.py accepts the synthetic trace"
    else
        fails=$((fails + 1))
    fi
    # ... and rejects a broken one.
    printf '{"traceEvents": [{"ph": "X", "name": "k", "ts": -1, "dur": 2, "pid": 2, "tid": 7}]}' >"$tmp/bad.json"
    if python3 "$here/check_trace.py" "$tmp/bad.json" >/dev/null 2>&1; then
        echo "FAIL: check_trace.py accepted a negative ts"; fails=$((fails + 1))
    else
        echo "ok: check_trace.py rejects a negative ts"
    fi
    # scripts/overlap.py on a window drawn here: compute kernels on one stream, NCCL kernels on
    # another, their overlap, gaps and idle time known by construction (one step, microseconds).
    python3 - "$tmp/dp.json" <<'PY' >"$tmp/dp.want"
import json, random, sys
random.seed()
ev = [{"ph": "M", "name": "process_name", "pid": 9, "args": {"name": "GPU 0"}}]
t, comp, comm, idle, exposed, cgaps = 0.0, 0.0, 0.0, 0.0, 0.0, []
for i in range(random.randint(3, 9)):
    d = random.randint(5, 40)
    ev.append({"ph": "X", "name": f"gemm_{i}", "ts": t, "dur": d, "pid": 9, "tid": 1})
    comp += d
    if random.random() < 0.6:  # an all-reduce beside it, past its end by x
        x = random.randint(0, 10)
        ev.append({"ph": "X", "name": "ncclDevKernel_AllReduce", "ts": t + 1, "dur": d - 1 + x, "pid": 9, "tid": 2})
        comm += d - 1 + x
        exposed += x
        t += d + x
    else:
        t += d
        x = 0
    g = random.randint(1, 6)
    t += g
    idle += g
    cgaps.append(x + g)  # from this compute kernel's end to the next one's start
ev.append({"ph": "X", "name": "optim", "ts": t, "dur": 7, "pid": 9, "tid": 1})
comp += 7
json.dump({"traceEvents": ev}, open(sys.argv[1], "w"))
cgaps.sort()
n = len(cgaps)
med = cgaps[n // 2] if n % 2 else (cgaps[n // 2 - 1] + cgaps[n // 2]) / 2
print(f"{t + 7:.1f} {comp:.1f} {comm:.1f} {exposed:.1f} {idle:.1f} {med:.2f}")
PY
    got=$(python3 "$here/../scripts/overlap.py" "$tmp/dp.json" 1 | awk '/window/{w=$2} /compute kernels, summed/{c=$4}
        /NCCL kernels, summed/{n=$4} /NCCL exposed/{e=$(NF-3)} /GPU idle/{i=$3} /median gap/{m=$(NF-1)}
        END{printf "%s %s %s %s %s %s", w, c, n, e, i, m}')
    if [ "$got" = "$(cat "$tmp/dp.want")" ]; then
        echo "ok: overlap.py: window, compute, NCCL, exposed and idle us and the median compute gap as drawn ($got)"
    else
        echo "FAIL: overlap.py gave '$got', the drawn window holds '$(cat "$tmp/dp.want")'"; fails=$((fails + 1))
    fi
fi
echo "trace_test: $fails failed"
[ "$fails" = 0 ] || exit 1
[ "$skip" = 0 ] || exit 77
