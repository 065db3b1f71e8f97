"""What the training-step benchmarks share: PyTorch's side (time a model's steps on a fixed random batch) and
ours (one `train` run of the quick start on a model of `train_step_bench.MODELS`, its summary.json)."""

import json
import os
import statistics
import subprocess
import tempfile
import time

from train_step_bench import MODELS


def median_step_time(model, opt, batch, steps, set_to_none=True):
    """Median time of `steps` SGD steps (forward, backward, update) after one warm-up, on CIFAR-sized
    random images."""
    import torch
    import torch.nn as nn

    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(batch, 3, 32, 32)
    y = torch.randint(0, 10, (batch,))
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=set_to_none)
        loss_fn(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def ours_summary(train, model_name, batch, steps, extra):
    """summary.json of `steps` + 1 training steps of `train` (tch, SGD at a constant rate, no validation,
    no callbacks, one thread per process) with the `extra` overrides."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            train, "experiment=quickstart", *MODELS[model_name][0], f"data.batch_size={batch}",
            "backend=tch", "optimizer=sgd", "optimizer.lr=0.01", "scheduler=constant", "trainer.max_epochs=1",
            f"trainer.limit_train_batches={steps + 1}", "trainer.limit_val_batches=0", "callbacks=none",
            "data.num_workers=0", f"hydra.run.dir={out}", *extra,
        ]
        env = dict(os.environ, OMP_NUM_THREADS="1", RAYON_NUM_THREADS="1")
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return json.load(open(os.path.join(out, "summary.json")))
