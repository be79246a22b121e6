# shellcheck shell=bash
# expect.sh: sourced by the shell tests (cli_test.sh, cli_help_test.sh, gpu_cli_test.sh,
# trace_test.sh, plot_test.sh, ab_test.sh).
# expect_cmd LABEL CODE REGEX -- CMD ARGS...: runs CMD ARGS, its stdout and stderr into $out and
# its status into $rc; passes ("ok: LABEL", passes + 1) when the status is CODE and the output
# matches the extended regex REGEX, else prints what it got (up to 40 lines: the first and last
# 20 of a longer output) and adds 1 to fails.
fails=${fails:-0}
passes=${passes:-0}
expect_cmd() {
    local label=$1 code=$2 re=$3
    shift 4
    out=$("$@" 2>&1)
    rc=$?
    if [ "$rc" != "$code" ] || ! grep -Eq -- "$re" <<<"$out"; then
        echo "FAIL: $label -> exit $rc (want $code), output lacks /$re/:"
        if [ "$(wc -l <<<"$out")" -le 40 ]; then echo "$out"; else head -20 <<<"$out"; echo "..."; tail -20 <<<"$out"; fi
        fails=$((fails + 1))
    else
        echo "ok: $label"
        passes=$((passes + 1))
    fi
}
