#!/usr/bin/env bash
# demo.sh BUILD_DIR: the `make demo` job. Trains mlp-512-6-32 eagerly on the GPU; on a machine
# without one, says so and trains a smaller MLP on the CPU reference backend.
set -euo pipefail
build=${1:-build}
bin="$build/stepgraph"
if "$bin" train --help >/dev/null && [ -n "$(command -v nvidia-smi)" ] && nvidia-smi -L >/dev/null 2>&1; then
    echo "== GPU found: training mlp-512-6-32 eagerly on CUDA =="
    exec "$bin" train --model mlp-512-6-32 --steps 1000 --log-every 100 --backend auto
fi
echo "== No GPU found: running the CPU reference backend (the same API and code path, plain C"
echo "   kernels, so about 60 ms/step instead of a fraction of a millisecond). =="
exec "$bin" train --model mlp-512-6-32 --steps 300 --log-every 25 --backend cpu
