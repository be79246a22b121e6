#!/usr/bin/env bash
# gpu_bound.sh: issue 15's measurements of GPU-bound GPT steps, stepgraph and PyTorch in one run
# on one GPU: `stepgraph bench` under step scope (and eager) with the fused attention (the
# default, head size 64) and with STEPGRAPH_ATTENTION=unfused, bf16 also with the loss-scale
# unscale as a pass of its own (STEPGRAPH_UNSCALE=separate, tagged "separate-unscale"; the
# default folds it into the optimizer), and bench/torch_ref.py
# (SDPA attention, as PyTorch users write it) in its graph and compile modes, and its graph mode
# with the explicit math attention (--attention math), reported beside it. JSON lines into
# $OUT/gpu_bound.jsonl, then one table: ms/step, and stepgraph's best over PyTorch's best. Also
# step scope with the AdamW moments in bf16 (--optim-state bf16), tagged "bf16-state": the
# best/best line takes stepgraph's best with f32 state only (the like-for-like optimizer), and a
# second line with bf16 state.
#
#   bench/gpu_bound.sh [BUILD_DIR]   (default build-gpu)
#   env: GPU_BOUND_MODELS (default gpt-768-12-8-256,gpt-256-4-8-128), GPU_BOUND_PRECISIONS
#        (default bf16,fp32), GPU_BOUND_TORCH_MODES (default graph,compile), GPU_BOUND_STEPS (50)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
SG=$BUILD/stepgraph
OUT=${OUT:-bench-out}
MODELS=${GPU_BOUND_MODELS:-gpt-768-12-8-256,gpt-256-4-8-128}
PRECS=${GPU_BOUND_PRECISIONS:-bf16,fp32}
TMODES=${GPU_BOUND_TORCH_MODES:-graph,compile}
STEPS=${GPU_BOUND_STEPS:-50}
mkdir -p "$OUT"
J=$OUT/gpu_bound.jsonl
: > "$J"
[ -x "$SG" ] || { echo "gpu_bound.sh: $SG is not an executable: build first" >&2; exit 2; }
tag() { python3 -c 'import json,sys; t=sys.argv[1]
for l in sys.stdin:
    l=l.strip()
    if l.startswith("{"): d=json.loads(l); d["impl"]=t; print(json.dumps(d))' "$1"; }
for p in ${PRECS//,/ }; do
  "$SG" bench --model "$MODELS" --scope eager,step --precision "$p" --steps "$STEPS" --json 2>>"$OUT/gpu_bound.err" \
    | tag stepgraph >> "$J" || echo "stepgraph bench $p failed" >&2
  "$SG" bench --model "$MODELS" --scope step --precision "$p" --optim-state bf16 --steps "$STEPS" --json \
    2>>"$OUT/gpu_bound.err" | tag "stepgraph bf16-state" >> "$J" || echo "stepgraph bf16-state $p failed" >&2
  STEPGRAPH_ATTENTION=unfused "$SG" bench --model "$MODELS" --scope step --precision "$p" --steps "$STEPS" --json \
    2>>"$OUT/gpu_bound.err" | tag "stepgraph unfused-attention" >> "$J" || echo "stepgraph unfused $p failed" >&2
  if [ "$p" = bf16 ]; then
    STEPGRAPH_UNSCALE=separate "$SG" bench --model "$MODELS" --scope step --precision "$p" --steps "$STEPS" --json \
      2>>"$OUT/gpu_bound.err" | tag "stepgraph separate-unscale" >> "$J" || echo "stepgraph separate $p failed" >&2
  fi
  python3 bench/torch_ref.py --model "$MODELS" --mode "$TMODES" --precision "$p" --steps 100 --repeats 5 \
    --json 2>>"$OUT/gpu_bound.err" | tag pytorch >> "$J" || echo "torch_ref $p failed" >&2
  python3 bench/torch_ref.py --model "$MODELS" --mode graph --precision "$p" --attention math --steps 100 \
    --repeats 5 --json 2>>"$OUT/gpu_bound.err" | tag "pytorch math-attention" >> "$J" || echo "torch_ref math $p failed" >&2
done
python3 - "$J" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def ms(r): return r.get("ms_per_step", r.get("ms"))
keys = sorted({(r["model"], r["precision"]) for r in rows})
print("| model | precision | impl | scope/mode | ms/step | peak MiB |")
print("|---|---|---|---|---|---|")
for k in keys:
    sel = [r for r in rows if (r["model"], r["precision"]) == k]
    for r in sel:
        print(f"| {k[0]} | {k[1]} | {r['impl']} | {r.get('scope', r.get('mode'))} | {ms(r):.3f} | {r.get('peak_mib', '')} |")
    sg = [ms(r) for r in sel if r["impl"].startswith("stepgraph") and r.get("scope") == "step"
          and "bf16-state" not in r["impl"]]
    sg16 = [ms(r) for r in sel if r["impl"] == "stepgraph bf16-state"]
    pt = [ms(r) for r in sel if r["impl"].startswith("pytorch")]
    if sg and pt:
        print(f"| {k[0]} | {k[1]} | **best/best** | | **{min(sg) / min(pt):.2f}x** | |")
    if sg16 and pt:
        print(f"| {k[0]} | {k[1]} | **bf16 state/best** | | **{min(sg16) / min(pt):.2f}x** | |")
PY
