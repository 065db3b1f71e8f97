#!/usr/bin/env bash
# An installed `train` used as a new user would, in an empty folder with no project above it: the quick
# start, a sweep and the logbook on the built-in configs, then `train init` and the project it makes.
# With `torch` (the trainyard-torch wheel, or a `--features torch` build): the quick start on libtorch,
# a 2-rank DDP run over c10d on the CPU, and the mission's command on two "nodes" (two processes with
# NODE_RANK 0 and 1 on loopback) over a generated CIFAR-10 in its binary format. CI runs it on
# `cargo install`'s binary and on each wheel's.
#
#   scripts/smoke-installed.sh /path/to/bin/train [torch]
set -euo pipefail
TRAIN="$1"
KIND="${2:-candle}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
unset TRAIN_CONFIG_PATH
SMALL=(trainer.max_epochs=1 data.train_size=256 data.val_size=64 data.batch_size=64)
step() { echo "-- $*" >&2; }

step "quick start, sweep and logbook from an empty folder ($TRAIN)"
"$TRAIN" experiment=quickstart "${SMALL[@]}"
"$TRAIN" -m sweep=lr experiment=quickstart "${SMALL[@]}"
"$TRAIN" logbook
test -s logs/logbook.md

step "train init, and the project it writes trains"
"$TRAIN" init proj
(cd proj && "$TRAIN" experiment=example "${SMALL[@]}" && test -n "$(ls logs/example/runs)")

if [ "$KIND" = torch ]; then
    step "the quick start on libtorch"
    "$TRAIN" experiment=quickstart backend=tch "${SMALL[@]}" hydra.run.dir=logs/tch
    test -s logs/tch/summary.json

    step "2 ranks, DDP over c10d (Gloo) on the CPU"
    "$TRAIN" experiment=quickstart trainer=ddp trainer.accelerator=cpu trainer.devices=2 "${SMALL[@]}" \
        hydra.run.dir=logs/ddp2
    test -s logs/ddp2/summary.json

    step "the mission's command on two nodes: train experiment=cifar trainer=ddp trainer.num_nodes=2"
    python3 - data/cifar-10-batches-bin <<'PY'
import os, random, sys
root = sys.argv[1]
os.makedirs(root, exist_ok=True)
rng = random.Random(0)
def write(name, n):
    with open(os.path.join(root, name), "wb") as f:
        for i in range(n):
            f.write(bytes([i % 10]) + rng.randbytes(3072))
for k in range(1, 6):
    write(f"data_batch_{k}.bin", 16)
write("test_batch.bin", 16)
PY
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    # The experiment's ViT-B/32 starts from timm's weights, which cannot be downloaded here: from scratch;
    # on libtorch (this debug build's own Candle kernels are unoptimised).
    mission=(experiment=cifar trainer=ddp trainer.num_nodes=2 trainer.accelerator=cpu trainer.precision=32-true
        trainer.devices=1 trainer.max_epochs=1 trainer.limit_train_batches=2 trainer.limit_val_batches=1
        data.batch_size=8 data.num_workers=0 trainer.rendezvous_timeout_s=120 model.pretrained=null backend=tch)
    MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" NODE_RANK=1 \
        "$TRAIN" "${mission[@]}" hydra.run.dir=logs/node1 > node1.log 2>&1 &
    node1=$!
    MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" NODE_RANK=0 "$TRAIN" "${mission[@]}" hydra.run.dir=logs/node0
    wait "$node1" || { cat node1.log; exit 1; }
    python3 - logs/node0/summary.json <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert (s["status"], s["strategy"], s["num_nodes"], s["global_step"]) == ("completed", "ddp", 2, 2), s
assert s["global_batch_size"] == 16, s
PY
fi
echo "smoke-installed: $KIND passed ($TRAIN)" >&2
