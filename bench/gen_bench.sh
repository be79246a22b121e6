#!/usr/bin/env bash
# gen_bench.sh: issue 14's generation benchmark on the GPU machine: `stepgraph sample` in each
# mode (eager, step, loop) and bench/torch_gen.py (eager, graph, compile) over the same models,
# precisions and batches, in one run; JSON lines into $OUT/gen_bench.jsonl, then one markdown
# table (ms a token, prefill ms, host us a token, best against best).
#
#   bench/gen_bench.sh        env: GEN_BENCH_MODELS (default gpt-768-12-8-256,gpt-256-4-8-128),
#                             GEN_BENCH_PRECISIONS (bf16,fp32), GEN_BENCH_BATCHES (1,8,64),
#                             GEN_BENCH_NEW (200), GEN_BENCH_PROMPT (16), GEN_BENCH_REPEAT (10),
#                             GEN_BENCH_TORCH_MODES (eager,graph,compile), STEPGRAPH (the binary),
#                             GEN_BENCH_ADVISE (1: `stepgraph advise --generate` for each model,
#                             precision and batch too, into $OUT/gen_advise.jsonl and a second
#                             table, predicted beside measured ms a token per mode; 0: not)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-.}
SG=${STEPGRAPH:-build-gpu/stepgraph}
MODELS=${GEN_BENCH_MODELS:-gpt-768-12-8-256,gpt-256-4-8-128}
PRECS=${GEN_BENCH_PRECISIONS:-bf16,fp32}
BATCHES=${GEN_BENCH_BATCHES:-1,8,64}
NEW=${GEN_BENCH_NEW:-200}
PROMPT=${GEN_BENCH_PROMPT:-16}
REPEAT=${GEN_BENCH_REPEAT:-10}
TMODES=${GEN_BENCH_TORCH_MODES:-eager,graph,compile}
ADVISE=${GEN_BENCH_ADVISE:-1}
J=$OUT/gen_bench.jsonl
A=$OUT/gen_advise.jsonl
: > "$J"
: > "$A"
for model in ${MODELS//,/ }; do
  # The cache holds the model's positions (its last name field): prompt + new tokens must fit.
  seq=${model##*-}
  new=$NEW
  if (( PROMPT + new > seq )); then
    new=$((seq - PROMPT))
    echo "gen_bench: $model holds $seq positions: $new new tokens instead of $NEW" >&2
  fi
  for p in ${PRECS//,/ }; do
    for b in ${BATCHES//,/ }; do
      for mode in eager step loop; do
        "$SG" sample --model "$model" --random-init --precision "$p" --batch "$b" --prompt-len "$PROMPT" \
          --length "$new" --temperature 0 --mode "$mode" --repeat "$REPEAT" --json 2>>"$OUT/gen_bench.err" \
          | python3 -c 'import json,sys; d=json.load(sys.stdin); d.pop("sequences",None); d["impl"]="stepgraph"; print(json.dumps(d))' >> "$J" \
          || echo "stepgraph $model $p $b $mode failed" >&2
      done
    done
    for b in ${BATCHES//,/ }; do
      (( ADVISE )) || break
      "$SG" advise --generate --model "$model" --precision "$p" --batch "$b" --prompt-len "$PROMPT" \
        --length "$new" --repeats "$REPEAT" --json 2>>"$OUT/gen_bench.err" \
        | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))' >> "$A" \
        || echo "stepgraph advise --generate $model $p $b failed" >&2
    done
    python3 bench/torch_gen.py --model "$model" --precision "$p" --batch "$BATCHES" --prompt-len "$PROMPT" \
      --max-new "$new" --repeat "$REPEAT" --mode "$TMODES" --json >> "$J" 2>>"$OUT/gen_bench.err" \
      || echo "torch_gen $model $p failed" >&2
  done
done
python3 - "$J" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
keys = sorted({(r["model"], r["precision"], r["batch"]) for r in rows}, key=lambda k: (k[0], k[1], k[2]))
print("| model | precision | batch | impl mode | prefill ms | ms/token | tokens/s | host us/token |")
print("|---|---|---|---|---|---|---|---|")
for k in keys:
    sel = [r for r in rows if (r["model"], r["precision"], r["batch"]) == k]
    for r in sel:
        print(f"| {k[0]} | {k[1]} | {k[2]} | {r['impl']} {r['mode']} | {r['prefill_ms']:.3f} | {r['per_token_ms']:.4f} | "
              f"{r['tokens_per_s']:.0f} | {r['host_us_per_token']:.2f} |")
    sg = [r["per_token_ms"] for r in sel if r["impl"] == "stepgraph"]
    pt = [r["per_token_ms"] for r in sel if r["impl"] == "pytorch"]
    if sg and pt:
        print(f"| {k[0]} | {k[1]} | {k[2]} | **best/best** | | **{min(sg) / min(pt):.2f}x** | | |")
PY
python3 - "$A" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
if rows:
    print()
    print("| model | precision | batch | mode | predicted ms/token | measured ms/token | error | host us a token |")
    print("|---|---|---|---|---|---|---|---|")
for r in rows:
    for m in r["modes"]:
        if not m["predicted"] or not m["measured"]:
            print(f"| {r['model']} | {r['precision']} | {r['batch']} | {m['mode']} | - | - | - | {m['note']} |")
            continue
        print(f"| {r['model']} | {r['precision']} | {r['batch']} | {m['mode']} | {m['predicted_ms']:.4f} | "
              f"{m['measured_ms']:.4f} | {m['error_pct']:+.1f}% | {m['host_us_per_token']:.2f} |")
PY
