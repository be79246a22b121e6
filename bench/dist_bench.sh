#!/usr/bin/env bash
# dist_bench.sh: data-parallel throughput of stepgraph, per-GPU batch fixed: for each model
# (WIDTH-DEPTH-SEQ with a per-GPU batch), each GPU count and each scope, runs
# `stepgraph train --gpus N` (plain `train` for the 1-GPU baseline) and prints one JSON line
# with ms/step and global tokens/s, as bench/torch_ddp.py does for PyTorch DDP.
#
#   bench/dist_bench.sh STEPGRAPH [--models "768-12-256 256-4-128"] [--batch 8] [--gpus "1 2"]
#                       [--scopes "eager step"] [--steps 100] [--precision fp32] [--shard]
#
# --shard: the runs of 2 or more GPUs with --shard-optimizer (their JSON says "sharded": true).
set -euo pipefail
SG=${1:?usage: bench/dist_bench.sh STEPGRAPH [options] (see the header)}
shift
MODELS="768-12-256 256-4-128" BATCH=8 GPUS="1 2" SCOPES="eager step" STEPS=100 PREC=fp32 SHARD=0
while [ $# -gt 0 ]; do
    case "$1" in
    --models) MODELS=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --gpus) GPUS=$2; shift 2 ;;
    --scopes) SCOPES=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --precision) PREC=$2; shift 2 ;;
    --shard) SHARD=1; shift ;;
    *) echo "dist_bench.sh: unknown option '$1'" >&2; exit 2 ;;
    esac
done
for m in $MODELS; do
    IFS=- read -r W D T <<<"$m"
    for n in $GPUS; do
        for s in $SCOPES; do
            name="gpt-$W-$D-$((BATCH * n))-$T"
            args=(train --model "$name" --scope "$s" --steps "$STEPS" --quiet --precision "$PREC")
            [ "$n" -gt 1 ] && args+=(--gpus "$n")
            sharded=false
            [ "$n" -gt 1 ] && [ "$SHARD" = 1 ] && args+=(--shard-optimizer) && sharded=true
            if ! out=$("$SG" "${args[@]}" 2>&1); then
                printf '{"framework": "stepgraph", "model": "gpt-%s-%s-%s-%s", "gpus": %s, "scope": "%s", "precision": "%s", "error": "%s"}\n' \
                    "$W" "$D" "$BATCH" "$T" "$n" "$s" "$PREC" "$(echo "$out" | tail -n 1 | tr '"' "'")"
                continue
            fi
            ms=$(echo "$out" | sed -n 's/.* \([0-9.]*\) ms\/step.*/\1/p' | head -n 1)
            python3 - "$W" "$D" "$BATCH" "$T" "$n" "$s" "$PREC" "$ms" "$sharded" <<'PY'
import json, sys
w, d, b, t, n, s, p, ms, sharded = sys.argv[1:]
ms = float(ms)
print(json.dumps({"framework": "stepgraph", "model": f"gpt-{w}-{d}-{b}-{t}", "per_gpu_batch": int(b),
                  "seq": int(t), "gpus": int(n), "scope": s, "precision": p, "ms_per_step": ms,
                  "tokens_per_s": int(n) * int(b) * int(t) / (ms / 1000.0), "sharded": sharded == "true"}))
PY
        done
    done
done
