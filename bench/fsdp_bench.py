"""FSDP on the CPU: trainyard (`backend=tch`, `trainer=fsdp_sim`: 2 worker processes over our c10d/Gloo shim)
vs PyTorch FSDP2 (`fully_shard` on every residual block and the root, torch.distributed Gloo), the same model,
per-process batch and thread count, alternating runs.

Two figures per sharding run: the median step time (forward, backward, gradient reduce-scatter and SGD update
of the local shard; no data loading: ours is summary.json's `median_step_time_s`), and the bytes of
parameters + gradients + optimizer state each rank keeps (ours: summary.json's `state_bytes_per_rank`;
PyTorch: its local shards of the parameters, their gradients and the optimizer's momentum buffers).

    .venv-torch/bin/python bench/fsdp_bench.py --train target-torch/release/train --rounds 3 --record

Needs torch 2.11 + torchvision in the interpreter and a `--features torch` build of train.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import record  # noqa: E402
from train_step_bench import MODELS  # noqa: E402
from allreduce_bench import launch  # noqa: E402


def torch_worker(model_name, batch, steps):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = MODELS[model_name][1]()
    model.train()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in [getattr(model, f"layer{i}", None) for i in range(1, 5)]:
        for block in layer or []:
            fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(batch, 3, 32, 32)
    y = torch.randint(0, 10, (batch,))
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss_fn(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    local = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    optim = sum(
        s.to_local().numel() * s.element_size() if hasattr(s, "to_local") else s.numel() * s.element_size()
        for state in opt.state.values()
        for s in state.values()
        if isinstance(s, torch.Tensor)
    )
    if dist.get_rank() == 0:
        print(json.dumps({"median_step_time_s": statistics.median(times[1:]), "bytes": 2 * local + optim}))
    dist.destroy_process_group()


def torch_run(model_name, batch, steps, world):
    cmd = [sys.executable, __file__, "--worker", "--models", model_name, "--batch", str(batch),
           "--steps", str(steps)]
    return launch(cmd, world, OMP_NUM_THREADS="1")


def ours_run(train, model_name, batch, steps, world, sharding):
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            train, "experiment=quickstart", *MODELS[model_name][0], f"data.batch_size={batch}",
            "backend=tch", "optimizer=sgd", "optimizer.lr=0.01", "optimizer.nesterov=false",
            "optimizer.weight_decay=0", "scheduler=constant", "trainer.max_epochs=1",
            f"trainer.limit_train_batches={steps + 1}", "trainer.limit_val_batches=0", "callbacks=none",
            "data.num_workers=0", f"hydra.run.dir={out}", "trainer=fsdp_sim", f"trainer.devices={world}",
            f"trainer.fsdp.sharding_strategy={sharding}",
        ]
        env = dict(os.environ, OMP_NUM_THREADS="1", RAYON_NUM_THREADS="1")
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        s = json.load(open(os.path.join(out, "summary.json")))
        row = s["state_bytes_per_rank"][0]
        return {
            "median_step_time_s": s["median_step_time_s"],
            "bytes": row["parameters"] + row["gradients"] + row["optimizer_state"],
        }


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
        ours, theirs, whole = [], [], []
        for _ in range(a.rounds):
            ours.append(ours_run(a.train, name, a.batch, a.steps, a.world, "FULL_SHARD"))
            theirs.append(torch_run(name, a.batch, a.steps, a.world))
        whole = ours_run(a.train, name, a.batch, a.steps, a.world, "NO_SHARD")["bytes"]
        t_ours = statistics.median(r["median_step_time_s"] for r in ours)
        t_torch = statistics.median(r["median_step_time_s"] for r in theirs)
        b_ours, b_torch = ours[0]["bytes"], theirs[0]["bytes"]
        ratio = t_torch / t_ours
        print(f"{name}: step {t_ours:.3f}s vs PyTorch FSDP2 {t_torch:.3f}s ({ratio:.2f}x); "
              f"per-rank state {b_ours / 2**20:.1f} MiB vs {b_torch / 2**20:.1f} MiB (unsharded {whole / 2**20:.1f})")
        if a.record:
            record(
                "FSDP on the CPU (issue: distributed)",
                f"| {datetime.date.today()} | {name}, FULL_SHARD, {a.world} processes, batch {a.batch} per process, "
                f"1 thread each, Gloo: step time; per-rank parameter+gradient+optimizer bytes "
                f"| {a.world * a.batch / t_ours:.1f} img/s; {b_ours / 2**20:.1f} MiB/rank "
                f"(NO_SHARD {whole / 2**20:.1f}) | PyTorch FSDP2 (fully_shard per block): "
                f"{a.world * a.batch / t_torch:.1f} img/s; {b_torch / 2**20:.1f} MiB/rank | **{ratio:.2f}x** "
                f"| {platform.machine()}, {os.cpu_count()} cores, `cargo build --release --features s3,torch` "
                f"| `.venv-torch/bin/python bench/fsdp_bench.py --train {a.train} --models {name} --batch {a.batch} "
                f"--world {a.world} --rounds {a.rounds} --record` |",
            )


if __name__ == "__main__":
    main()
