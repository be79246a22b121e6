#!/usr/bin/env bash
# ab.sh [options] REF...: builds stepgraph at each git REF (a commit, branch or tag; "." for the
# working tree as it is; a stepgraph executable's path, used as it is; NAME=REF names the build)
# and compares the builds on the same machine,
# for a change's A/B on a GPU: the checkpoints of a short training run against the first REF's
# (scripts/ckpt_same.py: bit for bit or not), ms/step in rounds (the order of the builds
# reversed every other round, so that none always runs on a warmer machine; each build's median
# and its ratio to the first's) and, with --trace,
# each build's kernels by time. Everything is printed to stdout, one stream, so that a device
# call can keep it as one file (the device tool returns at most 8 files a call).
#
#   scripts/ab.sh [--models M1,M2] [--precisions P1,P2] [--steps N] [--ckpt-steps N] [--rounds R]
#                 [--trace] [--no-ckpt] [--train-args "ARGS"] [--cmake-args "ARGS"] [--work DIR]
#                 [--env NAME VAR=VALUE]... REF...
#
#   --models      stepgraph models (default gpt-768-12-8-256,gpt-256-4-8-128)
#   --precisions  fp32 and/or bf16 (default bf16)
#   --steps       timed steps a run (default 200; ms/step as `train --quiet` prints it)
#   --ckpt-steps  steps of the checkpoint runs (default 8)
#   --rounds      timing rounds (default 2; 0: no timing, the checkpoints only)
#   --trace       `stepgraph trace --steps 5` of each build on the first model and precision,
#                 then scripts/kernel_times.py's 25 longest kernels
#   --no-ckpt     skip the checkpoint comparison
#   --train-args  more options for every train and trace run (default "--scope step")
#   --cmake-args  the configure options (default: Release, CUDA architecture 90, Ninja)
#   --work        where the trees and builds go (default /tmp/stepgraph-ab)
#   --env         every run of build NAME gets VAR=VALUE in its environment (repeatable), so
#                 that one ref can be compared with itself under a switch: a ref given twice
#                 (NAME=REF) is built once
#
# Options and REFs may come in any order; after --, every argument is a REF.
# A build REF is checked out by `git archive` into WORK/NAME (NAME: REF with / as _, unless
# given; names must differ), configured and built (target stepgraph_cli, the command). Exit
# status: 1 if a build or a run failed, 2 if checkpoints differ (or a usage error), else 0.
set -u
models=gpt-768-12-8-256,gpt-256-4-8-128 precisions=bf16 steps=200 ckpt_steps=8 rounds=2 trace=0 ckpt=1
train_args="--scope step"
cmake_args="-DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -G Ninja"
work=/tmp/stepgraph-ab
declare -A envof built
usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "$1"; }
refs=()
while [ $# -gt 0 ]; do
    case $1 in
    --models) models=$2; shift 2 ;;
    --precisions) precisions=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --ckpt-steps) ckpt_steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --trace) trace=1; shift ;;
    --no-ckpt) ckpt=0; shift ;;
    --train-args) train_args=$2; shift 2 ;;
    --cmake-args) cmake_args=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --env)
        if [ $# -lt 3 ] || [[ $3 != *=* ]]; then echo "ab.sh: --env takes NAME VAR=VALUE" >&2; exit 2; fi
        envof[$2]="${envof[$2]:-} $3"
        shift 3 ;;
    -h | --help) usage 0 ;;
    --) shift; refs+=("$@"); break ;;
    -*) echo "ab.sh: unknown option $1" >&2; usage 2 >&2 ;;
    *) refs+=("$1"); shift ;;
    esac
