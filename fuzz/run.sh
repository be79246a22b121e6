#!/usr/bin/env bash
# fuzz/run.sh BUILD_DIR [TARGET...]: runs each libFuzzer target of BUILD_DIR (built with
# -DSG_FUZZ=ON, see make fuzz) for FUZZ_TIME seconds (default 60) on a scratch copy of its
# seed corpus fuzz/corpus/<target> (the repository is never written), all targets at once.
# Fails if any target finds a crash, leak, timeout (FUZZ_TIMEOUT s per input, default 10) or
# goes past FUZZ_RSS_MB (default 2048), printing the reproducer (BUILD_DIR/fuzz-artifacts/<target>/,
# emptied at each run) and how to replay it. Targets: every fuzz/fuzz_*.c by default.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: fuzz/run.sh BUILD_DIR [TARGET...]}
shift
time_s=${FUZZ_TIME:-60}
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    for f in fuzz/fuzz_*.c; do t=${f#fuzz/fuzz_}; targets+=("${t%.c}"); done
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/sg-fuzz-run.XXXXXX")
trap 'rm -rf "$work"' EXIT
artifacts=$(cd "$build" && pwd)/fuzz-artifacts
mkdir -p "$artifacts"

# LeakSanitizer on; libFuzzer reports the first error of each kind and stops.
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:print_stacktrace=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

declare -A pid
for t in "${targets[@]}"; do
    exe=$build/fuzz/fuzz_$t
    [ -x "$exe" ] || { echo "fuzz: $exe not built (make fuzz builds it)"; exit 1; }
    rm -rf "${artifacts:?}/$t"
    mkdir -p "$work/$t/corpus" "$artifacts/$t"
    cp fuzz/corpus/"$t"/* "$work/$t/corpus/"
    dict=()
    [ -f "fuzz/$t.dict" ] && dict=(-dict="fuzz/$t.dict")
    echo "fuzz: $t for ${time_s} s on $(ls "$work/$t/corpus" | wc -l) seeds"
    "$exe" -max_total_time="$time_s" -timeout="${FUZZ_TIMEOUT:-10}" \
        -rss_limit_mb="${FUZZ_RSS_MB:-2048}" -print_final_stats=1 \
        -artifact_prefix="$artifacts/$t/" "${dict[@]}" "$work/$t/corpus" \
        >"$work/$t.log" 2>&1 &
    pid[$t]=$!
done

failed=0
for t in "${targets[@]}"; do
    wait "${pid[$t]}"
    rc=$?
    cp "$work/$t.log" "$artifacts/$t.log"
    stats=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$work/$t.log" | tail -1)
    if [ "$rc" -eq 0 ]; then
        echo "fuzz: $t: nothing found (${stats:-no stats}); log $artifacts/$t.log"
        continue
    fi
    failed=1
    echo "fuzz: $t FAILED (exit $rc); the end of its log ($artifacts/$t.log):"
    tail -n 60 "$work/$t.log" | sed 's/^/    /'
    for r in "$artifacts/$t"/*; do
        [ -f "$r" ] || continue
        echo "fuzz: $t: reproducer $r"
        echo "      replay: $build/fuzz/fuzz_$t $r   (or build/fuzz/fuzz_${t}_replay $r)"
    done
done
exit $failed
