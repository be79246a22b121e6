#!/usr/bin/env bash
# compare-builtins.sh OLD NEW [--gpu]: trains the built-in models 50 steps with fixed seeds
# under every scope with two stepgraph binaries (before and after a change) and checks that the
# checkpoints (parameters, optimizer state, generator, loss scaler) are identical byte for byte.
# Exit 1 when any differs. issue 11: the built-ins rebuilt on the public API.
set -u
old=$1 new=$2
cases=("--model mlp-64-3-16 --scope eager" "--model mlp-64-3-16 --scope layer" "--model mlp-64-3-16 --scope model"
       "--model mlp-64-3-16 --scope step" "--model gpt-64-2-4-32 --scope eager"
       "--model gpt-64-2-4-32 --scope step --dropout 0.1" "--model gpt-64-2-4-32 --scope layer --precision bf16"
       "--model gpt-64-2-4-32 --scope model --precision bf16 --dropout 0.1")
[ "${3:-}" = --gpu ] && cases+=("--model mlp-512-6-32 --scope step" "--model gpt-256-4-8-128 --scope step"
                               "--model gpt-256-4-8-128 --scope step --precision bf16")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bad=0
for c in "${cases[@]}"; do
  for b in old new; do
    bin=$old; [ $b = new ] && bin=$new
    # shellcheck disable=SC2086
    "$bin" train $c --steps 50 --seed 7 --log-every 50 --save "$tmp/$b.st" > "$tmp/$b.log" 2>&1 ||
      { echo "FAILED ($b): $c"; tail -3 "$tmp/$b.log"; bad=1; }
  done
  if cmp -s "$tmp/old.st" "$tmp/new.st"; then echo "identical: $c"; else echo "DIFFER: $c"; bad=1; fi
  rm -f "$tmp"/*.st
done
exit $bad
