#!/usr/bin/env bash
# Run every benchmark and append results to bench/RESULTS.md. Needs hydra-core 1.3.2 in .venv-oracle.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv-oracle/bin/python ] || { python3 -m venv .venv-oracle && .venv-oracle/bin/pip install -q hydra-core==1.3.2; }
cargo build --release
.venv-oracle/bin/python bench/compose_bench.py --runs 30 --record
