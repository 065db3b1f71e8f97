#!/usr/bin/env python3
"""Logger overhead: training throughput of the quickstart with `logger=csv` (metrics.csv alone) against
`logger=wandb` (metrics.csv plus the W&B offline run), in the same scratch project, alternating the two
(csv, wandb, csv, ...) for --rounds rounds. Every optimizer step is logged (`trainer.log_every_n_steps=1`),
the worst case for a logger. Throughput is each run's own `train_samples_per_s` from summary.json; medians
and their ratio are printed and, with --record, appended to bench/RESULTS.md.

Usage (from the repo root):
    cargo build --release
    python3 bench/logger_bench.py --rounds 5 --record
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import tempfile

from results import machine, record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
RUN = ["experiment=quickstart", "trainer.max_epochs=2", "trainer.log_every_n_steps=1", "callbacks.model_summary=null"]
LOGGERS = {"csv": ["logger=csv"], "wandb": ["logger=wandb"]}


def throughput(train: str, project: str, logger: str, n: int) -> float:
    out = os.path.join(project, "logs", f"{logger}-{n}")
    args = RUN + LOGGERS[logger] + [f"hydra.run.dir={out}"]
    subprocess.run([train, *args], cwd=project, check=True, capture_output=True)
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)["train_samples_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--record", action="store_true")
    a = ap.parse_args()
    train = os.path.join(TARGET, "release", "train")
    with tempfile.TemporaryDirectory() as project:
        for sub in ("conf", "experiments"):
            shutil.copytree(os.path.join(ROOT, sub), os.path.join(project, sub))
        throughput(train, project, "csv", -1)  # warm the page cache and the data
        got = {name: [] for name in LOGGERS}
        for n in range(a.rounds):
            for name in LOGGERS:
                got[name].append(throughput(train, project, name, n))
    med = {k: statistics.median(v) for k, v in got.items()}
    ratio = med["wandb"] / med["csv"]
    print(f"machine: {machine()}")
    for k, v in got.items():
        print(f"{k:6s} img/s: " + ", ".join(f"{x:.0f}" for x in v) + f"  (median {med[k]:.0f})")
    print(f"wandb / csv throughput: {ratio:.3f}")
    if a.record:
        record("Logger overhead (issue 22)",
               f"| {datetime.date.today()} | quickstart, 2 epochs, every step logged: logger=wandb vs csv alone, "
               f"median of {a.rounds} alternating runs | {med['wandb']:.0f} img/s | csv: {med['csv']:.0f} img/s | "
               f"{ratio:.3f}x | {machine()} | `python3 bench/logger_bench.py --rounds {a.rounds}` |")


if __name__ == "__main__":
    main()
