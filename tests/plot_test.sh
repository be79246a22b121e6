#!/usr/bin/env bash
# plot_test.sh SRC: bench/plot.py's contract: clear errors for a missing file and for files
# without rows, then both charts (non-empty PNGs) from the measured data in bench/data/.
# Skips (77) without python3, or, after the error checks, without matplotlib.
set -u
src=$1
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
plot="python3 $src/bench/plot.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
expect() { # expect CODE REGEX -- ARGS...
    local code=$1 re=$2; shift 3
    out=$($plot "$@" 2>&1); rc=$?
    if [ "$rc" != "$code" ] || ! grep -Eq -- "$re" <<<"$out"; then
        echo "FAIL: plot.py $* -> exit $rc (want $code), output lacks /$re/:"; echo "$out" | head -20
        fails=$((fails + 1))
    else
        echo "ok: plot.py $*"
    fi
}
expect 0 'usage: plot.py' -- --help
expect 2 "$tmp/none.jsonl: no such file" -- --out "$tmp" "$tmp/none.jsonl"
echo "not json" > "$tmp/log.txt"
expect 1 "no benchmark rows in $tmp/log.txt" -- --out "$tmp" "$tmp/log.txt"
echo '{"framework": "stepgraph", "model"' > "$tmp/bad.jsonl"
expect 1 "bad.jsonl:1: not a JSON object" -- --out "$tmp" "$tmp/bad.jsonl"
if ! python3 -c "import matplotlib" 2>/dev/null; then
    echo "$((4 - fails)) passed, $fails failed; SKIP: the charts need matplotlib (pip install matplotlib)"
    [ "$fails" = 0 ] && exit 77
    exit 1
fi
expect 0 "wrote $tmp/img/launch_overhead.png" -- --out "$tmp/img" "$src"/bench/data/*.jsonl
for f in ms_per_step launch_overhead; do
    if [ -s "$tmp/img/$f.png" ] && [ "$(head -c 4 "$tmp/img/$f.png" | tail -c 3)" = PNG ]; then
        echo "ok: $f.png, $(wc -c < "$tmp/img/$f.png") bytes"
    else
        echo "FAIL: $f.png missing, empty or not a PNG"; fails=$((fails + 1))
    fi
done
echo "$((7 - fails)) passed, $fails failed"
[ "$fails" = 0 ]
