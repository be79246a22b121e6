#!/usr/bin/env bash
# compare-speed.sh OLD NEW ROUNDS CASE...: ms/step of two stepgraph binaries (before and after a
# change) on each CASE (the options of `stepgraph train`, e.g. "--model mlp-512-6-32 --scope
# eager"), ROUNDS rounds alternating old and new (old first in odd rounds, new first in even
# ones, so neither always runs on a warmer machine): each run is `train CASE --steps STEPS
# --log-every STEPS` (STEPS from the environment, default 300), its ms/step as printed. Prints
# every run and, per case, both medians and new/old. Exit 1 if a run fails.
set -u
old=$1 new=$2 rounds=$3
shift 3
steps=${STEPS:-300}
bad=0
ms() { # BIN CASE: the ms/step the run prints
    # shellcheck disable=SC2086
    "$1" train $2 --steps "$steps" --log-every "$steps" 2>&1 | sed -nE 's/^done: .* ([0-9.]+) ms\/step.*/\1/p'
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for c in "$@"; do
    o=() n=()
    for ((r = 1; r <= rounds; r++)); do
        order="old new"
        [ $((r % 2)) = 0 ] && order="new old"
        for b in $order; do
            bin=$old
            [ $b = new ] && bin=$new
            v=$(ms "$bin" "$c")
            if [ -z "$v" ]; then echo "FAILED ($b): $c"; bad=1; continue; fi
            if [ $b = old ]; then o+=("$v"); else n+=("$v"); fi
        done
    done
    mo=$(printf '%s\n' "${o[@]}" | median) mn=$(printf '%s\n' "${n[@]}" | median)
    echo "$c | old: ${o[*]} | new: ${n[*]} | medians $mo $mn | new/old $(awk -v a="$mn" -v b="$mo" 'BEGIN { printf "%.3f", a / b }')"
done
exit $bad
