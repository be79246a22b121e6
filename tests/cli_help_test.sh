#!/usr/bin/env bash
# cli_help_test.sh BIN VERSION: what bench, sample, advise and trace say about themselves (each
# help text says what the command does and ends with its exit statuses), `--version` (CMake's
# project VERSION and a commit), and bench's JSON (written by sg_json): keys named after the
# table's columns, and every string escaped (a commit with a quote, a backslash, every kind of
# control character, UTF-8 and a byte that is not UTF-8), checked by Python's json module.
set -u
bin=$1
version=$2
fails=0
passes=0
pass() { echo "ok: $*"; passes=$((passes + 1)); }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
# shellcheck source=tests/expect.sh
. "$(dirname "$0")/expect.sh"
expect() { expect_cmd "stepgraph ${*:4}" "$1" "$2" -- "$bin" "${@:4}"; } # expect CODE REGEX -- ARGS...

# Each help: exit 0, its exit statuses (0, 1 and 2 named), and what the command does.
for cmd in bench sample advise trace; do
    expect 0 '^exit status: 0 .*, 1 a runtime error' -- $cmd --help
    out=$("$bin" $cmd --help 2>&1)
    tr '\n' ' ' <<<"$out" | grep -Eq 'exit status: 0 .*1 a runtime error.*2 a usage error' \
        && pass "$cmd --help names exit statuses 0, 1 and 2" || fail "$cmd --help lacks statuses 0, 1, 2"
done
expect 0 '--scope LIST' -- bench --help
expect 0 'under each capture' -- bench --help
if "$bin" bench --help | grep -q 'Times eager training steps'; then
    fail "bench --help says it times eager steps only, though it has --scope"
else
    pass "bench --help does not say 'eager steps' only"
fi
expect 0 'Generates text from a GPT checkpoint' -- sample --help
# --data also names the image models' digits file (docs/data.md), and --classes its default.
for cmd in bench advise trace; do
    expect 0 'resnet, efficientnet: a digits file' -- $cmd --help
    expect 0 '1000; 10 with a digits file as --data' -- $cmd --help
done
# --accum, gradient accumulation, on every command that trains.
for cmd in bench advise trace; do
    expect 0 '--accum K +gradient accumulation' -- $cmd --help
done
# --optim-state, the AdamW moments' dtype, on every command that trains.
for cmd in train bench verify advise trace; do
    expect 0 "--optim-state D +f32 (\\(default\\) )?or bf16" -- $cmd --help
done
# The control-flow options (issue 13) on every command that trains; the length and launch
# options where they apply; bench's forced overflows.
for cmd in bench advise trace; do
    expect 0 '--loop +step scope: repeated work as a WHILE node' -- $cmd --help
    expect 0 '--skip-if +bf16, step scope' -- $cmd --help
    expect 0 '--stop-nonfinite N +stop when the loss was not finite' -- $cmd --help
    expect 0 '--stop-loss X +stop when a step' -- $cmd --help
done
for cmd in bench advise; do
    expect 0 '--vary-seq ' -- $cmd --help
    expect 0 '--seq-lens L ' -- $cmd --help
    expect 0 '--steps-per-graph K ' -- $cmd --help
done
expect 0 '--overflow-every N +bf16: force an overflow every N steps' -- bench --help
expect 0 'version' -- --help

# --version and version: "stepgraph VERSION (commit HASH)", VERSION CMake's own.
for v in --version version; do
    expect 0 "^stepgraph ${version//./\\.} \\(commit [0-9a-f]{7,40}|unknown\\)\$" -- $v
done
out=$(SG_COMMIT=abc1234 "$bin" --version)
[ "$out" = "stepgraph $version (commit abc1234)" ] && pass "SG_COMMIT names the commit" \
    || fail "SG_COMMIT=abc1234 --version printed '$out'"
expect 2 'takes no arguments' -- --version extra
out=$("$bin" 2>/dev/null); rc=$?
[ $rc = 2 ] && [ -z "$out" ] && pass "no command: usage on stderr, exit 2" \
    || fail "no command: exit $rc, stdout '$out' (want 2 and usage on stderr only)"