done
[[ $rounds =~ ^[0-9]+$ ]] || { echo "ab.sh: --rounds takes a count, not '$rounds'" >&2; exit 2; }
[ ${#refs[@]} -ge 1 ] || { echo "ab.sh: no REF given" >&2; usage 2 >&2; }
set -- "${refs[@]}"
root=$(git rev-parse --show-toplevel) || exit 1
mkdir -p "$work/bin" || exit 1
status=0
t0=$(date +%s)
say() { echo "[ab $(($(date +%s) - t0))s] $*"; }

names=() seen=()
for ref in "$@"; do
    name=${ref//\//_}
    [ "$ref" = . ] && name=worktree
    if [[ $ref == *=* ]]; then name=${ref%%=*} ref=${ref#*=}; fi
    for n in "${seen[@]}"; do
        [ "$n" != "$name" ] || { echo "ab.sh: two builds named $name (name them: NAME=REF)" >&2; exit 2; }
    done
    seen+=("$name")
    if [ "$ref" != . ] && [ -f "$ref" ] && [ -x "$ref" ]; then # a binary: no build
        cp "$ref" "$work/bin/$name" && names+=("$name")
        say "built $name: $ref as it is${envof[$name]:+, run with${envof[$name]}}"
        continue
    fi
    if [ "$ref" != . ] && [ -n "${built[$ref]:-}" ]; then
        cp "$work/bin/${built[$ref]}" "$work/bin/$name" && names+=("$name")
        say "built $name: the build of ${built[$ref]}${envof[$name]:+, run with${envof[$name]}}"
        continue
    fi
    tree=$work/$name
    rm -rf "$tree" && mkdir -p "$tree" || exit 1
    if [ "$ref" = . ]; then # tracked and untracked files as they are, without build outputs
        (cd "$root" && git ls-files -co --exclude-standard -z | xargs -0 tar -cf -) | tar -C "$tree" -xf -
        desc="working tree of $(git -C "$root" rev-parse --short HEAD)"
    else
        git -C "$root" archive "$ref" | tar -C "$tree" -xf - || { say "no such ref: $ref"; exit 1; }
        desc="$(git -C "$root" log -1 --format='%h %s' "$ref" | cut -c1-100)"
    fi
    # shellcheck disable=SC2086
    if cmake -S "$tree" -B "$tree/build" $cmake_args > "$work/$name.cmake.log" 2>&1 &&
        cmake --build "$tree/build" --target stepgraph_cli -j "$(nproc)" > "$work/$name.build.log" 2>&1 &&
        cp "$tree/build/stepgraph" "$work/bin/$name" 2>> "$work/$name.build.log"; then
        names+=("$name")
        built[$ref]=$name
        say "built $name: $desc${envof[$name]:+, run with${envof[$name]}}"
    else
        say "BUILD FAILED $name ($ref); the last lines:"
        tail -20 "$work/$name.build.log" "$work/$name.cmake.log"
        status=1
    fi
done
[ ${#names[@]} -ge 1 ] || exit 1

bin() { # NAME ARGS...: build NAME's stepgraph with ARGS, in the environment --env gave it
    local b=$1
    shift
    # shellcheck disable=SC2086
    env ${envof[$b]:-} "$work/bin/$b" "$@"
}

run() { # NAME ARGS...: train, the ms/step it prints (empty if it failed)
    local b=$1
    shift
    # shellcheck disable=SC2086
    bin "$b" train "$@" $train_args --quiet 2>&1 | sed -nE 's/.* ([0-9.]+) ms\/step.*/\1/p' | tail -1
}

IFS=, read -r -a ms <<< "$models"
IFS=, read -r -a ps <<< "$precisions"
if [ $ckpt = 1 ] && [ ${#names[@]} -ge 2 ]; then
    say "checkpoints after $ckpt_steps steps, against ${names[0]}"
    for m in "${ms[@]}"; do
        for p in "${ps[@]}"; do
            for b in "${names[@]}"; do
                # shellcheck disable=SC2086
                bin "$b" train --model "$m" --precision "$p" --steps "$ckpt_steps" $train_args --quiet \
                    --save "$work/$b.$m.$p.safetensors" > "$work/$b.ckpt.log" 2>&1 ||
                    { say "RUN FAILED $b $m $p:"; tail -5 "$work/$b.ckpt.log"; status=1; }
            done
            for b in "${names[@]:1}"; do
                if ! r=$(python3 "$root/scripts/ckpt_same.py" "$work/${names[0]}.$m.$p.safetensors" \
                    "$work/$b.$m.$p.safetensors" 2>&1); then
                    [ $status = 0 ] && status=2
                fi
                echo "  $m $p: $b against ${names[0]}: $(echo "$r" | tail -1)"
            done
        done
    done
fi

median() { tr ' ' '\n' | grep -E '^[0-9.]+$' | sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
if [ "$rounds" = 0 ]; then
    say "no timing (--rounds 0)"
else
    say "ms/step, $steps steps a run, $rounds rounds"
    declare -A got
    for ((r = 1; r <= rounds; r++)); do
        order=("${names[@]}")
        if [ $((r % 2)) = 0 ]; then
            order=()
            for ((i = ${#names[@]} - 1; i >= 0; i--)); do order+=("${names[$i]}"); done
        fi
        for m in "${ms[@]}"; do
            for p in "${ps[@]}"; do
                for b in "${order[@]}"; do
                    v=$(run "$b" --model "$m" --precision "$p" --steps "$steps")
                    [ -n "$v" ] || { v=FAILED; status=1; }
                    got[$m $p $b]="${got[$m $p $b]:-} $v"
                done
            done
        done
    done
    for m in "${ms[@]}"; do
        for p in "${ps[@]}"; do
            m0=$(median <<< "${got[$m $p ${names[0]}]}")
            for b in "${names[@]}"; do
                mb=$(median <<< "${got[$m $p $b]}")
                r=$(awk -v a="$mb" -v b="$m0" 'BEGIN { if (a != "" && b > 0) printf "%.3f", a / b }')
                echo "  $m $p $b:${got[$m $p $b]}${mb:+ | median $mb}${r:+, $r of ${names[0]}}"
            done
        done
    done
fi

if [ $trace = 1 ]; then
    for b in "${names[@]}"; do
        say "trace of $b (${ms[0]} ${ps[0]}), the 25 longest kernels"
        # shellcheck disable=SC2086
        if bin "$b" trace --model "${ms[0]}" --precision "${ps[0]}" $train_args --steps 5 \
            --out "$work/$b.trace.json" > "$work/$b.trace.log" 2>&1; then
            python3 "$root/scripts/kernel_times.py" "$work/$b.trace.json" 5 25
        else
            say "TRACE FAILED $b:"
            tail -5 "$work/$b.trace.log"
            status=1
        fi
    done
fi
say "done, status $status"
exit $status
