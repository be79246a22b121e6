#!/usr/bin/env bash
# nccl_graph_gap.sh: why a captured step with NCCL kernels in it starts every kernel about 0.3 us
# later (bench/RESULTS.md, session 29). For a gpt model (bf16, step scope): the step time and,
# from a trace, the median gap between compute kernels (scripts/overlap.py), on one GPU without
# data parallelism, as a run of one rank (--gpus 1: NCCL's one-rank kernels in the graph) and
# on 2 GPUs (a fixed shared-memory carveout for every kernel node was tried here in session 30
# and changed nothing; bench/RESULTS.md), the one-rank run again with CUDA_DEVICE_MAX_CONNECTIONS
# 1 and 32; bench/graph_gap.cu's synthetic chains (4 branches, 132 blocks); then the captured
# step graphs of the first two written as Graphviz files
# (STEPGRAPH_GRAPH_DOT) with the count of each node type, and the attributes of the kernel nodes
# that only the graph with NCCL holds.
#
#   bench/nccl_graph_gap.sh STEPGRAPH [MODEL_WIDTH-DEPTH-SEQ=256-4-128] [OUT=${OUT:-.}]
#
# Needs CUDA with CUPTI and NCCL; --gpus 2 is skipped on a machine with one GPU.
set -uo pipefail
SG=${1:?usage: bench/nccl_graph_gap.sh STEPGRAPH [WIDTH-DEPTH-SEQ] [OUT]}
IFS=- read -r W D T <<<"${2:-256-4-128}"
OUT=${3:-${OUT:-.}}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
B="--scope step --precision bf16"
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
run() { # label, batch, extra args...
    local label=$1 batch=$2; shift 2
    local m="gpt-$W-$D-$batch-$T" ms gap
    ms=$(timeout 120 "$SG" train --model "$m" $B --steps 200 --quiet "$@" 2>&1 | grep -o '[0-9.]* ms/step' | head -1)
    if timeout 120 "$SG" trace --model "$m" $B --steps 5 --out "$OUT/t.json" "$@" >/dev/null 2>&1; then
        gap=$(python3 "$here/../scripts/overlap.py" "$OUT/t.json" 5 | awk '/median gap/{print $(NF-1) " us"}')
    else
        gap="(trace failed)"
    fi
    rm -f "$OUT/t.json"
    printf '%-34s %-12s median gap between compute kernels %s\n' "$label" "${ms:-(failed)}" "$gap"
}
run "1 GPU" 8
run "--gpus 1 (one rank, NCCL)" 8 --gpus 1
if [ "$ngpu" -ge 2 ]; then run "--gpus 2" 16 --gpus 2; else echo "--gpus 2: skipped (one GPU)"; fi
# The hardware queues the driver spreads a graph's streams over (default 8): one queue, or many.
for c in 1 32; do
    export CUDA_DEVICE_MAX_CONNECTIONS=$c
    run "--gpus 1, CUDA_DEVICE_MAX_CONNECTIONS=$c" 8 --gpus 1
    unset CUDA_DEVICE_MAX_CONNECTIONS
done
if nvcc -O2 -arch=sm_90 "$here/graph_gap.cu" -o "$OUT/graph_gap" -lnccl -lcublas 2>"$OUT/graph_gap.log"; then
    "$OUT/graph_gap" 120 4 132
    rm -f "$OUT/graph_gap"
else
    echo "graph_gap.cu did not build: $(tail -1 "$OUT/graph_gap.log")"
fi

types='KERNEL|MEMCPY|MEMSET|HOST|GRAPH|EMPTY|WAIT_EVENT|EVENT_RECORD|EXT_SEMAS_SIGNAL|EXT_SEMAS_WAIT|MEM_ALLOC|MEM_FREE|BATCH_MEM_OP|CONDITIONAL'
for v in plain one-rank; do
    d="$OUT/dot-$v"
    rm -rf "$d" && mkdir -p "$d"
    args=()
    [ "$v" = one-rank ] && args=(--gpus 1)
    STEPGRAPH_GRAPH_DOT=$d timeout 120 "$SG" train --model "gpt-$W-$D-8-$T" $B --steps 6 --quiet "${args[@]}" >/dev/null 2>&1 ||
        echo "$v: the run with STEPGRAPH_GRAPH_DOT failed"
    f=$(ls -S "$d"/*.dot 2>/dev/null | head -1) # the largest: the step graph
    [ -n "$f" ] || { echo "$v: no graph written"; continue; }
    echo "== $v: $(basename "$f"), node types:"
    grep -oE "\\b($types)\\b" "$f" | sort | uniq -c | sort -rn
done
echo "== kernel nodes whose function only the one-rank graph holds (their attributes):"
a=$(ls -S "$OUT"/dot-plain/*.dot 2>/dev/null | head -1) b=$(ls -S "$OUT"/dot-one-rank/*.dot 2>/dev/null | head -1)
if [ -n "$a" ] && [ -n "$b" ]; then
    python3 - "$a" "$b" <<'PY'
import re, sys
def nodes(path):
    text = open(path).read()
    return re.findall(r'label="(.*?)"\]', text, re.S)
plain = {re.sub(r'\\n.*', '', l.split('\\n', 2)[-1]) for l in nodes(sys.argv[1])}
seen = set()
for l in nodes(sys.argv[2]):
    fn = re.sub(r'\\n.*', '', l.split('\\n', 2)[-1])
    if fn not in plain and fn not in seen:
        seen.add(fn)
        print(l.replace('\\n', '\n    ')[:1500], '\n')
PY
fi
