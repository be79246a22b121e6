#!/usr/bin/env bash
# cond_bench.sh: issue 13's measurements of control flow on the device, stepgraph and PyTorch
# in one run on one GPU, each row a JSON line under $OUT (default bench-out/):
#   vary_*.json   gpt-256-4-8-128 --seq-lens 32,64,128 --vary-seq: the graph-per-bucket cache
#                 (conditional nodes disabled: STEPGRAPH_DISABLE_CONDITIONALS=1), the SWITCH
#                 graph at 1 and 8 steps a launch (unrolled, and --loop: one WHILE body holding
#                 the SWITCH), eager; PyTorch eager, a torch.cuda.graph per
#                 bucket, torch.compile(mode="reduce-overhead") specialised per bucket
#   skip_*.json   bf16 step scope, the overflow skip predicated or as a conditional node
#                 (--skip-if), with no overflow and with one every 10 steps
#   accum_*.json  --accum 4 under every scope, the step graph unrolled and as a WHILE loop
#                 (--loop), --accum 16 both ways; PyTorch's whole-step graph of 4 micro-batches
#   advise_*.json the advisor's predictions against its measurements with these options
#   verify_*.txt  each form bit for bit against eager
# usage: bench/cond_bench.sh [BUILD_DIR] (default build-gpu; it must hold the stepgraph binary).
# Environment: COND_BENCH_PRECISIONS (default fp32,bf16: the --vary-seq and --accum rows),
# COND_BENCH_STAGES (default vary,skip,accum,advise,verify).
set -u
BUILD=${1:-build-gpu}
SG=$BUILD/stepgraph
OUT=${OUT:-bench-out}
M=gpt-256-4-8-128
LENS=32,64,128
PRECISIONS=${COND_BENCH_PRECISIONS:-fp32,bf16}
STAGES=${COND_BENCH_STAGES:-vary,skip,accum,advise,verify}
mkdir -p "$OUT"
[ -x "$SG" ] || { echo "cond_bench.sh: $SG is not an executable: build first" >&2; exit 2; }
fails=0
# run NAME CMD...: stdout to $OUT/NAME, stderr to $OUT/NAME.err; a failure is counted and named.
run() {
    local name=$1
    shift
    echo "== $name: $*" >&2
    if ! "$@" > "$OUT/$name" 2> "$OUT/$name.err"; then
        echo "cond_bench.sh: $name failed (exit $?): $(tail -3 "$OUT/$name.err")" >&2
        fails=$((fails + 1))
    fi
}
has() { case ",$STAGES," in *",$1,"*) return 0 ;; esac; return 1; }

for P in ${PRECISIONS//,/ }; do
    if has vary; then
        run "vary_cache_$P.json" env STEPGRAPH_DISABLE_CONDITIONALS=1 "$SG" bench --model $M --precision "$P" \
            --seq-lens $LENS --vary-seq --scope eager,step --memory --json
        run "vary_switch1_$P.json" "$SG" bench --model $M --precision "$P" --seq-lens $LENS --vary-seq --scope step \
            --memory --json
        run "vary_switch8_$P.json" "$SG" bench --model $M --precision "$P" --seq-lens $LENS --vary-seq --scope step \
            --steps-per-graph 8 --memory --json
        run "vary_switch8_loop_$P.json" "$SG" bench --model $M --precision "$P" --seq-lens $LENS --vary-seq \
            --scope step --steps-per-graph 8 --loop --memory --json
        run "vary_torch_$P.json" python3 bench/torch_ref.py --model $M --precision "$P" --seq-lens $LENS --vary-seq \
            --mode eager --mode graph --mode compile --sdpa --json
    fi
    if has accum; then
        run "accum4_$P.json" "$SG" bench --model $M --precision "$P" --accum 4 --scope all --json
        run "accum4_loop_$P.json" "$SG" bench --model $M --precision "$P" --accum 4 --scope step --loop --json
        run "accum16_$P.json" "$SG" bench --model $M --precision "$P" --accum 16 --scope step --steps 40 --json
        run "accum16_loop_$P.json" "$SG" bench --model $M --precision "$P" --accum 16 --scope step --loop \
            --steps 40 --json
        run "accum4_torch_$P.json" python3 bench/torch_ref.py --model $M --precision "$P" --accum 4 --mode eager \
            --mode graph --mode compile --sdpa --json
    fi
done
if has skip; then
    for o in 0 10; do
        ov=()
        [ "$o" = 0 ] || ov=(--overflow-every "$o")
        run "skip_pred_ov$o.json" "$SG" bench --model $M --precision bf16 --scope step "${ov[@]}" --json
        run "skip_if_ov$o.json" "$SG" bench --model $M --precision bf16 --scope step --skip-if "${ov[@]}" --json
    done
fi
if has advise; then
    run advise_vary8.json "$SG" advise --model $M --seq-lens $LENS --vary-seq --steps-per-graph 8 --json
    run advise_accum4_loop.json "$SG" advise --model $M --accum 4 --loop --json
    run advise_skip_if.json "$SG" advise --model $M --precision bf16 --skip-if --json
fi
if has verify; then
    for P in fp32 bf16; do
        run "verify_vary8_$P.txt" "$SG" verify --model $M --precision "$P" --scope step --seq-lens $LENS --vary-seq \
            --steps-per-graph 8 --steps 12
        run "verify_accum4_loop_$P.txt" "$SG" verify --model $M --precision "$P" --scope step --accum 4 --loop \
            --steps 10
    done
    run verify_skip_if.txt "$SG" verify --model $M --precision bf16 --scope step --skip-if --steps 10
    run verify_stop.txt "$SG" verify --model $M --scope step --steps-per-graph 4 --loop --stop-loss 4.0 --steps 12
fi
echo "cond_bench.sh: $fails failed" >&2
exit $((fails > 0))
