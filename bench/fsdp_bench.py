"""FSDP on the CPU: trainyard (`backend=tch`, `trainer=fsdp_sim`: 2 worker processes over our c10d/Gloo shim)
vs PyTorch FSDP2 (`fully_shard` on every residual block and the root, torch.distributed Gloo), the same model,
per-process batch and thread count, alternating runs. Each of our sharding strategies is set against the PyTorch
configuration with the same schedule:
- FULL_SHARD: ours gathers one unit (stem, residual block, head) at a time and recomputes each unit in the
  backward pass (activation checkpointing at unit boundaries); PyTorch: `fully_shard` per block with
  `torch.utils.checkpoint` on each block. PyTorch without checkpointing (which keeps every activation) is
  printed too.
- SHARD_GRAD_OP: parameters gathered for the whole forward and backward; PyTorch: `reshard_after_forward=False`.

Figures per run: the median step time (forward, backward, gradient reduce-scatter and SGD update of the local
shard; no data loading: ours is summary.json's `median_step_time_s`), the bytes of parameters + gradients +
optimizer state each rank keeps (ours: summary.json's `state_bytes_per_rank`; PyTorch: its local shards of the
parameters, their gradients and the optimizer's momentum buffers) and, for ours, the most parameter bytes held
whole at once (`unsharded_peak`).

    .venv-torch/bin/python bench/fsdp_bench.py --train target-torch/release/train --rounds 3 --record

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


def torch_worker(model_name, batch, steps, mode):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.utils.checkpoint as checkpoint
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    class Checkpointed(nn.Module):
        """A block whose activations are recomputed in the backward pass."""

        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, x):
            return checkpoint.checkpoint(self.block, x, use_reentrant=False)

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = MODELS[model_name][1]()
    model.train()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    reshard = mode != "grad-op"
    for layer in [getattr(model, f"layer{i}", None) for i in range(1, 5)]:
        for i, block in enumerate(layer or []):
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
            if mode == "full-ckpt":
                layer[i] = Checkpointed(block)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    median = median_step_time(model, opt, batch, steps, set_to_none=False)
    local = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    optim = sum(
        s.to_local().numel() * s.element_size() if hasattr(s, "to_local") else s.numel() * s.element_size()
        for state in opt.state.values()
        for s in state.values()
        if isinstance(s, torch.Tensor)
    )
    if dist.get_rank() == 0:
        print(json.dumps({"median_step_time_s": median, "bytes": 2 * local + optim}))
    dist.destroy_process_group()


def torch_run(model_name, batch, steps, world, mode):
    cmd = [sys.executable, __file__, "--worker", "--models", model_name, "--batch", str(batch),
           "--steps", str(steps), "--mode", mode]
    return launch(cmd, world, OMP_NUM_THREADS="1")


def ours_run(train, model_name, batch, steps, world, sharding):
    fsdp = ["optimizer.nesterov=false", "optimizer.weight_decay=0", "trainer=fsdp_sim",
            f"trainer.devices={world}", f"trainer.fsdp.sharding_strategy={sharding}"]
    s = ours_summary(train, model_name, batch, steps, fsdp)
    row = s["state_bytes_per_rank"][0]
    return {
        "median_step_time_s": s["median_step_time_s"],
        "bytes": row["parameters"] + row["gradients"] + row["optimizer_state"],
        "whole": row.get("unsharded_peak", 0),
    }


# Our sharding strategy -> the PyTorch FSDP2 configuration with the same schedule.
PAIRS = {"FULL_SHARD": "full-ckpt", "SHARD_GRAD_OP": "grad-op"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default="target-torch/release/train")
    ap.add_argument("--models", default="resnet18-cifar")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--strategies", default="FULL_SHARD,SHARD_GRAD_OP")
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="full", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        torch_worker(a.models, a.batch, a.steps, a.mode)
        return
    for name in a.models.split(","):
        whole = ours_run(a.train, name, a.batch, a.steps, a.world, "NO_SHARD")["bytes"]
        for strategy in a.strategies.split(","):
            mode = PAIRS[strategy]
            ours, theirs, plain = [], [], []
            for _ in range(a.rounds):
                ours.append(ours_run(a.train, name, a.batch, a.steps, a.world, strategy))
                theirs.append(torch_run(name, a.batch, a.steps, a.world, mode))
                if strategy == "FULL_SHARD":
                    plain.append(torch_run(name, a.batch, a.steps, a.world, "full"))
            t_ours = statistics.median(r["median_step_time_s"] for r in ours)
            t_torch = statistics.median(r["median_step_time_s"] for r in theirs)
            b_ours, b_torch, w_ours = ours[0]["bytes"], theirs[0]["bytes"], ours[0]["whole"]
            ratio = t_torch / t_ours
            extra = ""
            if plain:
                t_plain = statistics.median(r["median_step_time_s"] for r in plain)
                extra = f"; without checkpointing {a.world * a.batch / t_plain:.1f} img/s"
            described = {"full-ckpt": "fully_shard per block + checkpoint per block",
                         "grad-op": "fully_shard per block, reshard_after_forward=False"}[mode]
            print(f"{name} {strategy}: step {t_ours:.3f}s vs PyTorch FSDP2 ({described}) {t_torch:.3f}s "
                  f"({ratio:.2f}x){extra}; per-rank state {b_ours / 2**20:.1f} MiB vs {b_torch / 2**20:.1f} MiB "
                  f"(unsharded {whole / 2**20:.1f}); parameters whole at once {w_ours / 2**20:.1f} MiB")
            if a.record:
                record(
                    "FSDP on the CPU (issue: distributed)",
                    f"| {datetime.date.today()} | {name}, {strategy}, {a.world} processes, batch {a.batch} per "
                    f"process, 1 thread each, Gloo: step time; per-rank parameter+gradient+optimizer bytes; "
                    f"most parameter bytes whole at once | {a.world * a.batch / t_ours:.1f} img/s; "
                    f"{b_ours / 2**20:.1f} MiB/rank (NO_SHARD {whole / 2**20:.1f}); {w_ours / 2**20:.1f} MiB whole "
                    f"| PyTorch FSDP2 ({described}): {a.world * a.batch / t_torch:.1f} img/s{extra}; "
                    f"{b_torch / 2**20:.1f} MiB/rank | **{ratio:.2f}x** "
                    f"| {machine()}, `cargo build --release --features s3,torch` "
                    f"| `.venv-torch/bin/python bench/fsdp_bench.py --train {a.train} --models {name} "
                    f"--batch {a.batch} --world {a.world} --rounds {a.rounds} --strategies {strategy} --record` |",
                )


if __name__ == "__main__":
    main()
