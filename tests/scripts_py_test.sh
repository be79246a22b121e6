#!/usr/bin/env bash
# scripts_py_test.sh SRC: scripts/kernel_times.py and scripts/ncu_lines.py on generated inputs,
# fresh random ones each run (the seed is printed; SCRIPTS_PY_SEED=N repeats a run). Their
# tables are compared line for line with what awk computes from a plain list of the same events
# or rows: kernel_times on a shuffled trace (two GPU processes, and kernel-named events of the
# host, of another process and of an unnamed one, which must not count), with STEPS, the
# default STEPS and TOP, a TOP and a NAME (that family's first-step calls in launch order), a
# TOP above the kernels' count, and the trace as a bare event list; ncu_lines on an ncu
# source-page CSV (ncu's and the program's lines first, three files, several SASS rows a line,
# the column at another place in each header, one line number in two files), with its default
# TOP, a TOP and one above the lines' count; then the error exits (a missing file, no column,
# no samples, no argument; kernel_times.py without an argument or with STEPS 0); then
# bench/torch_attn.py's argument checks (it needs PyTorch and a GPU only past them), and
# torch_ref.py's and torch_vision.py's --trace-dir checks (before they import torch). Skips (77)
# without python3.
set -u
src=$(cd "$1" && pwd) || exit 1
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
export LC_ALL=C # awk's and sort's numbers, sort's order
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
passes=0
# shellcheck source=tests/expect.sh
. "$(dirname "$0")/expect.sh"
cd "$tmp" || exit 1 # the inputs by their names in the labels and messages
kt() { expect_cmd "kernel_times.py ${*:4}" "$1" "$2" -- python3 "$src/scripts/kernel_times.py" "${@:4}"; } # kt CODE REGEX -- ARGS...
ncl() { expect_cmd "ncu_lines.py ${*:4}" "$1" "$2" -- python3 "$src/scripts/ncu_lines.py" "${@:4}"; } # ncl CODE REGEX -- ARGS...
# same LABEL FILE: the last command's output ($out) is FILE, line for line.
same() {
    if diff <(printf '%s\n' "$out") "$2" > "$tmp/diff"; then
        pass "$1"
    else
        fail "$1: the output (<) against the expected (>):"; cat "$tmp/diff"
    fi
}
pass() { echo "ok: $*"; passes=$((passes + 1)); }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

seed=${SCRIPTS_PY_SEED:-$((RANDOM * 32768 + RANDOM))}
echo "seed: $seed (SCRIPTS_PY_SEED=$seed repeats this run)"
RANDOM=$seed
steps=$((2 + RANDOM % 5))  # traced steps
ktop=$((3 + RANDOM % 20))  # kernel_times TOP, below the kernels' count
ntop=$((2 + RANDOM % 15))  # ncu_lines TOP, below the lines' count
echo "steps $steps, kernel_times TOP $ktop, ncu_lines TOP $ntop"

# The inputs, and what each holds as tab-separated text for awk:
#   events.tsv: process name, ph, kernel name, ts, dur (us) of every event with a name
#   rows.tsv:   file name, line, source (stripped), samples of every CSV row with a line number
#   shared_line: a line number with samples in attention_cuda.cu and layernorm_cuda.cu
python3 - "$tmp" "$seed" "$steps" <<'PY' || { echo "FAIL: the inputs were not generated"; exit 1; }
import csv, json, random, sys
tmp, seed, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)

# --- a trace as `stepgraph trace` writes it: process 1 "host", 2 + device "GPU n" ---
gemms = ["ampere_sgemm_128x64_nn", "cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4",
         "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute"
         "_segment_k_off_kernel__5x_cublas_with_a_name_longer_than_the_column"]
others = ["layernorm_forward_kernel", "layernorm_backward_kernel", "gelu_forward_kernel",
          "gelu_backward_kernel", "softmax_forward_kernel", "attention_fwd_kernel",
          "attention_bwd_kernel", "adamw_kernel", "fused_classifier_kernel",
          "encoder_forward_kernel", "encoder_backward_kernel", "residual_forward_kernel",
          "matmul_backward_bias_kernel", "global_norm_squared_kernel", "splitKreduce_kernel",
          "cast_kernel<...>", "cublasLt::epilogue::impl::globalKernel<...>",
          "Memcpy HtoD (Pageable -> Device)", "Memset (Device)"]
