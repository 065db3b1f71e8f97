#!/usr/bin/env python3
"""Stateful metrics' overhead per training step: trainyard's (examples/metrics_bench.rs) against torchmetrics
on the same inputs (10 classes, batch 256, the same generator on both sides): Accuracy, F1Score (macro) and
ConfusionMatrix updated and computed every step (Lightning's `on_step=True`), AUROC updated every step and
computed once at the end of the 200 steps (its states are every score of the epoch). torchmetrics runs on CPU
tensors, one thread per core as torch sets it. Each side's time is the fastest of five passes; the values of
the last compute must agree (checked, 1e-6), so both measured the same thing.

Usage (from the repo root; a venv with torch and torchmetrics):
    .venv-torch-py/bin/python bench/metrics_bench.py --record
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch
import torchmetrics

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import machine, record  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTION = "Stateful metrics' overhead per step (issue 59)"
RUST_CMD = ["cargo", "run", "--release", "--quiet", "--example", "metrics_bench", "--"]


def inputs(steps, batch, classes):
    """The Rust side's generator: 64-bit LCG (MMIX), top 24 bits."""
    x = 2024
    mask = (1 << 64) - 1
    out = []
    for _ in range(steps):
        logits = np.empty(batch * classes, dtype=np.float32)
        for i in range(batch * classes):
            x = (x * 6364136223846793005 + 1442695040888963407) & mask
            logits[i] = np.float32((x >> 40) / float(1 << 24) * 4.0 - 2.0)
        targets = np.empty(batch, dtype=np.int64)
        for i in range(batch):
            x = (x * 6364136223846793005 + 1442695040888963407) & mask
            targets[i] = (x >> 40) % classes
        out.append((torch.from_numpy(logits.reshape(batch, classes)), torch.from_numpy(targets)))
    return out


def torchmetrics_times(data, classes):
    cases = {
        "accuracy": (lambda: torchmetrics.Accuracy(task="multiclass", num_classes=classes), True),
        "f1_macro": (lambda: torchmetrics.F1Score(task="multiclass", num_classes=classes, average="macro"), True),
        "confusion_matrix": (lambda: torchmetrics.ConfusionMatrix(task="multiclass", num_classes=classes), True),
        "auroc": (lambda: torchmetrics.AUROC(task="multiclass", num_classes=classes), False),
    }
    results = {}
    for name, (make, per_step) in cases.items():
        best, value = float("inf"), None
        for _ in range(5):
            metric = make()
            started = time.perf_counter()
            last = None
            for preds, target in data:
                metric.update(preds, target)
                if per_step:
                    last = metric.compute()
                    metric.reset()
            if not per_step:
                last = metric.compute()
            best = min(best, time.perf_counter() - started)
            value = last.double().flatten().tolist()
        results[name] = (best / len(data) * 1e6, value)
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    batch, classes = 256, 10
    cmd = RUST_CMD + ["--steps", str(args.steps), "--batch", str(batch), "--classes", str(classes)]
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    ours = {}
    for line in out.splitlines():
        row = json.loads(line)
        v = row["value"]
        ours[row["metric"]] = (row["us_per_step"], v if isinstance(v, list) else [v])
    theirs = torchmetrics_times(inputs(args.steps, batch, classes), classes)
    rows = []
    for name, (their_us, their_value) in theirs.items():
        our_us, our_value = ours[name]
        worst = max(abs(a - b) for a, b in zip(our_value, their_value))
        assert len(our_value) == len(their_value) and worst < 1e-6, (name, our_value, their_value)
        ratio = their_us / our_us
        what = "update+compute per step" if name != "auroc" else "update per step, compute once per 200 steps"
        print(f"{name:18} trainyard {our_us:8.1f} us/step  torchmetrics {their_us:8.1f} us/step  {ratio:5.2f}x  ({what})")
        rows.append((name, what, our_us, their_us, ratio))
    if args.record:
        cpu = machine()
        for name, what, our_us, their_us, ratio in rows:
            verdict = f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
            record(SECTION,
                   f"| {datetime.date.today()} | {name}: {what}, 10 classes, batch 256, fastest of 5 passes | "
                   f"{our_us:.1f} us/step | torchmetrics {torchmetrics.__version__} (torch {torch.__version__}, "
                   f"{torch.get_num_threads()} threads): {their_us:.1f} us/step | {verdict} | {cpu} | "
                   f"`.venv-torch-py/bin/python bench/metrics_bench.py --record` |")

if __name__ == "__main__":
    main()
