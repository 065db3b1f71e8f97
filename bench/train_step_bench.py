"""Train-step throughput: trainyard (Candle backend, CPU) vs PyTorch eager on the same model, batch and
thread count, alternating runs. Our figure is `median_step_time_s` from the run's summary.json (forward,
backward and SGD step; data loading excluded), PyTorch's the same statistic of the same three on a fixed
batch (see `summary_median`). Both are over 20 steps by default: a process's first two or three steps fault
in fresh memory (tens of huge pages) and run 1.5-2x slower, so a 5-step median measured mostly that warm-up,
not the steady state a training run spends its time in.

    .venv-torch/bin/python bench/train_step_bench.py --threads 2 --rounds 3 --record

Needs torch 2.11 and torchvision in the interpreter, and `cargo build --release` first.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import ROOT, record  # noqa: E402

TRAIN = os.path.join(ROOT, "target", "release", "train")

MODELS = {
    # name: (trainyard overrides, PyTorch builder)
    "resnet18-cifar": (
        ["model=resnet18", "model.cifar_stem=true", "~model.channels"],
        lambda: cifar_resnet18(),
    ),
    "cnn": (["model=cnn", "model.channels=[16,32,64]"], lambda: cnn([16, 32, 64])),
}


def cifar_resnet18() -> nn.Module:
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


def torch_steps(model_name: str, batch: int, steps: int, threads: int) -> float:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = MODELS[model_name][1]()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(batch, 3, 32, 32)
    y = torch.randint(0, 10, (batch,))
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return summary_median(times)


def summary_median(times) -> float:
    """The statistic summary.json's `median_step_time_s` is (src/trainer.rs `median`): over every step of
    the run, the first included, the upper middle value for an even count. Ours runs steps + 1 steps, so
    PyTorch's figure is taken the same way over its steps + 1."""
    return sorted(times)[len(times) // 2]


def ours_steps(model_name: str, batch: int, steps: int, threads: int, backend: str = "candle") -> float:
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            TRAIN, "experiment=quickstart", *MODELS[model_name][0], f"data.batch_size={batch}",
            "optimizer=sgd", "optimizer.lr=0.01", "scheduler=constant", "trainer.max_epochs=1",
            f"trainer.limit_train_batches={steps + 1}", "trainer.limit_val_batches=0", "callbacks=none",
            "data.num_workers=0",  # batches made between steps, so loader threads do not share the cores
            f"hydra.run.dir={out}", f"backend={backend}",
        ]
        # Candle's kernels use rayon; libtorch's use OpenMP.
        env = dict(os.environ, RAYON_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return json.load(open(os.path.join(out, "summary.json")))["median_step_time_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet18-cifar,cnn")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backend", default="candle", choices=["candle", "tch"],
                    help="tch needs `cargo build --release --features torch`")
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    for name in args.models.split(","):
        ours, theirs = [], []
        for _ in range(args.rounds):
            ours.append(ours_steps(name, args.batch, args.steps, args.threads, args.backend))
            theirs.append(torch_steps(name, args.batch, args.steps, args.threads))
        o, t = statistics.median(ours), statistics.median(theirs)
        ratio = t / o
        print(f"{name}: trainyard {args.batch / o:.1f} img/s, PyTorch {args.batch / t:.1f} img/s, ratio {ratio:.2f}x")
        if args.record:
            section = ("Train step throughput, CPU (issue: training core)" if args.backend == "candle"
                       else "Train step throughput, CPU, backend=tch (issue: tch backend)")
            record(
                section,
                f"| {datetime.date.today()} | {name} train step (fwd+bwd+SGD), backend={args.backend}, batch {args.batch}, {args.threads} threads "
                f"| {args.batch / o:.1f} img/s | PyTorch {torch.__version__} eager: {args.batch / t:.1f} img/s "
                f"| **{ratio:.2f}x** | {platform.machine()}, {os.cpu_count()} cores "
                f"| `.venv-torch/bin/python bench/train_step_bench.py --models {name} --threads {args.threads} "
                f"--rounds {args.rounds} --steps {args.steps} --backend {args.backend} --record` |",
            )


if __name__ == "__main__":
    main()
