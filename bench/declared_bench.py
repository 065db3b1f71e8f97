"""Declared model vs the built-in one: `model=declared_resnet18` (torchvision's CIFAR ResNet-18 written as
declared layers, conf/model/declared_resnet18.yaml) against `model=resnet18 model.cifar_stem=true`, the same
binary, backend, batch, precision and thread count, alternated round by round. The declared graph must keep
the built-in's fused kernels (goal: at least 0.95x its train step). The figure is each run's
`median_step_time_s` (forward, backward and SGD step; see bench/train_step_bench.py).

    python3 bench/declared_bench.py --threads 2 --rounds 5 --record                  # Candle on the CPU
    python3 bench/declared_bench.py --backend tch --device cuda --batch 256 --record  # a GPU

Needs `cargo build --release` (`--features torch` for tch; TRAIN=<path> names another build). No PyTorch:
both sides are trainyard.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import ROOT, machine, record  # noqa: E402

TRAIN = os.environ.get("TRAIN", os.path.join(ROOT, "target", "release", "train"))
SIDES = {
    "built-in": ["model=resnet18", "model.cifar_stem=true", "~model.channels"],
    "declared": ["model=declared_resnet18"],
}


def step_time(side: str, args) -> float:
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            TRAIN, "experiment=quickstart", *SIDES[side], f"data.batch_size={args.batch}",
            "optimizer=sgd", "optimizer.lr=0.01", "scheduler=constant", "trainer.max_epochs=1",
            f"trainer.limit_train_batches={args.steps + 1}", "trainer.limit_val_batches=0", "callbacks=none",
            "data.num_workers=0", f"data.train_size={args.batch * (args.steps + 1)}",
            f"hydra.run.dir={out}", f"backend={args.backend}", f"trainer.precision={args.precision}",
            "trainer.accelerator=" + ("gpu" if args.device == "cuda" else "cpu"),
        ]
        env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads))
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        return json.load(open(os.path.join(out, "summary.json")))["median_step_time_s"]


def gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown GPU"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backend", default="candle", choices=["candle", "tch"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--precision", default="32-true", choices=["32-true", "16-mixed", "bf16-mixed"])
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    times = {side: [] for side in SIDES}
    for _ in range(args.rounds):
        for side in SIDES:
            times[side].append(step_time(side, args))
    built, declared = statistics.median(times["built-in"]), statistics.median(times["declared"])
    ratio = built / declared
    pairs = [b / d for b, d in zip(times["built-in"], times["declared"])]
    print(f"declared_resnet18 {declared * 1e3:.1f} ms/step, built-in resnet18 {built * 1e3:.1f} ms/step: "
          f"{ratio:.3f}x (per round {' '.join(f'{r:.3f}' for r in pairs)})")
    if args.record:
        where = gpu_name() if args.device == "cuda" else machine()
        extra = f" --backend {args.backend}" if args.backend != "candle" else ""
        extra += f" --device {args.device}" if args.device != "cpu" else ""
        extra += f" --precision {args.precision}" if args.precision != "32-true" else ""
        record(
            "Declared models vs the built-in zoo (issue: your own model)",
            f"| {datetime.date.today()} | declared_resnet18 vs resnet18 cifar_stem train step (fwd+bwd+SGD), "
            f"backend={args.backend}, {args.precision}, batch {args.batch}, {args.threads} threads, "
            f"{args.rounds} alternated rounds (per round {' '.join(f'{r:.3f}' for r in pairs)}) "
            f"| {args.batch / declared:.1f} img/s | built-in: {args.batch / built:.1f} img/s | **{ratio:.3f}x** "
            f"| {where} | `python3 bench/declared_bench.py --batch {args.batch} --threads {args.threads} "
            f"--rounds {args.rounds} --steps {args.steps}{extra} --record` |",
        )


if __name__ == "__main__":
    main()
