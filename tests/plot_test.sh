#!/usr/bin/env bash
# plot_test.sh SRC: bench/plot.py's contract: clear errors for a missing file and for files
# without rows, then both charts (non-empty PNGs) from the measured data in bench/data/ (rows
# that name their scope "scope", as bench --json writes now, among them); then `plot.py loss`
# on generated metrics files (a run header line, val_loss on some lines, a truncated last
# line). Skips (77) without python3, or, after the error checks, without matplotlib.
set -u
src=$1
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
plot="python3 $src/bench/plot.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
# shellcheck source=tests/expect.sh
. "$(dirname "$0")/expect.sh"
# shellcheck disable=SC2086
expect() { expect_cmd "plot.py ${*:4}" "$1" "$2" -- $plot "${@:4}"; } # expect CODE REGEX -- ARGS...
expect 0 'usage: plot.py' -- --help
expect 2 "$tmp/none.jsonl: no such file" -- --out "$tmp" "$tmp/none.jsonl"
echo "not json" > "$tmp/log.txt"
expect 1 "no benchmark rows in $tmp/log.txt" -- --out "$tmp" "$tmp/log.txt"
echo '{"framework": "stepgraph", "model"' > "$tmp/bad.jsonl"
expect 1 "bad.jsonl:1: not a JSON object" -- --out "$tmp" "$tmp/bad.jsonl"
# Metrics files of `stepgraph train --metrics`: two runs, one killed mid-line.
python3 - "$tmp" <<'PY'
import json, math, sys
d = sys.argv[1]
for name, scope, kill in (("eager", "eager", False), ("step", "step", True)):
    with open(f"{d}/{name}.jsonl", "w") as f:
        f.write(json.dumps({"run": {"model": "mlp-64-2-32", "scope": scope, "precision": "fp32",
                                    "backend": "cpu"}}) + "\n")
        for s in range(10, 210, 10):
            row = {"step": s, "loss": 2.3 * math.exp(-s / 80), "lr": 1e-3, "loss_scale": None,
                   "ms_per_step": 0.5, "samples_per_s": 64000.0}
            if s % 50 == 0:
                row["val_loss"] = row["loss"] * 1.1
            f.write(json.dumps(row) + "\n")
        if kill:
            f.write('{"step": 210, "loss": 0.16, "lr"')  # no newline: killed while writing
PY
printf '{"run": {"model": "m"}}\n{"step": 1, "loss": 2.0}\n{"step": 2, "lo\n{"step": 3, "loss": 1.0}\n' > "$tmp/mid.jsonl"
expect 1 "mid.jsonl:3: not a JSON object" -- loss -o "$tmp/x.png" "$tmp/mid.jsonl"
expect 1 "no loss rows in $tmp/log.txt" -- loss -o "$tmp/x.png" "$tmp/log.txt"
expect 2 "$tmp/none.jsonl: no such file" -- loss "$tmp/none.jsonl"
if ! python3 -c "import matplotlib" 2>/dev/null; then
    echo "$((7 - fails)) passed, $fails failed; SKIP: the charts need matplotlib (pip install matplotlib)"
    [ "$fails" = 0 ] && exit 77
    exit 1
fi
# bench/data's rows, and one row as bench --json writes it now ("scope", not "mode").
sed 's/"mode": "eager"/"scope": "eager"/' "$src"/bench/data/2026-11-22-h100-gpt-256-4-8-128.jsonl > "$tmp/scope.jsonl"
grep -q '"framework": "stepgraph", "model": "[^"]*", "scope"' "$tmp/scope.jsonl" \
    || { echo "FAIL: no stepgraph row with \"scope\" made for the test"; fails=$((fails + 1)); }
expect 0 "wrote $tmp/img/launch_overhead.png" -- --out "$tmp/img" "$src"/bench/data/*.jsonl "$tmp/scope.jsonl"
expect 0 "wrote $tmp/loss/loss.png \(2 runs\)" -- loss -o "$tmp/loss/loss.png" "$tmp/eager.jsonl" "$tmp/step.jsonl"
out=$($plot loss -o "$tmp/loss/loss.png" "$tmp/eager.jsonl" "$tmp/step.jsonl" 2>&1)
grep -q "step.jsonl:22: skipped a truncated last line" <<<"$out" \
    && echo "ok: the truncated last line is skipped with a note" \
    || { echo "FAIL: no note on the truncated line: $out"; fails=$((fails + 1)); }
for f in img/ms_per_step img/launch_overhead loss/loss; do
    if [ -s "$tmp/$f.png" ] && [ "$(head -c 4 "$tmp/$f.png" | tail -c 3)" = PNG ]; then
        echo "ok: $f.png, $(wc -c < "$tmp/$f.png") bytes"
    else
        echo "FAIL: $f.png missing, empty or not a PNG"; fails=$((fails + 1))
    fi
done
echo "$((13 - fails)) passed, $fails failed"
[ "$fails" = 0 ]