others += ["elementwise_kernel_%d" % i for i in range(40 - len(gemms) - len(others))]
gpu0 = gemms + rng.sample(others, rng.randint(30, len(others)))
gpu1 = ["ncclDevKernel_AllReduce_Sum_f32_RING_LL", "Memcpy PtoP (Device -> Device)"]
# a step's launches, the same each step: (pid, stream, kernel)
slots = [(2, rng.choice((7, 13)), k) for k in gpu0 for _ in range(rng.randint(1, 3))]
slots += [(3, 7, k) for k in gpu1 for _ in range(rng.randint(1, 2))]
rng.shuffle(slots)
while True:  # durations in 1/8 us, exact in binary: sums do not depend on their order
    t, ev = rng.randint(0, 10**6), []
    for s in range(steps):
        for pid, tid, k in (slots if s else [(2, 7, "init_kernel")] + slots):
            dur = rng.randint(1, 4000) * 125
            ev.append((pid, tid, k, t, dur))
            t += dur + rng.randint(500, 5000)
    tot = {}
    for e in ev:
        tot[e[2]] = tot.get(e[2], 0) + e[4]
    if len(set(tot.values())) == len(tot):  # no two kernels tie: one order
        break
# not the GPU's: the host's ranges and calls, another process, one without a name, each with
# kernels' names; instant events on the GPU
for pid, n in ((1, 40), (40, 10), (41, 10)):
    for i in range(n):
        k = gemms[i] if i < len(gemms) else rng.choice(gpu0 + ["cudaLaunchKernel"])
        ev.append((pid, 1, k, rng.randint(0, t), rng.randint(1, 10**6) * 125))
procs = {1: "host", 2: "GPU 0", 3: "GPU 1", 40: "trainer"}
us = lambda ns: round(ns / 1e3, 3)
events = [{"name": k, "cat": "kernel", "ph": "X", "ts": us(ts), "dur": us(d), "pid": pid,
           "tid": tid, "args": {"correlation": i}} for i, (pid, tid, k, ts, d) in enumerate(ev)]
events += [{"name": rng.choice(gpu0), "ph": "i", "s": "t", "ts": us(rng.randint(0, t)), "pid": 2,
            "tid": 7} for _ in range(5)]
for pid, name in procs.items():
    events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}})
    events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                   "args": {"sort_index": pid}})
events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "GPU feeder"}})
rng.shuffle(events)  # neither launch order nor metadata first
with open(f"{tmp}/trace.json", "w") as f:
    json.dump({"displayTimeUnit": "ns", "traceEvents": events}, f)
with open(f"{tmp}/trace_list.json", "w") as f:
    json.dump(events, f)
with open(f"{tmp}/events.tsv", "w") as f:
    for e in events:
        if e["ph"] != "M":
            f.write("%s\t%s\t%s\t%.3f\t%s\n" % (procs.get(e["pid"], "-"), e["ph"], e["name"], e["ts"],
                                                "%.3f" % e["dur"] if "dur" in e else "-"))

# --- an ncu source-page CSV: ncu's and the program's lines, then per file its path, a header
# and its rows (several SASS rows a line, some not attributed to a line) ---
code = ["float v = x[i];", "acc = fmaf(a, b, acc);", 'printf("%d, %f\\n", i, v);',
        "__syncthreads();", "s[threadIdx.x] = v * scale;", "if (i < n) y[i] = acc;",
        "for (int k = 0; k < K; k += 4) {", "m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));",
        "out[row * C + col] = __float2bfloat16(acc * inv_sqrt_d + bias[col]) /* a line longer "
        "than ninety characters */;"]
paths = ["/home/dev/stepgraph/src/ops/attention_cuda.cu", "/home/dev/stepgraph/src/ops/layernorm_cuda.cu",
         "/usr/local/cuda-12.8/include/cuda_bf16.hpp"]
nlines = rng.randint(27, 34)  # lines with samples, over 25 (the default TOP)
sums = rng.sample(range(1, 5000), nlines)  # distinct: one order
cut = sorted(rng.sample(range(1, nlines), 2))
parts = [sums[:cut[0]], sums[cut[0]:cut[1]], sums[cut[1]:]]
metrics = ["Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
           "Instructions Executed", "L2 Theoretical Sectors Global Excessive"]
rows_tsv = []
def addr():
    return "0x%016x" % rng.randint(0x7f0000000000, 0x7fffffffffff)
