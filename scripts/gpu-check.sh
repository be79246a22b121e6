#!/usr/bin/env bash
# gpu-check.sh: everything stepgraph checks on a GPU machine, in one run: build (sm_90), the gpu
# and cpu test suites, the benchmarks beside PyTorch's, and every GPU test under
# compute-sanitizer memcheck and racecheck. Keeps going past a failing stage, prints one
# PASS/FAIL line per stage, a summary and a stepgraph-vs-PyTorch table last, and exits non-zero
# if anything failed. Logs go to ${OUT:-./gpu-check-out} (six files and the host_loader example's
# trace, so they all come back).
#
#   scripts/gpu-check.sh [--quick] [--no-bench] [--bench-only] [--no-tests]
#     --quick       skip the sanitizers and the one-at-a-time GPU pass; run the GPU tests 4 at a
#                   time, then up to 3 more times instead
#     --no-bench    skip the benchmarks
#     --bench-only  build and benchmark only (no tests, no sanitizers)
#     --no-tests    skip the test suites (the sanitizers and benchmarks still run): with a
#                   --quick --no-bench run before it, the whole check in two 10-minute calls
#
# The stages and what they took on an H100 with 16 cores (2026-11-24, commit b4baf77): build
# 15-20 s (fresh tree, 16 jobs); the GPU tests one at a time 155-195 s (linear_gpu 60-80 s of it:
# its f64 CPU reference of the large shapes), the same 4 at a time (ctest -j 4) 70-125 s, and,
# with --quick, 4 at a time --repeat until-fail:3 without linear_gpu 50-65 s; the CPU tests
# 100-125 s with install, which the examples stage runs instead (130 s, both backends); the
# benchmarks about 3 min; the sanitizers about 2 min. So --quick --no-bench (no one-at-a-time
# pass) takes about 6-7 min, the whole run more than one 10-minute call: split it with
# --no-tests as above (the deadline below keeps each call's summary).
#
# Environment: GPU_CHECK_DEADLINE_S (default 540: stages that would start later are skipped and
# count as failures, so a 10-minute limit never cuts the summary off), GPU_CHECK_MODELS
# (default mlp-512-6-32,mlp-2048-6-256), GPU_CHECK_PRECISIONS (default fp32; e.g. fp32,bf16 with
# gpt models: every benchmark runs in each), GPU_CHECK_VERIFY (models that `stepgraph verify`
# checks under layer, model and step scope in each precision with dropout and clipping on;
# default none), GPU_CHECK_MULTI_GPU_TESTS (ctest names allowed to skip on a one-GPU machine;
# default dist_gpu), GPU_CHECK_TOKEN_MODELS (gpt models benchmarked, every scope and
# GPU_CHECK_TOKEN_TORCH_MODES (default eager,graph,compile,graph_compile; PyTorch with SDPA
# attention; graph_compile, compiled code in a whole-step graph, was its fastest in 2026-11), over
# a token file of bench/make_tokens.py with vocabulary GPU_CHECK_TOKEN_VOCAB (default 50304);
# default none), GPU_CHECK_VISION_MODELS (resnet/efficientnet models benchmarked eager and step,
# with and without --recompute, beside bench/torch_vision.py's GPU_CHECK_VISION_TORCH_MODES,
# default eager,graph,graph_compile (graph_compile was its fastest in 2026-11), in
# GPU_CHECK_VISION_PRECISIONS, default bf16; default resnet18-32-32,efficientnet_b0-8-128; empty
# for none), GPU_CHECK_GEN_MODELS (gpt models whose
# generation bench/gen_bench.sh measures beside PyTorch and `advise --generate`, batches 1 and 8,
# in PRECISIONS; default gpt-256-4-8-128; empty for none), GPU_CHECK_REPEAT (runs of each test in --quick's repeated stage, default
# 3; 1 for none), SANITIZE_JOBS (default 4), SANITIZE_SKIP (test names,
# space-separated, kept out of the sanitizers; empty for none; default "prof advise dist cli":
# CUPTI and compute-sanitizer both hook the driver, and test_prof's and test_advise's only own
# kernels are fills that the other tests check; test_dist needs two GPUs and NCCL's own
# processes; cli_gpu trains whole models through the command, which the op tests cover),
# GPU_CHECK_CPU (a core to run every benchmark on through taskset, stepgraph's and PyTorch's:
# a host-bound step's time depends on the core, 3.7 to 5.8 ms by core for resnet18-32-32 bf16's
# eager step on the H100 machine; default empty: the scheduler's choice. One core handicaps
# PyTorch's eager and compile modes, whose autograd engine runs the backward on a thread of its
# own: gpt-256-4-8-128 bf16 --accum 4 eager took 43 ms pinned).
set -euo pipefail

