#!/usr/bin/env bash
# Install libtorch 2.11.0 (what tch 0.24 binds) into a project-local folder from PyPI's torch wheel, without
# its Python dependencies, plus the two small CUDA runtime wheels libtorch_cpu.so needs to load. Prints the
# LIBTORCH=... line to export. With LIBTORCH_USE_PYTORCH=1 (a machine with PyTorch 2.11 installed) it
# installs nothing and uses that PyTorch instead.
#
#   eval "$(scripts/install-libtorch.sh)"     # then: cargo build --features torch
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${LIBTORCH_USE_PYTORCH:-}" = "1" ]; then
    echo "export LIBTORCH_USE_PYTORCH=1"
    exit 0
fi
DEST="${TRAINYARD_LIBTORCH_DIR:-$PWD/.libtorch}"
if [ ! -f "$DEST/torch/lib/libtorch_cpu.so" ]; then
    python3 -m pip install -q --no-deps --target "$DEST" \
        torch==2.11.0 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cupti==13.0.85 >&2
fi
echo "export LIBTORCH=$DEST/torch"