with open(f"{tmp}/source.csv", "w", newline="") as f:
    f.write("==PROF== Connected to process 31337 (/home/dev/stepgraph/build/stepgraph)\n"
            '==PROF== Profiling "attention_fwd_kernel" - 0: 0%....50%....100% - 9 passes\n'
            "100,2.3141\n"  # the program's own output, a number first: before any header
            "==PROF== Disconnected from process 31337\n")
    w = csv.writer(f, quoting=csv.QUOTE_ALL, lineterminator="\n")
    w.writerow(["Kernel Name", "attention_fwd_kernel"])
    numbers = [rng.sample(range(1, 2000), len(p) + 2) for p in parts]
    shared = numbers[0][0]  # a line number in two files: two lines
    numbers[1] = [shared] + [n for n in numbers[1] if n != shared][:len(numbers[1]) - 1]
    open(f"{tmp}/shared_line", "w").write("%d\n" % shared)
    for fi, (path, part) in enumerate(zip(paths, parts)):
        cols = metrics[:]
        rng.shuffle(cols)
        if fi == 0 and cols.index(metrics[0]) < cols.index(metrics[1]):  # Not-issued first here
            i, j = cols.index(metrics[0]), cols.index(metrics[1])
            cols[i], cols[j] = cols[j], cols[i]
        w.writerow(["File Path", path])
        w.writerow(["Line No", "Source", "Address", "Source"] + cols)
        lines = [(n, s) for n, s in zip(numbers[fi], part + [0, 0])]  # two lines without samples
        rng.shuffle(lines)
        for line, total in lines:
            text = rng.choice(code)
            if line == shared and fi < 2:  # a line longer than the column, one with quotes
                text = code[-1] if fi == 0 else code[2]
            k = rng.randint(1, 5)
            cuts = sorted(rng.randint(0, total) for _ in range(k - 1))
            for a, b in zip([0] + cuts, cuts + [total]):
                n = b - a
                val = {metrics[0]: "" if n == 0 and rng.random() < 0.5 else str(n),
                       metrics[1]: str(rng.randint(0, n + 50)),
                       metrics[2]: str(rng.randint(0, 10**6)), metrics[3]: str(rng.randint(0, 99))}
                w.writerow([str(line), " " * rng.randint(0, 8) + text, addr(), "FFMA R4, R2, R3, R4 ;"]
                           + [val[c] for c in cols])
                rows_tsv.append("%s\t%d\t%s\t%d\n" % (path.rsplit("/", 1)[1], line, text, n))
            if rng.random() < 0.3:  # SASS without a source line
                w.writerow(["", "", addr(), "BRA 0x120 ;"] + [str(rng.randint(1, 99)) for _ in cols])
with open(f"{tmp}/rows.tsv", "w") as f:
    f.writelines(rows_tsv)
with open(f"{tmp}/zero.csv", "w", newline="") as f:  # a table whose samples are all 0 or empty
    w = csv.writer(f, quoting=csv.QUOTE_ALL, lineterminator="\n")
    w.writerow(["File Path", paths[0]])
    w.writerow(["Line No", "Source", "Address", "Source"] + metrics)
    for line in (12, 13, 13):
        w.writerow([str(line), code[0], addr(), "LDG.E R2, [R2] ;", rng.choice(("0", "")), "7", "4096", "0"])
PY