cd "$(dirname "$0")/.."
START=$SECONDS
OUT=${OUT:-./gpu-check-out}
mkdir -p "$OUT"
BUILD=build-gpu
DEADLINE=${GPU_CHECK_DEADLINE_S:-540}
MODELS=${GPU_CHECK_MODELS:-mlp-512-6-32,mlp-2048-6-256}
SCOPES=${GPU_CHECK_SCOPES:-all}
TORCH_MODES=${GPU_CHECK_TORCH_MODES:-eager,graph,graphed_callables,graphed_layers,compile}
PRECISIONS=${GPU_CHECK_PRECISIONS:-fp32}
MULTI_GPU_TESTS=${GPU_CHECK_MULTI_GPU_TESTS:-dist_gpu}
export MULTI_GPU_TESTS
VERIFY_MODELS=${GPU_CHECK_VERIFY:-}
TOKEN_MODELS=${GPU_CHECK_TOKEN_MODELS:-}
TOKEN_VOCAB=${GPU_CHECK_TOKEN_VOCAB:-50304}
TOKEN_TORCH_MODES=${GPU_CHECK_TOKEN_TORCH_MODES:-eager,graph,compile,graph_compile}
VISION_MODELS=${GPU_CHECK_VISION_MODELS-resnet18-32-32,efficientnet_b0-8-128}
GEN_MODELS=${GPU_CHECK_GEN_MODELS-gpt-256-4-8-128}
VISION_PRECISIONS=${GPU_CHECK_VISION_PRECISIONS:-bf16}
VISION_TORCH_MODES=${GPU_CHECK_VISION_TORCH_MODES:-eager,graph,graph_compile}
SANITIZE_SKIP=${SANITIZE_SKIP-prof advise dist cli}
SANITIZE_JOBS=${SANITIZE_JOBS:-4}
JOBS=$(nproc 2>/dev/null || echo 4)
QUICK=0 NO_BENCH=0 BENCH_ONLY=0 NO_TESTS=0
for arg in "$@"; do
    case "$arg" in
    --quick) QUICK=1 ;;
    --no-bench) NO_BENCH=1 ;;
    --bench-only) BENCH_ONLY=1 ;;
    --no-tests) NO_TESTS=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "gpu-check.sh: unknown option '$arg' (see --help)" >&2; exit 2 ;;
    esac
done
REPEAT=${GPU_CHECK_REPEAT:-3}
case "$REPEAT" in
'' | *[!0-9]* | 0) echo "gpu-check.sh: GPU_CHECK_REPEAT '$REPEAT': expected a whole number from 1" >&2; exit 2 ;;
esac
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
export PYTHONUNBUFFERED=1

SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
: >"$OUT/build.log"
: >"$OUT/tests.log"
: >"$OUT/sanitizers.log"
: >"$OUT/bench.log"
: >"$OUT/bench.jsonl"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
FAILED=0
RESULTS=()

say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((DEADLINE - (SECONDS - START))); }

# record NAME STATUS DETAIL: one summary line per stage.
record() {
    local line
    line=$(printf '%-28s %-5s %s' "$1" "$2" "$3")
    RESULTS+=("$line")
    say "== $line"
    if [ "$2" != PASS ]; then FAILED=1; fi
}

# stage NAME LOG LIMIT_S CMD...: runs CMD under a time limit (cut to the deadline), appends its
# output to LOG, records PASS/FAIL, and on failure prints the output's last lines.
stage() {
    local name=$1 log=$2 limit=$3 rem rc t0
    shift 3
    rem=$(left)
    if [ "$rem" -lt 15 ]; then
        record "$name" SKIP "no time left before the ${DEADLINE}s deadline"
        return 1
    fi
    [ "$limit" -gt "$rem" ] && limit=$rem
    echo "-- $name (limit ${limit}s): $*"
    t0=$SECONDS
    {
        echo "===== $name: $* ====="
    } >>"$log"
    set +e
    # bash -c, so that CMD may be one of this script's functions (exported below).
    timeout --kill-after=10 "$limit" bash -c '"$@"' "$name" "$@" >"$TMP/stage.out" 2>&1
    rc=$?
    set -e
    cat "$TMP/stage.out" >>"$log"
    if [ $rc -eq 0 ]; then
        record "$name" PASS "$((SECONDS - t0))s"
        return 0
    fi
    local why="exit $rc"
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && why="timed out after ${limit}s"
    record "$name" FAIL "$why, $((SECONDS - t0))s (log: $log)"
    echo "---- last lines of $name ----"
    tail -n 40 "$TMP/stage.out"
    echo "----"
    return 1
}

