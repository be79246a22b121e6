#!/usr/bin/env bash
# dist_signal_test.sh BIN: `train --gpus 2` (CPU ranks) killed mid-run by SIGKILL, SIGTERM or SIGINT
# sent to the launcher alone: no worker outlives it (bounded wait), the launcher exits 137, 143
# or 130 and says it was interrupted, and the log the run shared with its workers is clean text.
set -u
bin=$1
tmp=$(mktemp -d /tmp/sg_dist_signal.XXXXXX)
fails=0
procs=()                      # "pid starttime" of every process this test started or found

# A process is alive while /proc/PID/stat shows the start time recorded for it (so a reused pid
# is not mistaken for it) in a state other than zombie.
start_time() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; set -- $s; echo "${20}"; }
alive() {
    local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    s=${s##*) }
    local fields=($s)
    [ "${fields[0]}" != Z ] && [ "${fields[19]}" = "$2" ]
}
cleanup() {
    local p
    for p in "${procs[@]}"; do
        set -- $p
        if alive "$1" "$2"; then kill -KILL "$1" 2>/dev/null; fi
    done
    rm -rf "$tmp"
}
trap cleanup EXIT

fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
# Microseconds since the epoch, and whether that deadline is still ahead.
now_us() { echo "${EPOCHREALTIME//[.,]/}"; }
before() { [ "$(now_us)" -lt "$1" ]; }

for sig in KILL TERM INT; do
    log=$tmp/log.$sig
    fails_before=$fails
    # Job control puts the run in its own process group and keeps SIGINT (which a
    # non-interactive shell has background jobs ignore) at its default, as at a terminal.
    set -m
    "$bin" train --model mlp-32-2-16 --backend cpu --gpus 2 --steps 100000000 --log-every 1 > "$log" 2>&1 &
    launcher=$!
    set +m
    lstart=$(start_time "$launcher")
    procs+=("$launcher $lstart")

    # Both workers started (their environment holds SG_DIST_RANK once they exec'd), and rank 0
    # training (its loss lines reach the log).
    workers=()
    deadline=$(($(now_us) + 60000000))
    while before "$deadline"; do
        kids=($(pgrep -P "$launcher"))
        ready=0
        for w in "${kids[@]}"; do
            tr '\0' '\n' < "/proc/$w/environ" 2>/dev/null | grep -q '^SG_DIST_RANK=' && ready=$((ready + 1))
        done
        if [ "$ready" = 2 ] && [ "${#kids[@]}" = 2 ] && grep -q loss "$log"; then workers=("${kids[@]}"); break; fi
        sleep 0.05
    done
    if [ "${#workers[@]}" != 2 ]; then
        fail "SIG$sig: the launcher's 2 workers did not start training within 60 s; log:"; head -c 2000 "$log"
        continue
    fi
    wstart=()
    for w in "${workers[@]}"; do wstart+=("$(start_time "$w")"); procs+=("$w ${wstart[-1]}"); done

    # The launcher alone is signalled; within 10 s it and both workers are gone. (stderr aside
    # meanwhile: bash's own "Killed" line for the SIGKILL case is expected, not a failure.)
    exec 3>&2 2>/dev/null
    kill -s "$sig" "$launcher"
    deadline=$(($(now_us) + 10000000))
    left=1
    while before "$deadline"; do
        left=0
        alive "$launcher" "$lstart" && left=1
        for i in 0 1; do alive "${workers[$i]}" "${wstart[$i]}" && left=1; done
        [ "$left" = 0 ] && break
        sleep 0.05
    done
    if [ "$left" = 1 ]; then
        still=""
        for i in 0 1; do alive "${workers[$i]}" "${wstart[$i]}" && still="$still ${workers[$i]}"; done
        fail "SIG$sig to the launcher (pid $launcher): 10 s later, workers still running:${still:- none}" \
             "$(alive "$launcher" "$lstart" && echo "(the launcher too)")"
        kill -KILL "$launcher" "${workers[@]}" 2>/dev/null
    fi
    wait "$launcher"
    rc=$?
    exec 2>&3 3>&-
    case $sig in KILL) want=137 ;; TERM) want=143 ;; INT) want=130 ;; esac
    [ "$rc" = "$want" ] || fail "SIG$sig: the launcher exited $rc, expected $want; log tail:$(echo; tail -n 5 "$log")"
    if [ "$sig" != KILL ] && ! grep -q "interrupted (SIG$sig): stopped 2 workers" "$log"; then
        fail "SIG$sig: the log does not say 'interrupted (SIG$sig): stopped 2 workers'; its tail:"; tail -n 5 "$log"
    fi
    if ! tr -d '\000' < "$log" | cmp -s - "$log"; then
        fail "SIG$sig: the log holds $(($(wc -c < "$log") - $(tr -d '\000' < "$log" | wc -c))) NUL bytes"
    fi
    [ "$fails" = "$fails_before" ] &&
        echo "ok: SIG$sig to the launcher: exit $rc, both workers gone, $(grep -c loss "$log") loss lines, no NUL"
done

[ "$fails" = 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "dist_signal: all cases passed"