# --- kernel_times.py: the expected tables, by awk from events.tsv ---
# kt_expect STEPS TOP [NAME]: the GPU processes' complete events, by name: total / STEPS,
# calls / STEPS, total / calls, the largest first; with NAME, the first int(n / STEPS) calls
# of the kernels whose name holds NAME, by start time.
kt_expect() {
    local s=$1 top=$2 pick=${3:-}
    awk -F'\t' -v s="$s" '$1 ~ /^GPU / && $2 == "X" { all += $5 } END {
        printf "%9s %6s %8s  kernel   (all: %.1f us a step)\n", "us/step", "calls", "us/call", all / s }' "$tmp/events.tsv"
    awk -F'\t' '$1 ~ /^GPU / && $2 == "X" { t[$3] += $5; n[$3]++ }
        END { for (k in t) printf "%.3f\t%d\t%s\n", t[k], n[k], k }' "$tmp/events.tsv" |
        sort -t"$(printf '\t')" -k1,1gr | head -n "$top" |
        awk -F'\t' -v s="$s" '{ printf "%9.1f %6.0f %8.2f  %s\n", $1 / s, $2 / s, $1 / $2, substr($3, 1, 110) }'
    [ -n "$pick" ] || return 0
    awk -F'\t' -v p="$pick" '$1 ~ /^GPU / && $2 == "X" && index($3, p) { print $4 "\t" $5 }' "$tmp/events.tsv" |
        sort -t"$(printf '\t')" -k1,1g > "$tmp/picked"
    awk -F'\t' -v s="$s" -v p="$pick" -v n="$(wc -l < "$tmp/picked")" '
        BEGIN { per = int(n / s); printf "\nthe first step'"'"'s %d calls of *%s*, in order (us):\n", per, p }
        NR <= per { printf "%s%.1f", (NR > 1 ? " " : ""), $2 } END { print "" }' "$tmp/picked"
}
kt_expect "$steps" 1000 > "$tmp/kt_all"
nk=$(($(wc -l < "$tmp/kt_all") - 1))
if [ "$nk" -gt 30 ]; then pass "the trace holds $nk GPU kernels, more than 30 (the default TOP) and TOP $ktop"
else fail "the trace holds $nk GPU kernels, not more than 30"; fi
# the host's, the other process's and the unnamed process's events would change the sums
awk -F'\t' '$1 !~ /^GPU / && $2 == "X" { print $3 }' "$tmp/events.tsv" | sort -u > "$tmp/not_gpu_names"
awk -F'\t' '$1 ~ /^GPU / && $2 == "X" { print $3 }' "$tmp/events.tsv" | sort -u > "$tmp/gpu_names"
if [ "$(comm -12 "$tmp/gpu_names" "$tmp/not_gpu_names" | grep -c gemm)" = 3 ]; then
    pass "events of non-GPU processes carry GPU kernels' names (the 3 gemm ones among them)"
else fail "the non-GPU processes' events lack the gemm kernels' names"; fi

all=$(head -1 "$tmp/kt_all" | sed 's/.*(all: \([0-9.]*\) us a step)/\1/')
kt_expect "$steps" 30 > "$tmp/kt_steps"
kt 0 "\(all: ${all//./\\.} us a step\)" -- trace.json "$steps"
same "kernel_times.py TRACE $steps: every value, the order, 30 kernels" "$tmp/kt_steps"
kt_expect 5 30 > "$tmp/kt_default"
kt 0 '^  us/step  calls  us/call  kernel   \(all: ' -- trace.json
same "kernel_times.py TRACE: STEPS 5, TOP 30" "$tmp/kt_default"
kt_expect "$steps" "$ktop" gemm > "$tmp/kt_pick"
kt 0 "the first step's [0-9]+ calls of \*gemm\*, in order \(us\):" -- trace.json "$steps" "$ktop" gemm
same "kernel_times.py TRACE $steps $ktop gemm: $ktop kernels, then gemm's first-step calls in launch order" "$tmp/kt_pick"
if [ "$(tail -1 "$tmp/kt_pick" | wc -w)" -ge 3 ]; then pass "the gemm listing holds 3 or more calls a step"
else fail "the expected gemm listing holds fewer than 3 calls:"; cat "$tmp/kt_pick"; fi
kt 0 "  init_kernel$" -- trace.json "$steps" 1000
same "kernel_times.py TRACE $steps 1000: all $nk kernels" "$tmp/kt_all"
kt 0 "\(all: ${all//./\\.} us a step\)" -- trace_list.json "$steps"
same "kernel_times.py on the trace as a bare event list" "$tmp/kt_steps"
kt 1 'No such file or directory' -- none.json "$steps"
kt 1 'kernel_times.py TRACE.json \[STEPS\]' --
kt 1 'STEPS must be positive, not 0' -- trace.json 0

