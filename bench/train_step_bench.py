"""Train-step throughput: trainyard (Candle or tch backend; CPU, or CUDA with tch) vs PyTorch eager on the
same model, batch, precision and thread count, alternating runs. Our figure is `median_step_time_s` from the run's summary.json (forward,
backward and SGD step; data loading excluded), PyTorch's the same statistic of the same three on a fixed
batch (see `summary_median`). Both are over 20 steps by default: a process's first two or three steps fault
in fresh memory (tens of huge pages) and run 1.5-2x slower, so a 5-step median measured mostly that warm-up,
not the steady state a training run spends its time in. Ours starts each step from the loader's host
batch and moves it to the device inside the step; on CUDA, PyTorch is measured both with its batch
resident on the GPU (pure compute) and copied from pinned host memory each step (what a training loop
does), and both ratios are printed and recorded.

    .venv-torch/bin/python bench/train_step_bench.py --threads 2 --rounds 3 --record
    .venv-torch/bin/python bench/train_step_bench.py --compile --rounds 5 --record  # and torch.compile

    python3 bench/train_step_bench.py --backend tch --device cuda --precision 16-mixed --record  # a GPU
    .venv-torch/bin/python bench/train_step_bench.py --isa avx2 --record  # AVX2 paths on an AVX-512 CPU

Needs torch 2.11 (and torchvision for resnet18-cifar) in the interpreter, and `cargo build --release` first
(`--features torch` for tch; TRAIN=<path> names another build).
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import ROOT, cap_isa, machine, record  # noqa: E402

TRAIN = os.environ.get("TRAIN", os.path.join(ROOT, "target", "release", "train"))

MODELS = {
    # name: (trainyard overrides, PyTorch builder)
    "resnet18-cifar": (
        ["model=resnet18", "model.cifar_stem=true", "~model.channels"],
        lambda: cifar_resnet18(),
    ),
    "cnn": (["model=cnn", "model.channels=[16,32,64]"], lambda: cnn([16, 32, 64])),
    "resnet50-64px": (["model=resnet50", "~model.channels", "data.image_size=64"], lambda: resnet50()),
    "vit-tiny": (["model=vit_b32", "~model.channels", "model.variant=tiny", "model.patch_size=8"], lambda: vit_tiny()),
}
# Input size per model (32 unless named).
IMAGE_SIZE = {"resnet50-64px": 64}


def resnet50() -> nn.Module:
    import torchvision

    return torchvision.models.resnet50(num_classes=10)


def vit_tiny() -> nn.Module:
    """ViT-Tiny/8 at 32 px, timm's module (as bench/oracle.py checks ours against)."""
    import timm.models.vision_transformer as tv

    return tv.VisionTransformer(img_size=32, patch_size=8, embed_dim=192, depth=12, num_heads=3, num_classes=10)


def cifar_resnet18() -> nn.Module:
    import torchvision

    m = torchvision.models.resnet18(num_classes=10)
    m.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    m.maxpool = nn.Identity()
    return m


def cnn(channels) -> nn.Module:
    layers, c_in = [], 3
    for c in channels:
        layers += [nn.Conv2d(c_in, c, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2)]
        c_in = c
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, 10))


