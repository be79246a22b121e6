#!/usr/bin/env bash
# install_test.sh BUILD_DIR SOURCE_DIR: installs the build into a fresh prefix and consumes it as
# a user would: the files a package holds (header, libstepgraph.so with its soname and only sg_
# symbols exported, a PIC libstepgraph.a, the command, the CMake package, the pkg-config file),
# then a plain C project (tests/consumer) built with find_package(stepgraph), shared and static,
# and the same program with `cc app.c $(pkg-config --cflags --libs stepgraph)`, each run on the
# CPU backend, and on the GPU too where one is usable; then examples/ the same ways.
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
# find_package: shared and static.
if cmake -S "$src/tests/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/cfg.log" 2>&1 &&
   cmake --build "$tmp/consumer" >"$tmp/bld.log" 2>&1; then
    pass "find_package(stepgraph) project configured and built"
    for a in app app_static; do
        for b in $backends; do
            out=$("$tmp/consumer/$a" $b 2>&1) && pass "$a $b (find_package): $out" || fail "$a $b: $out"
        done
    done
else
    fail "find_package project: $(tail -n 15 "$tmp/cfg.log" "$tmp/bld.log")"
fi
# examples/: every program built against the install with find_package, and run.
if cmake -S "$src/examples" -B "$tmp/examples" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/ecfg.log" 2>&1 &&
   cmake --build "$tmp/examples" >"$tmp/ebld.log" 2>&1; then
    pass "examples/ configured and built with find_package(stepgraph)"
    for e in own_loop; do
        for b in $backends; do
            out=$("$tmp/examples/$e" $b 2>&1) && pass "examples/$e $b: $out" || fail "examples/$e $b: $out"
        done
    done
else
    fail "examples/: $(tail -n 15 "$tmp/ecfg.log" "$tmp/ebld.log")"
fi
# pkg-config: the shared library.
if ! command -v pkg-config >/dev/null; then
    fail "pkg-config is not installed (make test installs it: pkgconf)"
else
    export PKG_CONFIG_PATH=$lib/pkgconfig
    if cc -o "$tmp/app_pc" "$src/tests/consumer/app.c" $(pkg-config --cflags --libs stepgraph) >"$tmp/pc.log" 2>&1; then
        cc -o "$tmp/own_loop_pc" "$src/examples/own_loop.c" $(pkg-config --cflags --libs stepgraph) >>"$tmp/pc.log" 2>&1 ||
            fail "examples/own_loop with pkg-config: $(tail -n 5 "$tmp/pc.log")"
        for b in $backends; do
            out=$(LD_LIBRARY_PATH=$lib "$tmp/own_loop_pc" $b 2>&1) && pass "examples/own_loop (pkg-config) $b" ||
                fail "examples/own_loop (pkg-config) $b: $out"
            out=$(LD_LIBRARY_PATH=$lib "$tmp/app_pc" $b 2>&1) && pass "cc app.c \$(pkg-config --cflags --libs stepgraph), $b: $out" ||
                fail "pkg-config app $b: $out"
        done
    else
        fail "cc with pkg-config: $(cat "$tmp/pc.log" | head -10)"
    fi
fi
echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