# --- ncu_lines.py: the expected tables, by awk from rows.tsv ---
# nl_expect TOP: samples summed by (file, line, source), lines without samples left out, the
# largest first, each with its share of all samples.
nl_expect() {
    awk -F'\t' '{ k = $1 "\t" $2 "\t" $3; s[k] += $4; all += $4 }
        END { printf "%8s %6s  %s  (%d samples)\n", "samples", "share", "file:line  source", all
              for (k in s) if (s[k]) print s[k] "\t" all "\t" k }' "$tmp/rows.tsv" > "$tmp/nl_sums"
    head -1 "$tmp/nl_sums"
    tail -n +2 "$tmp/nl_sums" | sort -t"$(printf '\t')" -k1,1nr | head -n "$1" |
        awk -F'\t' '{ printf "%8d %5.1f%%  %s:%d  %s\n", $1, 100 * $1 / $2, $3, $4, substr($5, 1, 90) }'
}
nl_expect 1000 > "$tmp/nl_all"
nlines=$(($(wc -l < "$tmp/nl_all") - 1))
if [ "$nlines" -gt 25 ]; then pass "the CSV holds $nlines lines with samples, more than 25 (the default TOP)"
else fail "the CSV holds $nlines lines with samples, not more than 25"; fi
nl_expect 25 > "$tmp/nl_default"
ncl 0 "^ samples  share  file:line  source  \([0-9]+ samples\)$" -- source.csv
same "ncu_lines.py CSV: per-line sums, shares, the order, 25 lines" "$tmp/nl_default"
nl_expect "$ntop" > "$tmp/nl_top"
ncl 0 "\.(cu|hpp):[0-9]+  " -- source.csv "$ntop"
same "ncu_lines.py CSV $ntop: $ntop lines" "$tmp/nl_top"
ncl 0 "attention_cuda\.cu:[0-9]+  " -- source.csv 1000
same "ncu_lines.py CSV 1000: all $nlines lines" "$tmp/nl_all"
dup=$(cat "$tmp/shared_line")
if [ "$(grep -Ec "^ +[0-9]+ +[0-9.]+%  (attention|layernorm)_cuda\.cu:$dup  " <<<"$out")" = 2 ]; then
    pass "line $dup of two files: two lines"
else fail "line '$dup' of two files is not two lines:"; echo "$out"; fi
# without the column, without samples, without an argument
sed 's/"Warp Stall Sampling (All Samples)"/"Warp Stall Sampling (Some Samples)"/' "$tmp/source.csv" > "$tmp/nocol.csv"
ncl 1 "nocol\.csv: no 'Warp Stall Sampling \(All Samples\)' column: collect --section SourceCounters" -- nocol.csv
ncl 1 "zero\.csv: no warp-state samples found" -- zero.csv
ncl 1 'ncu_lines\.py SOURCE\.csv \[TOP\]: where a kernel' --
ncl 1 'No such file or directory' -- none.csv

# bench/torch_attn.py checks its arguments before it imports torch (none here): --help, and the
# refusals of a shape, a backend and a count, each naming what was wrong
ta() { expect_cmd "torch_attn.py ${*:4}" "$1" "$2" -- python3 "$src/bench/torch_attn.py" "${@:4}"; } # ta CODE REGEX -- ARGS...
ta 0 "usage: torch_attn\.py .*--shape SHAPE" -- --help
ta 1 "--shape '8,12,256': expected B,HEADS,T,HEAD_SIZE, four positive integers" -- --shape 8,12,256
ta 1 "--shape '8,0,256,64': expected B,HEADS,T,HEAD_SIZE" -- --shape "8,12,256,64;8,0,256,64"
ta 1 "--backend 'fast': expected one of flash, cudnn, efficient, math" -- --backend cudnn,fast
ta 1 "--calls and --repeats must be at least 1" -- --calls 0

# bench/torch_ref.py and torch_vision.py check --trace-dir before they import torch: a missing
# directory and no profiled steps to keep, each named
tr() { expect_cmd "torch_ref.py ${*:4}" "$1" "$2" -- python3 "$src/bench/torch_ref.py" "${@:4}"; }    # tr CODE REGEX -- ARGS...
tv() { expect_cmd "torch_vision.py ${*:4}" "$1" "$2" -- python3 "$src/bench/torch_vision.py" "${@:4}"; } # tv CODE REGEX -- ARGS...
tr 2 "error: --trace-dir nodir: not a writable directory" -- --model gpt-64-1-1-16 --trace-dir nodir
tr 2 "error: --trace-dir needs --profile-steps of at least 1" -- --model gpt-64-1-1-16 --trace-dir . --profile-steps 0
tv 2 "error: --trace-dir nodir: not a writable directory" -- --model resnet18-8-32 --trace-dir nodir
tv 2 "error: --trace-dir needs --profile-steps of at least 1" -- --model resnet18-8-32 --trace-dir . --profile-steps 0

echo "$passes passed, $fails failed (seed $seed)"
[ "$fails" = 0 ]
