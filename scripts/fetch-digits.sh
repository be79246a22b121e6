#!/usr/bin/env bash
# fetch-digits.sh DEST_DIR: puts scikit-learn's 8 x 8 handwritten digits (1797 images, 64 gray
# levels 0..16 then the label 0..9 a line; scikit-learn's BSD-3 licence, the UCI optdigits
# images) at DEST_DIR/digits.csv, for `stepgraph train --model resnet18-32-32 --data
# DEST_DIR/digits.csv` and the digits tests (docs/data.md). Where from, first found first: the
# file already there; an installed scikit-learn; its wheel from PyPI (`pip download`, nothing
# installed: the one member is unzipped); Debian's python3-sklearn (apt-get, as root).
set -euo pipefail
if [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: scripts/fetch-digits.sh DEST_DIR" >&2
    exit 2
fi
dest=$1
out="$dest/digits.csv"
member=sklearn/datasets/data/digits.csv.gz
if [ -s "$out" ]; then
    echo "fetch-digits: $out is there"
    exit 0
fi
mkdir -p "$dest"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fetch-digits.XXXXXX")
trap 'rm -rf "$tmp" "$out.tmp.$$"' EXIT

# digits.csv.gz inside a scikit-learn installed for python $1 (without importing it: that
# would load NumPy and SciPy), on stdout; nothing where there is none.
installed() {
    command -v "$1" >/dev/null || return 0
    "$1" - "$member" 2>/dev/null <<'PY' || true
import importlib.util, os, sys
spec = importlib.util.find_spec("sklearn")
if spec and spec.submodule_search_locations:
    for d in spec.submodule_search_locations:
        p = os.path.join(os.path.dirname(d), sys.argv[1])
        if os.path.isfile(p):
            print(p)
            break
PY
}

# The member from the newest scikit-learn wheel pip finds for this python, into $tmp.
from_wheel() {
    command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1 || return 1
    echo "fetch-digits: downloading scikit-learn's wheel (pip download --no-deps; nothing installed)" >&2
    python3 -m pip download -q --no-deps --only-binary=:all: --no-input scikit-learn -d "$tmp/wheel" >&2 ||
        return 1
    python3 - "$tmp" "$member" <<'PY'
import glob, sys, zipfile
tmp, member = sys.argv[1], sys.argv[2]
wheels = glob.glob(tmp + "/wheel/scikit_learn-*.whl")
if not wheels:
    sys.exit("fetch-digits: pip left no scikit-learn wheel")
with zipfile.ZipFile(wheels[0]) as z, open(tmp + "/digits.csv.gz", "wb") as f:
    f.write(z.read(member))
PY
}

src=$(installed python3)
[ -n "$src" ] || src=$(installed /usr/bin/python3)
if [ -z "$src" ] && from_wheel; then
    src="$tmp/digits.csv.gz"
    from="scikit-learn's wheel from PyPI"
fi
if [ -z "$src" ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "fetch-digits: installing Debian's python3-sklearn (apt-get)" >&2
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y -qq python3-sklearn >&2 ||
        { apt-get update -qq >&2 && apt-get install -y -qq python3-sklearn >&2; }; } || true
    src=$(installed /usr/bin/python3)
fi
if [ -z "$src" ]; then
    echo "fetch-digits: cannot find $member: no scikit-learn is installed for python3, pip could not" \
         "download its wheel from PyPI, and apt-get could not install python3-sklearn (that needs root and a Debian archive)." \
         "Copy digits.csv (or gunzip digits.csv.gz from any scikit-learn) to $out by hand." >&2
    exit 1
fi
# Unpacked beside the target and renamed: a reader never sees half a file.
gzip -dc "$src" > "$out.tmp.$$"
lines=$(wc -l < "$out.tmp.$$")
mv "$out.tmp.$$" "$out"
echo "fetch-digits: $out ($lines images) from ${from:-$src}"
