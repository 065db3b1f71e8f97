#!/usr/bin/env bash
# The checks a CPU machine cannot run, for a machine with an NVIDIA GPU and PyTorch 2.11 (cu130) but no
# Rust toolchain (build `train` elsewhere with --features torch and bring it along):
#   - tch on CUDA: the quick start at 32-true, 16-mixed and bf16-mixed, and without pinned host memory;
#   - DDP over NCCL in a one-GPU world, against the same run over Gloo (same final metrics);
#   - AMP + DDP together (16-mixed over NCCL);
#   - FSDP FULL_SHARD with its slices on the GPU, gathered and reduce-scattered by NCCL, against the same
#     run over Gloo (where the slices go through host memory);
#   - DataParallel with one replica on the GPU (its gradient sums stay on the device);
#   - the batch-size finder on the GPU: ResNet-50 at 224 px doubles its batch until CUDA runs out of
#     memory (the out-of-memory error must end a trial, not the run);
#   - a declared model (conf/model/declared_resnet18.yaml) on CUDA: 32-true, 16-mixed, and FSDP over NCCL
#     (each top-level layer a unit);
#   - a TorchScript module (tests/fixtures/torchscript_oracle.py's cnn, scripted by PyTorch here) on CUDA:
#     32-true, 16-mixed and bf16-mixed under libtorch's autocast, DDP over NCCL, DataParallel;
#   - lightning-hydra-template's `trainer=gpu` with its own configs (tests/fixtures/template) on MNIST in
#     torchvision's folder (written here);
#   - the logbook over all of them (GPU memory and utilisation from DeviceStatsMonitor's NVML samples).
# Each run's summary.json is copied to $OUT_DIR, with the wall time in times.txt; then (BENCH=0 skips it)
# bench/train_step_bench.py on CUDA against PyTorch eager, recorded in bench/RESULTS.md (copied to $OUT_DIR).
# Each run is stopped after RUN_TIMEOUT seconds (default 180), so one hang does not spend the lease.
# CHECKS picks the groups (default all): core finder declared torchscript template bench; ROUNDS the
# benches' rounds (default 3).
#
#   TRAIN=target-torch/release/train OUT_DIR=$OUT/gpu CHECKS="core torchscript" scripts/gpu-check.sh
#   # or from the trainyard-torch wheel (scripts/build-wheels.sh torch) installed into the GPU machine's PyTorch:
#   python3 -m pip install --no-deps trainyard_torch-*.whl
#   TRAIN="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["scripts"])')/train" scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
TRAIN="$(realpath "${TRAIN:-target-torch/release/train}")"
OUT_DIR="$(realpath -m "${OUT_DIR:-gpu-check}")"
mkdir -p "$OUT_DIR"
# The wheel's libtorch (its libtorch_cuda.so finds cuBLAS, cuDNN and NCCL through its own rpath).
TORCH_LIB="$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
export LD_LIBRARY_PATH="$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT_DIR/gpu.txt"

work="$(mktemp -d)"
cp -r conf experiments "$work"/
cd "$work"
: >"$OUT_DIR/times.txt"
failed=0
CHECKS=" ${CHECKS:-core finder declared torchscript template bench} "
# want GROUP: is GROUP among $CHECKS?
want() { [[ "$CHECKS" == *" $1 "* ]]; }

# run NAME ARGS...: one `train` run; its summary.json goes to $OUT_DIR/NAME.json.
run() {
    local name="$1"
    shift
    echo "== $name: train $*"
    rm -rf logs
    local start end
    start="$(date +%s%N)"
    if timeout "${RUN_TIMEOUT:-180}" "$TRAIN" "$@" >"$OUT_DIR/$name.log" 2>&1; then
        end="$(date +%s%N)"
        # Whole milliseconds in bash's own arithmetic (no `bc` on the GPU machine).
        echo "$name $(((end - start) / 1000000)) ms" | tee -a "$OUT_DIR/times.txt"
        cp "$(find logs -name summary.json -path '*runs*' | head -1)" "$OUT_DIR/$name.json"
        tail -2 "$OUT_DIR/$name.log"
        mkdir -p all-logs && mv logs "all-logs/$name"
    else
        echo "FAILED: $name (log: $OUT_DIR/$name.log)"
        tail -20 "$OUT_DIR/$name.log"
        failed=1
    fi
}

