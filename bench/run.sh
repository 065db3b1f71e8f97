#!/usr/bin/env bash
# Run every benchmark and append results to bench/RESULTS.md. Makes .venv-oracle (hydra-core 1.3.2),
# .venv-bench (pandas + matplotlib, the reference for the logbook) and
# .venv-torch (torch 2.11 + torchvision + timm, the reference for training speed and model correctness).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv-oracle/bin/python ] || { python3 -m venv .venv-oracle && .venv-oracle/bin/pip install -q hydra-core==1.3.2; }
cargo build --release --examples
.venv-oracle/bin/python bench/compose_bench.py --runs 30 --record
[ -x .venv-torch/bin/python ] || { python3 -m venv .venv-torch && .venv-torch/bin/pip install -q torch==2.11.0 torchvision==0.26.0 timm safetensors; }
.venv-torch/bin/python bench/train_step_bench.py --threads 2 --rounds 5 --compile --record
.venv-torch/bin/python bench/conv_profile.py --threads 2 --record
.venv-torch/bin/python bench/vit_profile.py --threads 2 --record
.venv-torch/bin/python bench/oracle.py --record
.venv-torch/bin/python bench/loader_bench.py --workers 1 2 --rounds 3 --record
LIBTORCH="$PWD/.libtorch/torch" CARGO_TARGET_DIR=target-torch cargo build --features torch --example allreduce_bench
.venv-torch/bin/python bench/allreduce_bench.py --exe target-torch/debug/examples/allreduce_bench --rounds 5 --record
.venv-torch/bin/python bench/ddp_bench.py --train target-torch/debug/train --rounds 3 --record
LIBTORCH="$PWD/.libtorch/torch" CARGO_TARGET_DIR=target-torch cargo build --release --features s3,torch --bin train
.venv-torch/bin/python bench/fsdp_bench.py --train target-torch/release/train --rounds 3 --record
.venv-torch/bin/python bench/dp_bench.py --train target-torch/release/train --rounds 3 --record
[ -x .venv-bench/bin/python ] || { python3 -m venv .venv-bench && .venv-bench/bin/pip install -q pandas pyyaml tabulate matplotlib; }
cargo build --release
.venv-bench/bin/python bench/logbook_bench.py --runs 200 --epochs 30 --rounds 7 --record
.venv-bench/bin/python bench/logbook_bench.py --runs 200 --epochs 30 --rounds 7 --no-plots --record