# ---- the machine -------------------------------------------------------------------------

say "gpu-check.sh: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit ${SG_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
{
    # Each probe under a short limit: a wedged driver must not stall the whole run here.
    timeout 20 nvidia-smi -L || echo "nvidia-smi -L failed"
    timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
        --format=csv 2>/dev/null || true
    timeout 20 nvcc --version | tail -n 2 || echo "nvcc not found"
    timeout 20 cmake --version | head -n 1 || echo "cmake not found"
    if command -v compute-sanitizer >/dev/null; then
        timeout 20 compute-sanitizer --version | tail -n 1 || true
    else
        echo "compute-sanitizer not found"
    fi
    timeout 60 python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 |
        tail -n 1 || true
    echo "cores: $JOBS"
} 2>&1 | tee -a "$SUMMARY"

# ---- build -------------------------------------------------------------------------------

configure_and_build() {
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
        >"$TMP/configure.out" 2>&1
    local rc=$?
    cat "$TMP/configure.out"
    [ $rc -eq 0 ] || return $rc
    # A CPU-only build here would make every gpu test skip: refuse it.
    if ! grep -q 'stepgraph: CUDA backend ON' "$TMP/configure.out"; then
        echo "gpu-check.sh: CMake configured without CUDA (nvcc not found?)"
        return 1
    fi
    if ! grep -q '^CUDA_cupti_LIBRARY:FILEPATH=/' "$BUILD/CMakeCache.txt"; then
        echo "gpu-check.sh: warning: CUPTI not found; the profiler is off (sg_prof_create fails)"
    fi
    cmake --build "$BUILD" -j "$JOBS"
}
export BUILD JOBS TMP OUT
export -f configure_and_build
BUILT=0
if stage "build (sm_90, Release)" "$OUT/build.log" 300 configure_and_build; then BUILT=1; fi
grep -E 'warning|CUPTI' "$OUT/build.log" | grep -v '^--' | sort -u | head -n 20 >"$TMP/warn" || true
[ -s "$TMP/warn" ] && { echo "build warnings (first 20):"; cat "$TMP/warn"; }

# ---- tests -------------------------------------------------------------------------------

# ctest returns 0 when tests skip (exit 77); on a GPU machine a skipped gpu test hides a hole.
# Arguments go to ctest (-j 4, --repeat ...).
run_gpu_tests() {
    ctest --test-dir "$BUILD" -L gpu --output-on-failure "$@" 2>&1 | tee "$TMP/gpu_ctest.out"
    local rc=${PIPESTATUS[0]}
    # A test that needs several GPUs (GPU_CHECK_MULTI_GPU_TESTS) may skip on a one-GPU machine.
    local ngpu skipped
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    skipped=$(grep 'Skipped' "$TMP/gpu_ctest.out" || true)
    if [ "${ngpu:-0}" -lt 2 ]; then
        for t in $MULTI_GPU_TESTS; do
            skipped=$(echo "$skipped" | grep -v " $t " || true)
        done
    fi
    if [ -n "$skipped" ]; then
        echo "gpu-check.sh: gpu tests skipped on a GPU machine:"
        echo "$skipped"
        return 1
    fi
    if grep -q 'No tests were found' "$TMP/gpu_ctest.out"; then
        echo "gpu-check.sh: no gpu tests registered"
        return 1
    fi
    return "$rc"
}
export -f run_gpu_tests
if [ $BENCH_ONLY -eq 0 ] && [ $NO_TESTS -eq 0 ]; then
    if [ $BUILT -eq 1 ]; then
        # One at a time (not with --quick: the -j 4 and repeated passes below cover it, and all
        # three no longer fit one 10-minute call beside the CPU tests and the examples).
        [ $QUICK -eq 1 ] || stage "gpu tests (ctest -L gpu)" "$OUT/tests.log" 240 run_gpu_tests || true
        # The same tests sharing the GPU, 4 at a time: what a test assumes about a GPU of its
        # own (free memory, timings, files in the cwd) shows here. RUN_SERIAL ones stay alone.
        stage "gpu tests (ctest -L gpu -j 4)" "$OUT/tests.log" 240 run_gpu_tests -j 4 || true
        # --quick: again, each test up to $REPEAT times (until it fails), but for linear_gpu, whose
        # f64 CPU reference of the large shapes takes a minute a run (it ran twice above).
        if [ $QUICK -eq 1 ] && [ "$REPEAT" -gt 1 ]; then
            stage "gpu tests (-j 4, until-fail:$REPEAT)" "$OUT/tests.log" 240 \
                run_gpu_tests -j 4 --repeat "until-fail:$REPEAT" -E '^linear_gpu$' || true
        fi
        # Every test that is not gpu-labelled: the cpu label and anything unlabelled, but install,
        # which the examples stage below runs (on both backends).
        stage "cpu tests (ctest -LE gpu)" "$OUT/tests.log" 240 \
            ctest --test-dir "$BUILD" -LE gpu -E '^install$' --output-on-failure -j "$JOBS" || true
    else
        record "gpu tests (ctest -L gpu)" FAIL "not run: the build failed"
        record "cpu tests (ctest -LE gpu)" FAIL "not run: the build failed"
    fi