QS=(experiment=quickstart backend=tch trainer.accelerator=gpu)
if want core; then
run tch_gpu_32 "${QS[@]}"
run tch_gpu_16_mixed "${QS[@]}" trainer.precision=16-mixed
run tch_gpu_bf16_mixed "${QS[@]}" trainer.precision=bf16-mixed
# Without pinned host memory the loader's batches go to the GPU by a pageable copy (same metrics).
run tch_gpu_no_pin "${QS[@]}" data.pin_memory=false
DDP=("${QS[@]}" trainer=ddp trainer.devices=1 trainer.max_epochs=2 trainer.accelerator=gpu)
run ddp_nccl "${DDP[@]}" trainer.process_group_backend=nccl
run ddp_gloo "${DDP[@]}" trainer.process_group_backend=gloo
run ddp_nccl_16_mixed "${DDP[@]}" trainer.process_group_backend=nccl trainer.precision=16-mixed
FSDP=("${QS[@]}" trainer=fsdp trainer.devices=1 trainer.accelerator=gpu trainer.fsdp.sharding_strategy=FULL_SHARD)
run fsdp_nccl "${FSDP[@]}" trainer.process_group_backend=nccl
run fsdp_gloo "${FSDP[@]}" trainer.process_group_backend=gloo
run dp_gpu "${QS[@]}" trainer=dp trainer.devices=1 trainer.accelerator=gpu
# Dropout masks drawn on the GPU, twice with trainer.deterministic=true: the same metrics to the bit.
DET=("${QS[@]}" model.dropout=0.3 trainer.deterministic=true trainer.max_epochs=1)
run dropout_det_a "${DET[@]}"
run dropout_det_b "${DET[@]}"
fi
want finder && run batch_finder_gpu model=resnet50 data=synthetic data.image_size=224 data.train_size=4096 data.val_size=64 \
    backend=tch trainer.accelerator=gpu trainer.max_epochs=1 \
    +callbacks.batch_size_finder.mode=power +callbacks.batch_size_finder.fit_after=false
# A declared model (YAML layers) on CUDA, with mixed precision and as FSDP units over NCCL.
if want declared; then
DECL=(experiment=quickstart model=declared_resnet18 backend=tch trainer.accelerator=gpu data.train_size=1024
    data.val_size=256 trainer.max_epochs=1)
run declared_gpu_32 "${DECL[@]}"
run declared_gpu_16_mixed "${DECL[@]}" trainer.precision=16-mixed
run declared_fsdp_nccl "${DECL[@]}" trainer=fsdp trainer.devices=1 trainer.accelerator=gpu \
    trainer.fsdp.sharding_strategy=FULL_SHARD trainer.process_group_backend=nccl
fi
if want torchscript; then
    # PyTorch scripts the tests' modules on this machine (its own libtorch, the one `train` runs on).
    mkdir -p nets && python3 "$REPO/tests/fixtures/torchscript_oracle.py" make nets
    TS=(model=torchscript model.path=nets/cnn.pt backend=tch trainer.accelerator=gpu data=synthetic
        data.num_classes=5 data.image_size=16 data.train_size=1024 data.val_size=256 data.batch_size=64
        trainer.max_epochs=2 optimizer.lr=0.05)
    run ts_gpu_32 "${TS[@]}"
    run ts_gpu_16_mixed "${TS[@]}" trainer.precision=16-mixed
    run ts_gpu_bf16_mixed "${TS[@]}" trainer.precision=bf16-mixed
    run ts_ddp_nccl "${TS[@]}" trainer=ddp trainer.devices=1 trainer.accelerator=gpu trainer.process_group_backend=nccl
    run ts_dp_gpu "${TS[@]}" trainer=dp trainer.devices=1 trainer.accelerator=gpu
    run ts_transformer_gpu_16_mixed "${TS[@]}" model.path=nets/transformer.pt trainer.precision=16-mixed
fi
if want template; then
    # The template's configs untouched, MNIST as torchvision keeps it: `python src/train.py trainer=gpu`.
    cp -r "$REPO/tests/fixtures/template" tpl
    python3 - tpl/data/MNIST/raw <<'MNIST'
