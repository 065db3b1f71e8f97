#!/usr/bin/env bash
# Chaos for a while: deterministic runs interrupted at seeded random moments (a worker killed, SIGTERM to
# the launcher, every process killed during a checkpoint write or a validation), continued by restarts and
# `ckpt_path=auto`, each compared with its uninterrupted twin (tests/chaos.rs). Not part of CI.
#   bench/chaos.sh [MINUTES]            # Candle, one process (60 minutes by default)
#   FEATURES=torch bench/chaos.sh 60    # and two DDP processes (needs libtorch: scripts/install-libtorch.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
export TRAINYARD_CHAOS_MINUTES="${1:-60}"
features=()
if [[ -n "${FEATURES:-}" ]]; then
  eval "$(scripts/install-libtorch.sh)"
  features=(--features "$FEATURES")
fi
cargo test --release "${features[@]}" --test chaos chaos_for_a_while -- --ignored --nocapture 2>&1 \
  | grep -E '^(chaos|faults injected)'
