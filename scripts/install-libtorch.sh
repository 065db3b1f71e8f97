#!/usr/bin/env bash
# Install libtorch 2.11.0 (what tch 0.24 binds) into a project-local folder from PyPI's torch wheel, without
# its Python dependencies, plus the two small CUDA runtime wheels libtorch_cpu.so needs to load and the
# CUDA/NCCL headers the NCCL shim is compiled against. Prints the variables to export. With
# LIBTORCH_USE_PYTORCH=1 (a GPU machine with PyTorch 2.11 and its CUDA wheels installed) it uses that
# PyTorch and fetches only the headers.
#
#   eval "$(scripts/install-libtorch.sh)"     # then: cargo build --features torch
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${TRAINYARD_LIBTORCH_DIR:-$PWD/.libtorch}"
if [ "${LIBTORCH_USE_PYTORCH:-}" != "1" ] && [ ! -f "$DEST/torch/lib/libtorch_cpu.so" ]; then
    python3 -m pip install -q --no-deps --target "$DEST" \
        torch==2.11.0 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cupti==13.0.85 >&2
fi
# Headers only (no libraries) of the CUDA and NCCL wheels torch 2.11 was built with: build.rs compiles
# ProcessGroupNCCL's shim against them (src/comm/nccl_shim.cpp; TRAINYARD_CUDA_HEADERS names the folder).
# The wheels are large; only their include/ folders are kept.
# build.rs stops a CUDA libtorch's build without them; when they cannot be downloaded, this script says
# so and exports TRAINYARD_NCCL=off, so the build goes on without NCCL.
if [ ! -f "$DEST/nvidia/.headers-done" ]; then
    tmp="$(mktemp -d)"
    if python3 -m pip download -q --no-deps -d "$tmp" \
        nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85 nvidia-cublas==13.1.0.3 \
        nvidia-cusparse==12.6.3.3 nvidia-cusolver==12.0.4.66 nvidia-nccl-cu13==2.28.9 >&2; then
        python3 - "$tmp" "$DEST" <<'PY'
import pathlib, sys, zipfile
wheels, dest = pathlib.Path(sys.argv[1]), sys.argv[2]
for wheel in sorted(wheels.glob("*.whl")):
    with zipfile.ZipFile(wheel) as z:
        z.extractall(dest, [m for m in z.namelist() if m.startswith("nvidia/") and "/include/" in m])
PY
        touch "$DEST/nvidia/.headers-done"
    else
        echo "install-libtorch.sh: could not download the CUDA/NCCL headers; building without NCCL" >&2
    fi
    rm -rf "$tmp"
fi
echo "export TRAINYARD_CUDA_HEADERS=$DEST"
if [ ! -f "$DEST/nvidia/.headers-done" ]; then
    echo "export TRAINYARD_NCCL=off"
fi
if [ "${LIBTORCH_USE_PYTORCH:-}" = "1" ]; then
    echo "export LIBTORCH_USE_PYTORCH=1"
else
    echo "export LIBTORCH=$DEST/torch"
fi