import gzip, os, struct, sys
raw = sys.argv[1]
os.makedirs(raw, exist_ok=True)
for prefix, n, salt in [("train", 1000, 0), ("t10k", 200, 1000)]:
    images, labels = bytearray(struct.pack(">IIII", 0x0803, n, 28, 28)), bytearray(struct.pack(">II", 0x0801, n))
    for i in range(n):
        c = (i * 7 + salt) % 10
        top, left = 2 + (c // 5) * 13, 1 + (c % 5) * 5
        images += bytes(255 if top <= j // 28 < top + 8 and left <= j % 28 < left + 5 else (i * 31 + j * 17) % 23
                        for j in range(784))
        labels.append(c)
    for name, data in [("images-idx3-ubyte", images), ("labels-idx1-ubyte", labels)]:
        with gzip.open(f"{raw}/{prefix}-{name}.gz", "wb") as f:
            f.write(bytes(data))
MNIST
    cd tpl
    PROJECT_ROOT="$PWD" run template_gpu -cp "$PWD/configs" -cn train trainer=gpu \
        "data.train_val_test_split=[800,200,200]" trainer.max_epochs=3
    cd ..
    if [ -d tpl/all-logs ]; then mkdir -p all-logs && mv tpl/all-logs/* all-logs/; fi
fi
if [ -d all-logs ]; then
    "$TRAIN" logbook all-logs -o "$OUT_DIR/logbook.md" || failed=1
fi

python3 - "$OUT_DIR" <<'PY' || failed=1
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def final(name):
    p = out / f"{name}.json"
    return json.loads(p.read_text())["final_metrics"] if p.exists() else None
for name in ["tch_gpu_32", "tch_gpu_16_mixed", "tch_gpu_bf16_mixed", "tch_gpu_no_pin", "ddp_nccl", "ddp_gloo",
             "ddp_nccl_16_mixed", "fsdp_nccl", "fsdp_gloo", "dp_gpu", "declared_gpu_32", "declared_gpu_16_mixed",
             "declared_fsdp_nccl", "ts_gpu_32", "ts_gpu_16_mixed", "ts_gpu_bf16_mixed", "ts_ddp_nccl", "ts_dp_gpu",
             "ts_transformer_gpu_16_mixed", "template_gpu"]:
    print(name, final(name))
    p = out / f"{name}.json"
    if p.exists():
        print("   device_stats:", json.loads(p.read_text()).get("device_stats"))
p = out / "batch_finder_gpu.json"
if p.exists():
    print("batch_finder_gpu:", json.loads(p.read_text()).get("batch_size_finder"))
a, b = final("dropout_det_a"), final("dropout_det_b")
if a and b:
    same = a == b
    print(f"dropout, deterministic, two runs: {'identical' if same else 'DIFFERENT'} {a} {b}")
    if not same:
        sys.exit(1)
for what in ["ddp", "fsdp"]:
    nccl, gloo = final(f"{what}_nccl"), final(f"{what}_gloo")
    if nccl and gloo:
        diff = abs(nccl["val/loss"] - gloo["val/loss"])
        print(f"{what.upper()} NCCL vs Gloo: val/loss differs by {diff:.2e}")
PY

# Train-step speed on the GPU against PyTorch eager, recorded in bench/RESULTS.md (with the GPU's name).
if [ "${BENCH:-1}" = "1" ] && want bench; then
    cd "$REPO"
    for precision in 32-true 16-mixed; do
        TRAIN="$TRAIN" python3 bench/train_step_bench.py --models cnn,resnet18-cifar --backend tch --device cuda \
            --precision "$precision" --threads 4 --rounds "${ROUNDS:-3}" --batch 256 --record || failed=1
    done
    # The declared ResNet-18 against the built-in one, same binary (must keep the built-in's speed).
    TRAIN="$TRAIN" python3 bench/declared_bench.py --backend tch --device cuda --batch 256 --threads 4 --rounds "${ROUNDS:-3}" \
        --record || failed=1
    # A scripted ResNet-18 on CUDA against PyTorch eager training the same loaded module.
    TRAIN="$TRAIN" python3 bench/torchscript_bench.py --device cuda --steps 40 --batch 256 --image 32 --threads 4 \
        --rounds "${ROUNDS:-3}" --record || failed=1
    cp bench/RESULTS.md "$OUT_DIR/RESULTS.md"
fi
exit "$failed"
