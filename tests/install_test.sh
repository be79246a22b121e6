#!/usr/bin/env bash
# install_test.sh BUILD_DIR SOURCE_DIR: installs the build into a fresh prefix and consumes it as
# a user would: the files a package holds (header, libstepgraph.so with its soname and only sg_
# symbols exported, a PIC libstepgraph.a, the command, the CMake package, the pkg-config file),
# then a plain C project (tests/consumer) built with find_package(stepgraph), shared and static,
# and the same program with `cc app.c $(pkg-config --cflags --libs stepgraph)`, each run on the
# CPU backend, and on the GPU too where one is usable; then examples/ the same ways.
# SG_EXAMPLE_TRACE=FILE: also host_loader on the GPU with --trace FILE.
set -u
build=$1 src=$2
backends=cpu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
fails=0 passes=0
pass() { echo "ok: $*"; passes=$((passes + 1)); }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
if ! cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1; then
    cat "$tmp/install.log"; echo "0 passed, 1 failed"; exit 1
fi
lib=$prefix/lib
[ -d "$prefix/lib64" ] && lib=$prefix/lib64
for f in include/stepgraph.h bin/stepgraph "${lib#$prefix/}/libstepgraph.a" "${lib#$prefix/}/libstepgraph.so" \
         "${lib#$prefix/}/cmake/stepgraph/stepgraphConfig.cmake" "${lib#$prefix/}/pkgconfig/stepgraph.pc"; do
    [ -e "$prefix/$f" ] && pass "installed $f" || fail "not installed: $f"
done
soname=$(readelf -d "$lib/libstepgraph.so" 2>/dev/null | sed -nE 's/.*\(SONAME\).*\[(.*)\]/\1/p')
[ "$soname" = libstepgraph.so.0 ] && pass "soname $soname" || fail "soname '$soname', expected libstepgraph.so.0"
others=$(nm -D --defined-only "$lib/libstepgraph.so" | awk '{print $3}' | grep -v '^sg_' | head -5)
n=$(nm -D --defined-only "$lib/libstepgraph.so" | grep -c ' sg_')
[ -z "$others" ] && [ "$n" -gt 100 ] && pass "exports $n sg_ symbols and nothing else" || fail "exports: $n sg_, others: $others"
# A static library fit for shared objects: no relocation that needs non-PIC code.
if ar x --output "$tmp" "$lib/libstepgraph.a" 2>/dev/null || (cd "$tmp" && ar x "$lib/libstepgraph.a"); then
    if cc -shared -o "$tmp/pic.so" "$tmp"/*.o* -lm -lpthread >"$tmp/pic.log" 2>&1 || ! grep -q "recompile with -fPIC" "$tmp/pic.log"; then
        pass "libstepgraph.a is position-independent"
    else fail "libstepgraph.a is not PIC: $(head -3 "$tmp/pic.log")"; fi
fi
"$prefix/bin/stepgraph" train --model mlp-16-1-4 --backend cuda --steps 1 --quiet >/dev/null 2>&1 && backends="cpu cuda"
"$prefix/bin/stepgraph" --version | grep -q '^stepgraph [0-9.]* (commit ' && pass "stepgraph --version" || fail "stepgraph --version"
# with_find_package DIR LABEL PROGRAM...: configures and builds the project DIR against the
# install, then runs each program on every backend.
with_find_package() {
    local dir=$1 label=$2 p b out
    shift 2
    if cmake -S "$dir" -B "$tmp/$label" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/$label.cfg" 2>&1 &&
       cmake --build "$tmp/$label" >"$tmp/$label.bld" 2>&1; then
        pass "$label: configured and built with find_package(stepgraph)"
        for p in "$@"; do
            for b in $backends; do
                out=$("$tmp/$label/$p" $b 2>&1) && pass "$label/$p $b (find_package): $out" || fail "$label/$p $b: $out"
            done
        done
    else
        fail "$label: $(tail -n 15 "$tmp/$label.cfg" "$tmp/$label.bld")"
    fi
}
with_find_package "$src/tests/consumer" consumer app app_static   # shared and static
with_find_package "$src/examples" examples own_loop custom_module host_loader
# SG_EXAMPLE_TRACE=FILE (scripts/gpu-check.sh): host_loader on the GPU writes its trace there.
if [ -n "${SG_EXAMPLE_TRACE:-}" ] && [[ " $backends " == *" cuda "* ]] && [ -x "$tmp/examples/host_loader" ]; then
    out=$("$tmp/examples/host_loader" cuda --trace "$SG_EXAMPLE_TRACE" 2>&1) &&
        pass "examples/host_loader cuda --trace $SG_EXAMPLE_TRACE: $out" || fail "host_loader --trace: $out"
fi
# pkg-config: the shared library.
if ! command -v pkg-config >/dev/null; then
    fail "pkg-config is not installed (make test installs it: pkgconf)"
else
    export PKG_CONFIG_PATH=$lib/pkgconfig
    # custom_module with RMSNorm's kernels compiled by nvcc where there is one (else CPU only).
    rms="$src/examples/rmsnorm.c"
    if command -v nvcc >/dev/null && nvcc -c -arch=sm_90 -o "$tmp/rmsnorm_cuda.o" "$src/examples/rmsnorm_cuda.cu" \
           >"$tmp/nvcc.log" 2>&1; then
        cudalib=$(dirname "$(command -v nvcc)")/../lib64
        [ -d "$cudalib" ] || cudalib=$(dirname "$(command -v nvcc)")/../lib
        # The example's own kernels need the CUDA runtime: its link, not stepgraph's.
        rms="-DRMSNORM_CUDA=1 $rms $tmp/rmsnorm_cuda.o -L$cudalib -Wl,-rpath,$cudalib -lcudart -lstdc++"
    fi
    for c in tests/consumer/app.c examples/own_loop.c examples/custom_module.c examples/host_loader.c; do
        exe=$tmp/$(basename "$c" .c)_pc extra=
        [ "$c" = examples/custom_module.c ] && extra=$rms
        if ! cc -o "$exe" "$src/$c" $extra $(pkg-config --cflags --libs stepgraph) -lm >"$tmp/pc.log" 2>&1; then
            fail "cc $c $extra \$(pkg-config --cflags --libs stepgraph): $(head -n 10 "$tmp/pc.log")"
            continue
        fi
        for b in $backends; do
            out=$(LD_LIBRARY_PATH=$lib "$exe" $b 2>&1) && pass "cc $c \$(pkg-config ...), $b: $out" || fail "$c (pkg-config) $b: $out"
        done
    done
fi
echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