# A model name with a quote: refused up front as a usage error, nothing on stdout (so no line
# that is not JSON), the name quoted in the message.
out=$("$bin" bench --model 'mlp-64-2-32"x' --json --backend cpu --steps 3 --repeats 1 --warmup 2 2>/dev/null); rc=$?
[ $rc = 2 ] && [ -z "$out" ] && pass "bench refuses 'mlp-64-2-32\"x' (exit 2, no JSON)" \
    || fail "bench --model 'mlp-64-2-32\"x': exit $rc, stdout '$out'"
expect 2 "unknown model 'mlp-64-2-32\"x'" -- bench --model 'mlp-64-2-32"x' --json --backend cpu
# Next to a good model the bad one still fails the whole command before anything runs.
out=$("$bin" bench --model 'mlp-8-1-4,mlp-64-2-32"x' --json --backend cpu --steps 3 --repeats 1 --warmup 2 2>/dev/null)
rc=$?
[ $rc = 2 ] && [ -z "$out" ] && pass "bench 'mlp-8-1-4,mlp-64-2-32\"x': exit 2, no JSON" \
    || fail "bench 'mlp-8-1-4,mlp-64-2-32\"x': exit $rc, stdout '$out'"
# advise --json without a GPU: exit 1, the reason on stderr, nothing on stdout.
out=$("$bin" advise --model 'mlp-64-2-32"x' --json --backend cpu 2>/dev/null); rc=$?
[ $rc = 1 ] && [ -z "$out" ] && pass "advise --json --backend cpu: exit 1, no JSON" \
    || fail "advise --json --backend cpu: exit $rc, stdout '$out'"
expect 2 "unknown model 'mlp-8-1-4x'" -- bench --model mlp-8-1-4,mlp-8-1-4x --backend cpu

# bench --json: valid JSON whatever the strings hold, keys as the table's columns.
if ! command -v python3 >/dev/null; then
    echo "$passes passed, $fails failed; SKIP: bench's JSON checks need python3"
    [ "$fails" = 0 ] && exit 77
    exit 1
fi
# The commit: a quote, a backslash, tab, \x01, \x1f, DEL, an e-acute and a stray 0xff byte.
commit=$(printf 'ab"c\\d\te\001\037\177\303\251\377')
json=$(SG_COMMIT="$commit" "$bin" bench --model mlp-32-2-8 --backend cpu --steps 3 --repeats 1 --warmup 2 \
    --scope eager,step --json 2>/dev/null); rc=$?
[ $rc = 0 ] && pass "bench --json ran (exit 0)" || fail "bench --json: exit $rc"
check=$(python3 -c '
import json, os, sys
# What the writer makes of the bytes: UTF-8 kept, a byte that is not UTF-8 read as U+FFFD.
want_commit = os.fsencode(sys.argv[1]).replace(b"\xff", "\ufffd".encode()).decode()
rows = [json.loads(l) for l in sys.stdin.buffer.read().decode().splitlines()]
assert len(rows) == 2, f"{len(rows)} rows, want 2 (eager, step)"
for r in rows:
    assert "mode" not in r, "key mode (the column is scope)"
    for k in ("model", "scope", "ms_per_step", "host_ms_per_step", "kernels_per_step",
              "gpu_busy_ms_per_step", "graph_nodes", "allocs_per_100_steps", "peak_mib", "commit", "accum",
              "steps_per_graph", "loop", "skip_if", "vary_seq", "stop_nonfinite", "stop_loss",
              "overflow_every", "cond_note", "capture_ms", "instantiate_ms"):
        assert k in r, f"no key {k}: {sorted(r)}"
    got = r["commit"]
    assert got == want_commit, f"commit {got!r}, want {want_commit!r}"
assert [r["scope"] for r in rows] == ["eager", "step"], [r["scope"] for r in rows]
print("ok")
' "$commit" <<<"$json" 2>&1)
[ "$check" = ok ] && pass "bench --json: valid, scope (not mode), escaped commit round-trips" \
    || { fail "bench --json: $check"; echo "$json" | head -5; }
# The table's header names the same columns.
hdr=$("$bin" bench --model mlp-32-2-8 --backend cpu --steps 3 --repeats 1 --warmup 2 2>/dev/null | head -1)
grep -Eq '^model +scope +ms/step +host ms +kernels +busy ms +capt ms +nodes +alloc/100 +peak MiB$' <<<"$hdr" \
    && pass "bench table header: $hdr" || fail "bench table header: '$hdr'"

echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
