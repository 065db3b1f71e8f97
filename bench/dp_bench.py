"""DataParallel on one machine: trainyard (`backend=tch`, `trainer=dp`: N replicas in threads of one process,
the batch scattered, gradient buckets summed tensor to tensor) vs `torch.nn.DataParallel`, what a PyTorch user
would run, on the same global batch, alternating runs.

On a machine without CUDA, `nn.DataParallel` replicates nothing: it calls the module on the whole batch, so
PyTorch's side is one model with N intra-op threads. Ours is N replicas with one intra-op thread each (the
parallelism comes from the replicas). A step is forward, backward, gradient reduction and SGD update (no data
loading: ours is summary.json's `median_step_time_s`).

    .venv-torch/bin/python bench/dp_bench.py --train target-torch/release/train --rounds 3 --record

Needs torch 2.11 + torchvision in the interpreter and a `--features torch` build of train.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import record, machine  # noqa: E402
from steps import median_step_time, ours_summary  # noqa: E402
from train_step_bench import MODELS  # noqa: E402


def torch_worker(model_name, batch, steps, threads):
    import torch
    import torch.nn as nn

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = nn.DataParallel(MODELS[model_name][1]())
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    print(json.dumps({"median_step_time_s": median_step_time(model, opt, batch, steps)}))


def torch_step(model_name, batch, steps, replicas):
    cmd = [sys.executable, __file__, "--worker", "--models", model_name, "--batch", str(batch),
           "--steps", str(steps), "--replicas", str(replicas)]
    env = dict(os.environ, OMP_NUM_THREADS=str(replicas))
    out = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["median_step_time_s"]


def ours_step(train, model_name, batch, steps, replicas):
    dp = ["trainer=dp", "trainer.accelerator=cpu", f"trainer.devices={replicas}"]
    return ours_summary(train, model_name, batch, steps, dp)["median_step_time_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default="target-torch/release/train")
    ap.add_argument("--models", default="resnet18-cifar")
    ap.add_argument("--batch", type=int, default=64, help="the global batch")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        torch_worker(a.models, a.batch, a.steps, a.replicas)
        return
    for name in a.models.split(","):
        ours, theirs = [], []
        for _ in range(a.rounds):
            ours.append(ours_step(a.train, name, a.batch, a.steps, a.replicas))
            theirs.append(torch_step(name, a.batch, a.steps, a.replicas))
        o, t = statistics.median(ours), statistics.median(theirs)
        ratio = t / o
        print(f"{name}: step trainyard dp {o:.3f}s ({a.batch / o:.1f} img/s), "
              f"nn.DataParallel {t:.3f}s ({a.batch / t:.1f} img/s), ratio {ratio:.2f}x")
        if a.record:
            record(
                "DataParallel on the CPU (issue: distributed)",
                f"| {datetime.date.today()} | {name}, global batch {a.batch}, {a.replicas} replicas (1 thread "
                f"each) vs nn.DataParallel ({a.replicas} threads; on a CPU it runs the module whole): step time "
                f"| {o:.3f} s ({a.batch / o:.1f} img/s) | {t:.3f} s ({a.batch / t:.1f} img/s) | **{ratio:.2f}x** "
                f"| {machine()}, `cargo build --release --features s3,torch` "
                f"| `.venv-torch/bin/python bench/dp_bench.py --train {a.train} --models {name} --batch {a.batch} "
                f"--replicas {a.replicas} --rounds {a.rounds} --record` |",
            )


if __name__ == "__main__":
    main()