fi

# ---- examples: built against the installed package, run on the CPU and the GPU --------

# tests/install_test.sh installs the build into a fresh prefix, builds tests/consumer and
# examples/ with find_package and pkg-config and runs each on both backends; host_loader also
# writes a trace of its fed steps to $OUT/host_loader_trace.json.
if [ $BENCH_ONLY -eq 0 ] && [ $NO_TESTS -eq 0 ]; then
    if [ $BUILT -eq 1 ]; then
        stage "examples (installed; cpu, cuda)" "$OUT/tests.log" 180 \
            env SG_EXAMPLE_TRACE="$OUT/host_loader_trace.json" tests/install_test.sh "$BUILD" . || true
    else
        record "examples" FAIL "not run: the build failed"
    fi
fi

# ---- verify: eager against every capture scope, bit for bit ---------------------------

# verify_all: each model of GPU_CHECK_VERIFY under layer, model and step scope, in each
# precision, with dropout and clipping on; fails on the first mismatch.
verify_all() {
    local m sc p rc=0
    for m in ${VERIFY_MODELS//,/ }; do
        for p in ${PRECISIONS//,/ }; do
            for sc in layer model step; do
                "$BUILD/stepgraph" verify --model "$m" --scope "$sc" --precision "$p" --dropout 0.1 \
                    --clip 1 --steps 20 | tail -n 3 || rc=1
            done
        done
    done
    return $rc
}
export PRECISIONS VERIFY_MODELS
export -f verify_all
if [ $BENCH_ONLY -eq 0 ] && [ -n "$VERIFY_MODELS" ]; then
    if [ $BUILT -eq 1 ]; then
        stage "verify ($VERIFY_MODELS; $PRECISIONS)" "$OUT/tests.log" 200 verify_all || true
    else
        record "verify" FAIL "not run: the build failed"
    fi
fi

# ---- benchmarks --------------------------------------------------------------------------

# bench_to_jsonl CMD...: runs a benchmark; stdout's JSON lines go to bench.jsonl, the rest of
# its output to the stage log.
PIN=()
if [ -n "${GPU_CHECK_CPU:-}" ] && command -v taskset >/dev/null; then PIN=(taskset -c "$GPU_CHECK_CPU"); fi
bench_to_jsonl() {
    local rc
    set +e
    ${PIN[@]+"${PIN[@]}"} "$@" >"$TMP/bench.stdout"
    rc=$?
    set -e
    cat "$TMP/bench.stdout"
    if ! grep '^{' "$TMP/bench.stdout" >>"$OUT/bench.jsonl"; then
        echo "gpu-check.sh: $1 printed no JSON line"
        [ $rc -ne 0 ] || rc=1
    fi
    return $rc
}
export -f bench_to_jsonl
if [ $NO_BENCH -eq 0 ]; then
    if [ $BUILT -eq 1 ] && [ -x "$BUILD/stepgraph" ]; then
        for p in ${PRECISIONS//,/ }; do
            stage "bench: stepgraph $p" "$OUT/bench.log" 150 \
                bench_to_jsonl "$BUILD/stepgraph" bench --model "$MODELS" --scope "$SCOPES" --precision "$p" --json || true
            stage "bench: stepgraph $p step x8" "$OUT/bench.log" 100 \
                bench_to_jsonl "$BUILD/stepgraph" bench --model "$MODELS" --scope step --steps-per-graph 8 --precision "$p" --json || true
        done
    else
        record "bench: stepgraph" FAIL "not run: no $BUILD/stepgraph (build failed)"
    fi
    for p in ${PRECISIONS//,/ }; do
        stage "bench: pytorch $p" "$OUT/bench.log" 300 \
            bench_to_jsonl python3 bench/torch_ref.py --model "$MODELS" --mode "$TORCH_MODES" --precision "$p" --json || true
    done
    # Vision models: stepgraph eager and step scope, with and without --recompute, then PyTorch's
    # torchvision models at their fastest (channels_last, cudnn.benchmark, autocast) beside them.
    if [ -n "$VISION_MODELS" ]; then
        for p in ${VISION_PRECISIONS//,/ }; do
            stage "bench: stepgraph vision $p" "$OUT/bench.log" 200 \
                bench_to_jsonl "$BUILD/stepgraph" bench --model "$VISION_MODELS" --scope eager,step --precision "$p" \
                --steps 20 --repeats 3 --warmup 10 --memory --json || true
            stage "bench: stepgraph vision $p recompute" "$OUT/bench.log" 200 \
                bench_to_jsonl "$BUILD/stepgraph" bench --model "$VISION_MODELS" --scope step --precision "$p" \
                --recompute --steps 20 --repeats 3 --warmup 10 --memory --json || true
            stage "bench: pytorch vision $p" "$OUT/bench.log" 400 \
                bench_to_jsonl python3 bench/torch_vision.py --model "$VISION_MODELS" --mode "$VISION_TORCH_MODES" \
                --precision "$p" --dropout 0.2 --stochastic-depth 0.2 --steps 30 --repeats 3 --warmup 10 --json || true
        done
    fi
    # GPT over a token file with a GPT-2-sized vocabulary, both sides reading the same file.
    if [ -n "$TOKEN_MODELS" ]; then
        python3 bench/make_tokens.py "$TMP/tokens.bin" --tokens 2000000 --vocab 50257 >>"$OUT/bench.log" 2>&1 || true
        for p in ${PRECISIONS//,/ }; do
            stage "bench: stepgraph $p vocab $TOKEN_VOCAB" "$OUT/bench.log" 200 \
                bench_to_jsonl "$BUILD/stepgraph" bench --model "$TOKEN_MODELS" --scope all --precision "$p" \
                --data "$TMP/tokens.bin" --vocab "$TOKEN_VOCAB" --steps 50 --repeats 3 --warmup 20 --json || true
            stage "bench: pytorch $p vocab $TOKEN_VOCAB" "$OUT/bench.log" 300 \
                bench_to_jsonl python3 bench/torch_ref.py --model "$TOKEN_MODELS" --mode "$TOKEN_TORCH_MODES" \
                --precision "$p" --data "$TMP/tokens.bin" --vocab "$TOKEN_VOCAB" --sdpa --steps 50 --repeats 3 \
                --warmup 20 --json || true
        done
    fi
    # Generation (issue 14): stepgraph sample per mode, PyTorch's static-cache decoding and
    # stepgraph advise --generate, through bench/gen_bench.sh (its table into bench.log).
    if [ -n "$GEN_MODELS" ]; then
        stage "bench: generation ($GEN_MODELS)" "$OUT/bench.log" 300 \
            env OUT="$TMP" STEPGRAPH="$BUILD/stepgraph" GEN_BENCH_MODELS="$GEN_MODELS" GEN_BENCH_BATCHES=1,8 \
            GEN_BENCH_REPEAT=3 GEN_BENCH_PRECISIONS="$PRECISIONS" bench/gen_bench.sh || true
    fi
fi

# ---- sanitizers --------------------------------------------------------------------------

# The gpu test commands, one per line ("name<TAB>binary arg..."), from ctest's own registry;
# failing that, every tests/test_* binary with argument gpu.
list_gpu_tests() {
    ctest --test-dir "$BUILD" -L gpu --show-only=json-v1 2>/dev/null | python3 -c '
import json, sys
for t in json.load(sys.stdin).get("tests", []):
    cmd = t.get("command") or []
    if cmd:
        print(t["name"] + "\t" + " ".join(cmd))
' 2>/dev/null && return 0
    for b in "$BUILD"/tests/test_*; do
        [ -x "$b" ] && [ -f "$b" ] && printf '%s_gpu\t%s gpu\n' "$(basename "$b" | sed 's/^test_//')" "$b"
    done
}

# One sanitizer run: writes its log and exit code under $TMP/san/.
sanitize_one() {
    local tool=$1 name=$2 limit=$3
    shift 3
    local tag="$tool.$name" rc=0
    echo "===== compute-sanitizer --tool $tool: $* =====" >"$TMP/san/$tag.log"
    # SG_SANITIZER tells the tests which tool runs them: under racecheck they leave out their
    # bf16 cuBLAS cases, whose Hopper GEMM kernels (nvjet_sm90_*) racecheck reports hazards in
    # (72 on 2026-11-22, none in stepgraph's kernels; memcheck clean), see tests/testutil.h.
    SG_SANITIZER=$tool SG_TEST_MODEL=${SG_TEST_MODEL:-mlp-64-2-32} timeout --kill-after=10 "$limit" compute-sanitizer --tool "$tool" --error-exitcode 1 "$@" \
        >>"$TMP/san/$tag.log" 2>&1 || rc=$?
    echo "rc=$rc" >"$TMP/san/$tag.rc"
}

run_sanitizers() {
    local name cmd tool n=0 limit
    if ! command -v compute-sanitizer >/dev/null; then
        record "sanitizers" FAIL "compute-sanitizer not found"
        return
    fi
    mkdir -p "$TMP/san"
    list_gpu_tests >"$TMP/gpu_tests.txt" || true
    if [ ! -s "$TMP/gpu_tests.txt" ]; then
        record "sanitizers" FAIL "no gpu test binaries found"
        return
    fi
    echo "-- sanitizers: memcheck and racecheck, $SANITIZE_JOBS at a time, up to 300s each"
    while IFS=$'\t' read -r name cmd; do
        local short=${name%_gpu}
        if [[ " $SANITIZE_SKIP " == *" $short "* ]]; then
            echo "   skipping $name (SANITIZE_SKIP)"
            continue
        fi
        for tool in memcheck racecheck; do
            while [ "$(jobs -rp | wc -l)" -ge "$SANITIZE_JOBS" ]; do wait -n || true; done
            # Each run may take what is left before the deadline, less a margin for the summary.
            limit=$(($(left) - 20))
            [ $limit -gt 300 ] && limit=300
            n=$((n + 1))
            if [ $limit -lt 20 ]; then
                echo "rc=skip" >"$TMP/san/$tool.$name.rc"
                : >"$TMP/san/$tool.$name.log"
                continue
            fi
            # shellcheck disable=SC2086  # cmd is "binary args", split on purpose
            sanitize_one "$tool" "$name" "$limit" $cmd </dev/null &
        done
    done <"$TMP/gpu_tests.txt"
    wait || true
    local f tag rc
    for f in "$TMP"/san/*.log; do
        [ -e "$f" ] || continue
        tag=$(basename "$f" .log)
        cat "$f" >>"$OUT/sanitizers.log"
        rc=$(sed -n 's/^rc=//p' "$TMP/san/$tag.rc" 2>/dev/null || echo "?")
        case "$rc" in
        0) record "sanitize $tag" PASS "" ;;
        skip) record "sanitize $tag" SKIP "no time left before the ${DEADLINE}s deadline" ;;
        77) record "sanitize $tag" FAIL "the test skipped (exit 77) on a GPU machine" ;;
        124 | 137) record "sanitize $tag" FAIL "timed out (limit: 300s or the deadline)" ;;
        *)
            record "sanitize $tag" FAIL "exit $rc (log: $OUT/sanitizers.log)"
            grep -E '=========|ERROR SUMMARY|FAIL' "$f" | head -n 20
            ;;
        esac
    done
    [ $n -gt 0 ] || record "sanitizers" FAIL "no runs"
}
if [ $QUICK -eq 0 ] && [ $BENCH_ONLY -eq 0 ]; then
    if [ $BUILT -eq 1 ]; then run_sanitizers; else record "sanitizers" FAIL "not run: the build failed"; fi
fi

# ---- summary -----------------------------------------------------------------------------

say ""
say "==== summary ($((SECONDS - START))s) ===="
for line in "${RESULTS[@]}"; do say "$line"; done

if [ -s "$OUT/bench.jsonl" ]; then
    say ""
    python3 - "$OUT/bench.jsonl" <<'EOF' 2>&1 | tee -a "$SUMMARY"
# Every stepgraph scope and PyTorch mode per model, side by side; ratios against PyTorch eager
# and PyTorch's whole-step graph, measured in this run.
import json, sys
rows, order = [], []
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    r["key"] = f'{r.get("model")} {r.get("precision", "fp32")}' + (
        f' v{r["vocab"]}' if r.get("vocab", 256) != 256 else "")
    # stepgraph rows name their scope "scope" (older ones "mode"); PyTorch's rows a "mode".
    r["mode"] = r.get("scope") or r.get("mode")
    rows.append(r)
    if r["key"] not in order:
        order.append(r["key"])

def g(r, k, spec):
    v = r.get(k) if r else None
    return "n/a" if v is None else format(v, spec)

print(f"{'model precision':<30} {'who':<9} {'scope/mode':<18} {'ms/step':>8} {'/pt eag':>7} {'/pt grf':>7} {'/pt min':>7} {'host ms':>8} "
      f"{'kern':>6} {'busy ms':>8} {'capt ms':>8} {'MiB':>6}")
for m in order:
    mine = [r for r in rows if r["key"] == m]
    ref = {r.get("mode"): r for r in mine if r.get("framework") == "pytorch"}
    pe, pg = ref.get("eager", {}).get("ms_per_step"), ref.get("graph", {}).get("ms_per_step")
    pmin = min((r["ms_per_step"] for r in ref.values() if r.get("ms_per_step")), default=None)
    for r in mine:
        if "error" in r:
            print(f"{m:<30} {r.get('framework','?'):<9} {r.get('mode','?'):<18} error: {r['error'][:60]}")
            continue
        ms = r.get("ms_per_step")
        re = format(ms / pe, ".3f") if ms and pe else "n/a"
        rg = format(ms / pg, ".3f") if ms and pg else "n/a"
        rmin = format(ms / pmin, ".3f") if ms and pmin else "n/a"
        capt = r.get("capture_ms", 0) + r.get("instantiate_ms", 0) if "capture_ms" in r else None
        mib = r.get("peak_reserved_mib", r.get("peak_mib"))
        if r.get("steps_per_graph", 1) > 1:
            r = dict(r, mode=f"{r['mode']} x{r['steps_per_graph']}")
        if r.get("recompute"):
            r = dict(r, mode=f"{r['mode']} recompute")
        print(f"{m:<30} {r.get('framework'):<9} {r.get('mode'):<18} {g(r, 'ms_per_step', '.4f'):>8} {re:>7} {rg:>7} {rmin:>7} "
              f"{g(r, 'host_ms_per_step', '.4f'):>8} {g(r, 'kernels_per_step', '.1f'):>6} "
              f"{g(r, 'gpu_busy_ms_per_step', '.4f'):>8} {'n/a' if capt is None else format(capt, '.2f'):>8} "
              f"{'n/a' if mib is None else format(mib, '.0f'):>6}")
dev = next((r.get("device") for r in rows if r.get("device")), "?")
tv = next((r.get("torch_version") for r in rows if r.get("torch_version")), "?")
print(f"ms: median over blocks; /pt min: against PyTorch's fastest mode of the run; kern: kernels (stepgraph: launches incl. graph launches) per step; "
      f"busy: GPU-busy ms/step (CUPTI); MiB: peak reserved; device {dev}; torch {tv}")
EOF
fi

# Keep every log under the 16 MiB a returned file may have: head and tail of an oversized one.
for f in "$OUT"/*.log; do
    if [ "$(wc -c <"$f")" -gt 15000000 ]; then
        { head -c 7000000 "$f"; echo; echo "[... cut by gpu-check.sh ...]"; tail -c 7000000 "$f"; } >"$TMP/cut"
        mv "$TMP/cut" "$f"
    fi
done

if [ $FAILED -ne 0 ]; then
    say "gpu-check.sh: FAILED (see the lines above and $OUT/)"
    exit 1
fi
say "gpu-check.sh: all stages passed"