def torch_steps(model_name: str, batch: int, steps: int, threads: int, device: str = "cpu",
                precision: str = "32-true", host_input: bool = False, compile_times: list = None) -> float:
    """Lightning's precisions: 16-mixed = autocast(float16) + GradScaler, bf16-mixed = autocast(bfloat16).
    On CUDA each step ends by reading the loss, as ours does (its statistics go to the host).
    `host_input`: the batch starts each step in pinned host memory and is copied over without blocking
    (a DataLoader with pin_memory=True, then `.to(device, non_blocking=True)`), as ours starts each step
    from the loader's host batch; otherwise it stays on the device, which no training loop gets.
    `compile_times` (a list): the model under `torch.compile` (inductor, default mode; the optimizer step stays eager, as
    a user compiles a LightningModule's model); its first steps compile and are left out of the figure
    (their time, the compile time, is appended to `compile_times`), then `steps` + 1 steps are timed."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = MODELS[model_name][1]().to(device)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    compiled = compile_times is not None
    forward = torch.compile(model) if compiled else model
    warm_up = COMPILE_WARM_UP if compiled else 0
    loss_fn = nn.CrossEntropyLoss()
    size = IMAGE_SIZE.get(model_name, 32)
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    if host_input:
        x_host, y_host = x.cpu().pin_memory(), y.cpu().pin_memory()
    dtype = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler(device) if precision == "16-mixed" else None
    times = []
    for _ in range(warm_up + steps + 1):
        t0 = time.perf_counter()
        if host_input:
            x, y = x_host.to(device, non_blocking=True), y_host.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=dtype, enabled=dtype is not None):
            loss = loss_fn(forward(x), y)
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        loss.item()
        times.append(time.perf_counter() - t0)
    if compiled:
        compile_times.append(sum(times[:warm_up]))
    return summary_median(times[warm_up:])


# The compiled model's first steps (the first compiles forward and backward; a recompile may follow when
# the optimizer's state appears).
COMPILE_WARM_UP = 3


def summary_median(times) -> float:
    """The statistic summary.json's `median_step_time_s` is (src/trainer/summary.rs `median`): over every step of
    the run, the first included, the upper middle value for an even count. Ours runs steps + 1 steps, so
    PyTorch's figure is taken the same way over its steps + 1."""
    return sorted(times)[len(times) // 2]


def ours_steps(model_name: str, batch: int, steps: int, threads: int, backend: str = "candle",
               device: str = "cpu", precision: str = "32-true") -> float:
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            TRAIN, "experiment=quickstart", *MODELS[model_name][0], f"data.batch_size={batch}",
            "optimizer=sgd", "optimizer.lr=0.01", "scheduler=constant", "trainer.max_epochs=1",
            f"trainer.limit_train_batches={steps + 1}", "trainer.limit_val_batches=0", "callbacks=none",
            "data.num_workers=0",  # batches made between steps, so loader threads do not share the cores
            f"data.train_size={batch * (steps + 1)}",  # every step a full batch
            f"hydra.run.dir={out}", f"backend={backend}", f"trainer.precision={precision}",
            "trainer.accelerator=" + ("gpu" if device == "cuda" else "cpu"),
        ]
        # Candle's kernels use rayon; libtorch's use OpenMP.
        env = dict(os.environ, RAYON_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return json.load(open(os.path.join(out, "summary.json")))["median_step_time_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet18-cifar,cnn,resnet50-64px,vit-tiny")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backend", default="candle", choices=["candle", "tch"],
                    help="tch needs `cargo build --release --features torch`")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda needs --backend tch")
    ap.add_argument("--precision", default="32-true", choices=["32-true", "16-mixed", "bf16-mixed"])
    ap.add_argument("--isa", default="native", choices=["native", "avx2"],
                    help="avx2: both sides capped at AVX2 on this CPU (CPU runs only)")
    ap.add_argument("--compile", action="store_true",
                    help="also time PyTorch under torch.compile (inductor, default mode; CPU runs only)")
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    if args.compile and args.device != "cpu":
        sys.exit("--compile is measured on the CPU only")
    if args.compile and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        # A fresh cache: the first round compiles from scratch, as a user's first run does; later rounds
        # load inductor's cached kernels, as a user's later runs do. Both times are reported.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
    cap_isa(args.isa)
    if args.device == "cuda" and args.backend != "tch":
        sys.exit("--device cuda needs --backend tch (Candle runs on the CPU)")
    for name in args.models.split(","):
        ours, theirs, fed, compiled, compile_s = [], [], [], [], []
        for _ in range(args.rounds):
            ours.append(ours_steps(name, args.batch, args.steps, args.threads, args.backend, args.device,
                                   args.precision))
            theirs.append(torch_steps(name, args.batch, args.steps, args.threads, args.device, args.precision))
            if args.compile:
                # At the run's precision: under bf16-mixed, torch.compile of the autocast step.
                compiled.append(torch_steps(name, args.batch, args.steps, args.threads, args.device, args.precision,
                                            compile_times=compile_s))
            if args.device == "cuda":
                fed.append(torch_steps(name, args.batch, args.steps, args.threads, args.device, args.precision,
                                       host_input=True))
        o, t = statistics.median(ours), statistics.median(theirs)
        ratio = t / o
        print(f"{name}: trainyard {args.batch / o:.1f} img/s, PyTorch {args.batch / t:.1f} img/s, ratio {ratio:.2f}x")
        fed_note = ""
        if fed:
            f = statistics.median(fed)
            print(f"  PyTorch with the batch copied from pinned host memory each step: {args.batch / f:.1f} img/s, "
                  f"ratio {f / o:.2f}x")
            fed_note = f"; {args.batch / f:.1f} img/s with the batch copied from pinned host memory each step " \
                       f"(**{f / o:.2f}x** against that)"
        compile_note = ""
        if compiled:
            c = statistics.median(compiled)
            print(f"  PyTorch torch.compile (inductor): {args.batch / c:.1f} img/s, ratio {c / o:.2f}x "
                  f"(per round {' '.join(f'{b / a:.2f}' for a, b in zip(ours, compiled))}); its warm-up "
                  f"steps (compiling) took {compile_s[0]:.1f} s in round 1, "
                  f"{statistics.median(compile_s[1:] or compile_s):.1f} s later (cached), not in its figure")
            compile_note = f"; torch.compile (inductor, default mode, timed after {COMPILE_WARM_UP} warm-up " \
                           f"steps, which took {compile_s[0]:.1f} s in round 1 and " \
                           f"{statistics.median(compile_s[1:] or compile_s):.1f} s with inductor's cache): " \
                           f"{args.batch / c:.1f} img/s (**{c / o:.2f}x** against that)"
        # Each round's pair ran back to back: their spread is this machine's noise on the ratio.
        pairs = [b / a for a, b in zip(ours, theirs)]
        print(f"  per round: trainyard {' '.join(f'{x * 1e3:.1f}' for x in ours)} ms, "
              f"PyTorch {' '.join(f'{x * 1e3:.1f}' for x in theirs)} ms, "
              f"ratios {' '.join(f'{r:.2f}' for r in pairs)} (spread {min(pairs):.2f}-{max(pairs):.2f})")
        if args.record:
            if args.device == "cuda":
                section = "Train step throughput, CUDA, backend=tch (issue: distributed / GPU)"
                where = torch.cuda.get_device_name(0)
            elif args.backend == "candle":
                section = "Train step throughput, CPU (issue: training core)"
                where = machine(args.isa)
            else:
                section = "Train step throughput, CPU, backend=tch (issue: tch backend)"
                where = machine(args.isa)
            extra = "" if args.batch == 64 else f" --batch {args.batch}"
            extra += "" if args.device == "cpu" else f" --device {args.device}"
            extra += "" if args.precision == "32-true" else f" --precision {args.precision}"
            if args.isa == "avx2":
                extra += " --isa avx2"
            if args.compile:
                extra += " --compile"
            record(
                section,
                f"| {datetime.date.today()} | {name} train step (fwd+bwd+SGD), backend={args.backend}, "
                f"{args.precision}, batch {args.batch}, {args.threads} threads "
                f"| {args.batch / o:.1f} img/s | PyTorch {torch.__version__} eager: {args.batch / t:.1f} img/s"
                f"{' (batch resident on the device)' if fed else ''}{fed_note}{compile_note} "
                f"| **{ratio:.2f}x** | {where} "
                f"| `python bench/train_step_bench.py --models {name} --threads {args.threads} "
                f"--rounds {args.rounds} --steps {args.steps} --backend {args.backend}{extra} --record` |",
            )


if __name__ == "__main__":
    main()
