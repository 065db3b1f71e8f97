"""DDP scaling efficiency on the CPU: trainyard (`backend=tch`, `trainer=ddp_sim`: 2 worker processes over
our c10d/Gloo shim) vs PyTorch DDP (torch.distributed, Gloo), the same model, per-process batch and thread
count, alternating runs.

Efficiency = median step time of one process (1 thread, batch B) / median step time of each of 2 DDP processes
(1 thread each, batch B each): 1.0 means the second process doubles throughput. A step is forward, backward,
gradient all-reduce and SGD update (no data loading: ours is summary.json's `median_step_time_s`).

    .venv-torch/bin/python bench/ddp_bench.py --train target-torch/release/train --rounds 3 --record

Needs torch 2.11 + torchvision in the interpreter and a `--features torch` build of train.
"""

import argparse
import datetime
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import record, machine  # noqa: E402
from steps import median_step_time, ours_summary  # noqa: E402
from train_step_bench import MODELS  # noqa: E402
from allreduce_bench import launch  # noqa: E402


def torch_worker(model_name, batch, steps):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = MODELS[model_name][1]()
    model.train()
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    median = median_step_time(model, opt, batch, steps)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({"median_step_time_s": median}))
    if world > 1:
        dist.destroy_process_group()


def torch_step(model_name, batch, steps, world):
    cmd = [sys.executable, __file__, "--worker", "--models", model_name, "--batch", str(batch),
           "--steps", str(steps)]
    return launch(cmd, world, OMP_NUM_THREADS="1")["median_step_time_s"]


def ours_step(train, model_name, batch, steps, world):
    ddp = ["trainer=ddp_sim", f"trainer.devices={world}"] if world > 1 else []
    return ours_summary(train, model_name, batch, steps, ddp)["median_step_time_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default="target-torch/release/train")
    ap.add_argument("--models", default="resnet18-cifar")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        torch_worker(a.models, a.batch, a.steps)
        return
    for name in a.models.split(","):
        runs = {k: [] for k in ("ours1", "oursN", "torch1", "torchN")}
        for _ in range(a.rounds):
            runs["ours1"].append(ours_step(a.train, name, a.batch, a.steps, 1))
            runs["torch1"].append(torch_step(name, a.batch, a.steps, 1))
            runs["oursN"].append(ours_step(a.train, name, a.batch, a.steps, a.world))
            runs["torchN"].append(torch_step(name, a.batch, a.steps, a.world))
        m = {k: statistics.median(v) for k, v in runs.items()}
        ours_eff, torch_eff = m["ours1"] / m["oursN"], m["torch1"] / m["torchN"]
        ratio = ours_eff / torch_eff
        print(f"{name}: step times {json.dumps({k: round(v, 4) for k, v in m.items()})}")
        print(f"{name}: scaling efficiency trainyard {ours_eff:.2f}, PyTorch DDP {torch_eff:.2f}, ratio {ratio:.2f}x")
        if a.record:
            record(
                "DDP scaling on the CPU (issue: distributed)",
                f"| {datetime.date.today()} | {name}, {a.world} DDP processes vs 1, batch {a.batch} per process, "
                f"1 thread each, Gloo | efficiency {ours_eff:.2f} ({a.world * a.batch / m['oursN']:.1f} img/s "
                f"vs {a.batch / m['ours1']:.1f}) | PyTorch DDP: {torch_eff:.2f} ({a.world * a.batch / m['torchN']:.1f} "
                f"vs {a.batch / m['torch1']:.1f} img/s) | **{ratio:.2f}x** | {machine()} "
                f"| `.venv-torch/bin/python bench/ddp_bench.py --train {a.train} --models {name} --batch {a.batch} "
                f"--world {a.world} --rounds {a.rounds} --record` |",
            )


if __name__ == "__main__":
    main()
