"""A project's own data, model and loss, end to end: `examples/own-model`'s `experiment=houses` (a CSV table
through its registered dataset, a Linear-SiLU regressor, the log-cosh loss with `mae`/`mape`, validation
every epoch) against the same training written as a PyTorch user writes it (a `Dataset` over the parsed
rows, `DataLoader(batch_size=64, shuffle=True)`, the same network, Adam, loss and metrics), eager and
`torch.compile`d, on the same machine, in the same run, with the same thread count. Figures: training
samples per second over the whole fit (train and validation passes), and the final val/mae of each side
(same data split, same epochs: they must learn alike).

    python3 bench/own_data_bench.py --epochs 20 --rounds 3 --threads 2 --record

Needs `cargo build --release` in examples/own-model (TRAIN=<path> names another build) and PyTorch.
"""

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import ROOT, machine, record  # noqa: E402

EXAMPLE = os.path.join(ROOT, "examples", "own-model")
TRAIN = os.environ.get("TRAIN", os.path.join(EXAMPLE, "target", "release", "train"))
CSV = os.path.join(EXAMPLE, "data", "houses.csv")


def trainyard(args) -> tuple:
    with tempfile.TemporaryDirectory() as out:
        cmd = [TRAIN, "experiment=houses", f"trainer.max_epochs={args.epochs}", "~callbacks.model_checkpoint",
               "~callbacks.early_stopping", "~callbacks.device_stats", f"hydra.run.dir={out}"]
        env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads))
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       cwd=EXAMPLE)
        s = json.load(open(os.path.join(out, "summary.json")))
        return s["train_samples_per_s"], s["final_metrics"]["val/mae"]


def table():
    """The rows as the example's dataset reads them: the last fifth for validation, features standardised
    with the training rows' statistics."""
    import csv
    import torch
    rows = list(csv.reader(open(CSV)))
    header, rows = rows[0], [[float(c) for c in r] for r in rows[1:]]
    t = header.index("price")
    x = torch.tensor([[v for j, v in enumerate(r) if j != t] for r in rows])
    y = torch.tensor([[r[t]] for r in rows])
    n_train = len(rows) - round(len(rows) * 0.2)
    mean, std = x[:n_train].mean(0), x[:n_train].std(0, unbiased=False)
    x = (x - mean) / std
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


def pytorch(args, compiled: bool) -> tuple:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    (xt, yt), (xv, yv) = table()
    train = DataLoader(TensorDataset(xt, yt), batch_size=64, shuffle=True)
    val = DataLoader(TensorDataset(xv, yv), batch_size=64)
    model = nn.Sequential(nn.Linear(5, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.003)

    def step(x, y):
        out = model(x)
        d = (out - y).abs()
        loss = (d + torch.log1p(torch.exp(-2 * d)) - math.log(2)).mean()
        return loss, d.detach().mean(), (d.detach() / y.abs() * 100).mean()

    fwd = torch.compile(step) if compiled else step
    samples, started = 0, time.perf_counter()
    for _ in range(args.epochs):
        model.train()
        for x, y in train:
            loss, mae, mape = fwd(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            samples += len(x)
            _ = (loss.item(), mae.item(), mape.item())  # logged each step, as self.log does
        model.eval()
        total, n = 0.0, 0
        with torch.no_grad():
            for x, y in val:
                _, mae, _ = fwd(x, y)
                total += mae.item() * len(x)
                n += len(x)
    return samples / (time.perf_counter() - started), total / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    sides = {"trainyard": [], "eager": [], "compile": []}
    for _ in range(args.rounds):
        sides["trainyard"].append(trainyard(args))
        sides["eager"].append(pytorch(args, False))
        sides["compile"].append(pytorch(args, True))
    med = {k: statistics.median(v[0] for v in runs) for k, runs in sides.items()}
    mae = {k: statistics.median(v[1] for v in runs) for k, runs in sides.items()}
    for k in sides:
        print(f"{k:10s} {med[k]:10.0f} samples/s  val/mae {mae[k]:.4f}")
    for ref in ("eager", "compile"):
        ratio = med["trainyard"] / med[ref]
        print(f"trainyard / PyTorch {ref}: {ratio:.2f}x")
        if args.record:
            what = (f"own data + model + loss (examples/own-model `experiment=houses`: CSV table, Linear-SiLU "
                    f"regressor, log-cosh with mae/mape), {args.epochs} epochs fit incl. validation, batch 64, "
                    f"{args.threads} threads, median of {args.rounds} rounds; val/mae trainyard "
                    f"{mae['trainyard']:.3f}, PyTorch {mae[ref]:.3f}")
            record("Own data and loss (issue 37)",
                   f"| {datetime.date.today()} | {what} | {med['trainyard']:.0f} samples/s | PyTorch {ref} "
                   f"({'torch.compile' if ref == 'compile' else 'eager'}): {med[ref]:.0f} samples/s | "
                   f"**{ratio:.2f}x** | {machine()} | `python3 bench/own_data_bench.py --epochs {args.epochs} "
                   f"--rounds {args.rounds} --threads {args.threads} --record` |")


if __name__ == "__main__":
    main()
