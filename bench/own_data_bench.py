"""A project's own data, model and loss, end to end: `examples/own-model`'s `experiment=houses` (a CSV table
through its registered dataset, a Linear-SiLU regressor, the log-cosh loss with `mae`/`mape`, validation
every epoch) against the same training written as a PyTorch user writes it (a `Dataset` over the parsed
rows, `DataLoader(batch_size=64, shuffle=True)`, the same network, Adam, loss and metrics), eager and
`torch.compile`d, on the same machine, in the same run, with the same thread count. Figures: training
samples per second over the whole fit (train and validation passes), and the final val/mae of each side
(same data split, same epochs: they must learn alike).

    python3 bench/own_data_bench.py --epochs 20 --rounds 3 --threads 2 --record
    python3 bench/own_data_bench.py --shards --epochs 20 --rounds 3 --threads 2 --record

`--optimizer lion`: the example's own optimizer (src/lion.rs, `optimizer=lion`, lr 3e-4, betas (0.9, 0.99),
weight decay 0.1) against the same update written for PyTorch as lion-pytorch writes it (a
`torch.optim.Optimizer` looping over the parameters, eager).

`--shards`: the same table as six CSV part files read as a stream of shards (`experiment=houses_shards`,
src/houses/shards.rs), against PyTorch's `IterableDataset` over the same files as a user writes it (shards
shuffled per epoch, rows read with `csv`, a 256-row shuffle buffer as WebDataset's, `DataLoader(batch_size=64)`).

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
SHARDS = os.path.join(EXAMPLE, "data", "houses-shards")


def trainyard(args) -> tuple:
    with tempfile.TemporaryDirectory() as out:
        cmd = [TRAIN, "experiment=houses_shards" if args.shards else "experiment=houses",
               f"trainer.max_epochs={args.epochs}",
               *(["optimizer=lion", "optimizer.lr=0.0003"] if args.optimizer == "lion" else []), "~callbacks.model_checkpoint",
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


def streamed():
    """The part files as a PyTorch user streams them: an IterableDataset over the shards (order shuffled per
    epoch), rows parsed with `csv`, standardised with the training files' statistics, mixed in a buffer."""
    import csv
    import glob
    import random
    import torch
    from torch.utils.data import IterableDataset

    def rows(path):
        with open(path) as f:
            reader = csv.reader(f)
            header = next(reader)
            t = header.index("price")
            for r in reader:
                v = [float(c) for c in r]
                yield [x for j, x in enumerate(v) if j != t], v[t]

    train_files = sorted(glob.glob(os.path.join(SHARDS, "train-*.csv")))
    val_files = sorted(glob.glob(os.path.join(SHARDS, "val-*.csv")))
    x = torch.tensor([r for f in train_files for r, _ in rows(f)])
    mean, std = x.mean(0), x.std(0, unbiased=False)

    class Shards(IterableDataset):
        def __init__(self, files, buffer):
            self.files, self.buffer, self.epoch = files, buffer, 0

        def __iter__(self):
            rng = random.Random(self.epoch)
            self.epoch += 1
            files = list(self.files)
            if self.buffer:
                rng.shuffle(files)
            buf = []
            for f in files:
                for features, y in rows(f):
                    item = ((torch.tensor(features) - mean) / std, torch.tensor([y]))
                    if not self.buffer:
                        yield item
                        continue
                    if len(buf) < self.buffer:
                        buf.append(item)
                        continue
                    j = rng.randrange(len(buf))
                    buf[j], item = item, buf[j]
                    yield item
            rng.shuffle(buf)
            yield from buf

    return Shards(train_files, 256), Shards(val_files, 0)


def lion_class():
    """Lion for PyTorch, as lion-pytorch's `Lion` steps it."""
    import torch

    class Lion(torch.optim.Optimizer):
        def __init__(self, params, lr, betas, weight_decay):
            super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

        @torch.no_grad()
        def step(self):
            for group in self.param_groups:
                lr, (b1, b2), wd = group["lr"], group["betas"], group["weight_decay"]
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self.state[p]
                    if not state:
                        state["exp_avg"] = torch.zeros_like(p)
                    exp_avg = state["exp_avg"]
                    p.mul_(1 - lr * wd)
                    update = exp_avg * b1 + p.grad * (1 - b1)
                    p.add_(update.sign(), alpha=-lr)
                    exp_avg.mul_(b2).add_(p.grad, alpha=1 - b2)

    return Lion


def pytorch(args, compiled: bool) -> tuple:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.shards:
        train_set, val_set = streamed()
        train = DataLoader(train_set, batch_size=64)
        val = DataLoader(val_set, batch_size=64)
    else:
        (xt, yt), (xv, yv) = table()
        train = DataLoader(TensorDataset(xt, yt), batch_size=64, shuffle=True)
        val = DataLoader(TensorDataset(xv, yv), batch_size=64)
    model = nn.Sequential(nn.Linear(5, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, 1))
    if args.optimizer == "lion":
        opt = lion_class()(model.parameters(), lr=3e-4, betas=(0.9, 0.99), weight_decay=0.1)
    else:
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
    ap.add_argument("--shards", action="store_true", help="the table as CSV shards, streamed")
    ap.add_argument("--optimizer", choices=["adam", "lion"], default="adam",
                    help="lion: the example's own optimizer against the same rule in PyTorch")
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
            data = ("`experiment=houses_shards`: six CSV shards streamed, 256-row shuffle buffer; PyTorch: an "
                    "IterableDataset over the same files" if args.shards else "`experiment=houses`: CSV table")
            opt = (", own optimizer Lion (src/lion.rs) vs the same rule as a PyTorch Optimizer (lion-pytorch's)"
                   if args.optimizer == "lion" else "")
            what = (f"own data + model + loss (examples/own-model {data}, Linear-SiLU "
                    f"regressor, log-cosh with mae/mape{opt}), {args.epochs} epochs fit incl. validation, batch 64, "
                    f"{args.threads} threads, median of {args.rounds} rounds; val/mae trainyard "
                    f"{mae['trainyard']:.3f}, PyTorch {mae[ref]:.3f}")
            record("Own data and loss (issue 37)",
                   f"| {datetime.date.today()} | {what} | {med['trainyard']:.0f} samples/s | PyTorch {ref} "
                   f"({'torch.compile' if ref == 'compile' else 'eager'}): {med[ref]:.0f} samples/s | "
                   f"**{ratio:.2f}x** | {machine()} | `python3 bench/own_data_bench.py "
                   f"{'--shards ' if args.shards else ''}"
                   f"{'--optimizer lion ' if args.optimizer == 'lion' else ''}--epochs {args.epochs} "
                   f"--rounds {args.rounds} --threads {args.threads} --record` |")


if __name__ == "__main__":
    main()
