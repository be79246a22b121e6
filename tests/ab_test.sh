#!/usr/bin/env bash
# ab_test.sh SRC: scripts/ab.sh's contract on the CPU backend: --help and the usage errors (no
# REF, an unknown option, --env without NAME VAR=VALUE, --rounds without a count: exit 2; a ref
# git does not know: exit 1);
# HEAD against HEAD built twice without CUDA (A=HEAD B=HEAD, two trees from `git archive`), a
# short mlp run of each: the checkpoints the same bit for bit ("0 differ", exit 0), a time from
# every run, each build's median and its ratio to A's; the two binaries given as paths (used as
# they are), with the options after them and --rounds 0 (checkpoints only, no timing line);
# --env on a second name for the same ref (built once; the unfused attention's
# checkpoint differs, exit 2); and a run of another seed, which the comparison must tell apart.
# Skips (77) outside a git checkout or without python3.
set -u
src=$1
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
git -C "$src" rev-parse HEAD >/dev/null 2>&1 || { echo "SKIP: $src is not a git checkout"; exit 77; }
ab=$src/scripts/ab.sh
cd "$src" || exit 1 # ab.sh finds the repository from the working directory
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
# shellcheck source=tests/expect.sh
. "$(dirname "$0")/expect.sh"
expect() { expect_cmd "ab.sh ${*:4}" "$1" "$2" -- "$ab" --work "$tmp/w" "${@:4}"; } # expect CODE REGEX -- ARGS...
expect 0 'ab.sh \[options\] REF' -- --help
expect 2 'no REF given' --
expect 2 'unknown option --bogus' -- --bogus HEAD
expect 1 'no such ref: no-such-ref-here' -- no-such-ref-here
expect 2 '--env takes NAME VAR=VALUE' -- --env B HEAD
expect 2 "--rounds takes a count, not 'two'" -- --rounds two HEAD
cpu=(--cmake-args "-DSG_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=Release" --models mlp-32-2-8 --precisions fp32
     --steps 20 --ckpt-steps 5 --rounds 2 --train-args "--scope step --backend cpu")
expect 0 'mlp-32-2-8 fp32: B against A: [0-9]+ tensors, 0 differ' -- "${cpu[@]}" A=HEAD B=HEAD
# two timing lines, each with two runs, their median and its ratio to A's (A's own: 1.000)
n=$(grep -Ec '^  mlp-32-2-8 fp32 [AB]: [0-9.]+ [0-9.]+ \| median [0-9.]+, [0-9.]+ of A$' <<<"$out")
[ "$n" = 2 ] || { echo "FAIL: expected 2 timing lines of 2 runs, found $n:"; echo "$out"; fails=$((fails + 1)); }
grep -Eq '^  mlp-32-2-8 fp32 A: .*, 1\.000 of A$' <<<"$out" || { echo "FAIL: A's ratio to itself is not 1.000"; fails=$((fails + 1)); }
# binaries as they are: the two just built, no build; the options after the REFs, no timing
cp "$tmp/w/bin/A" "$tmp/a.bin" && cp "$tmp/w/bin/B" "$tmp/b.bin"
expect 0 'mlp-32-2-8 fp32: Y against X: [0-9]+ tensors, 0 differ' -- X="$tmp/a.bin" Y="$tmp/b.bin" "${cpu[@]}" --rounds 0
grep -q "built Y: $tmp/b.bin as it is" <<<"$out" || { echo "FAIL: Y was not used as it is:"; echo "$out"; fails=$((fails + 1)); }
if ! grep -q 'no timing (--rounds 0)' <<<"$out" || grep -q 'median' <<<"$out"; then
    echo "FAIL: --rounds 0 timed or did not say so:"; echo "$out"; fails=$((fails + 1))
fi
# --env: B is A's build (built once), run with the unfused attention, whose sums differ
expect 2 'gpt-64-1-2-8 fp32: B against A: [0-9]+ tensors, [1-9][0-9]* differ' -- "${cpu[@]}" --models gpt-64-1-2-8 \
    --env B STEPGRAPH_ATTENTION=unfused A=HEAD B=HEAD
grep -q 'built B: the build of A, run with STEPGRAPH_ATTENTION=unfused' <<<"$out" ||
    { echo "FAIL: B was not A's build run with the switch:"; echo "$out"; fails=$((fails + 1)); }
# the comparison can tell: a run from another seed differs from A's checkpoint
if "$tmp/w/bin/A" train --model mlp-32-2-8 --steps 5 --scope step --backend cpu --seed 2 --quiet \
    --save "$tmp/seed2.safetensors" > /dev/null 2>&1; then
    d=$(python3 "$src/scripts/ckpt_same.py" "$tmp/w/A.mlp-32-2-8.fp32.safetensors" "$tmp/seed2.safetensors")
    rc=$?
    if ! grep -Eq '[0-9]+ tensors, [1-9][0-9]* differ' <<<"$d" || [ $rc != 1 ]; then
        echo "FAIL: another seed's checkpoint compared as: $d (exit $rc)"; fails=$((fails + 1))
    fi
else
    echo "FAIL: the seed-2 run failed"; fails=$((fails + 1))
fi
[ "$fails" = 0 ] && echo "ab_test: all passed"
exit $((fails > 0))
