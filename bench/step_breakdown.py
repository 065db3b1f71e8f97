"""Where a small model's train step spends its time on a GPU. A diagnostic for the per-step overhead that
`train_step_bench.py` shows on small models (the cnn at 0.7-0.8x eager on an H200 while ResNet-18 is
level): PyTorch eager's step split into the host's time to queue the forward and backward passes, to queue
the optimizer step, and the wait for the statistics (the GPU finishing), plain (the loss read back, as
`train_step_bench.py` does) and with what our step also computes (top-1 and top-5 counts, read back with
the loss in one copy); against our median step (summary.json's, as `train_step_bench.py` reads it).

Ours is not split: `trainer.profiler=simple` reports means and totals, and a process's first steps
(CUDA's lazy module loading, cuDNN's set-up) vary by up to a second from run to run, more than 200 steps of
the cnn take, so neither the means nor the difference of two runs' totals is a step's cost.

    TRAIN=/path/to/train python3 bench/step_breakdown.py --model cnn --batch 64,1024
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step_bench import IMAGE_SIZE, MODELS, ours_steps  # noqa: E402

PHASES = ["forward_backward", "optimizer_step", "read_batch_stats"]


def theirs(model: str, batch: int, steps: int, precision: str, with_accuracy: bool) -> dict:
    """Median milliseconds of each phase of PyTorch eager's loop (batch copied from pinned host memory)."""
    torch.manual_seed(0)
    net = MODELS[model][1]().cuda().train()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    size = IMAGE_SIZE.get(model, 32)
    x_host = torch.randn(batch, 3, size, size).pin_memory()
    y_host = torch.randint(0, 10, (batch,)).pin_memory()
    dtype = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler("cuda") if precision == "16-mixed" else None
    phases = {p: [] for p in PHASES}
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        x, y = x_host.to("cuda", non_blocking=True), y_host.to("cuda", non_blocking=True)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            logits = net(x)
            loss = nn.functional.cross_entropy(logits, y)
        if with_accuracy:
            top5 = logits.detach().topk(5, dim=1).indices
            hits = top5.eq(y[:, None])
            stats = torch.stack([loss.detach().float(), hits[:, 0].sum().float(), hits.any(1).sum().float()])
        else:
            stats = loss.detach()
        (scaler.scale(loss) if scaler else loss).backward()
        t1 = time.perf_counter()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        t2 = time.perf_counter()
        stats.tolist()
        t3 = time.perf_counter()
        for phase, dt in zip(PHASES, [t1 - t0, t2 - t1, t3 - t2]):
            phases[phase].append(dt * 1e3)
    return {p: statistics.median(v) for p, v in phases.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="cnn", choices=sorted(MODELS))
    ap.add_argument("--batch", default="64,1024")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--precision", default="32-true", choices=["32-true", "16-mixed", "bf16-mixed"])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("step_breakdown.py times a CUDA step: this machine's torch sees no GPU")
    print(f"{args.model}, {args.precision}, {torch.cuda.get_device_name()}; ms per step (medians)")
    print(f"{'batch':>6} {'who':<28} " + " ".join(f"{p:>17}" for p in PHASES) + f" {'step':>7}")
    for batch in map(int, args.batch.split(",")):
        step = ours_steps(args.model, batch, args.steps, 4, "tch", "cuda", args.precision) * 1e3
        print(f"{batch:>6} {'trainyard':<28} " + " ".join(f"{'-':>17}" for _ in PHASES) + f" {step:>7.3f}")
        for who, accuracy in [("PyTorch eager", False), ("PyTorch eager + top-1/top-5", True)]:
            t = theirs(args.model, batch, args.steps, args.precision, accuracy)
            print(f"{batch:>6} {who:<28} " + " ".join(f"{t[p]:>17.3f}" for p in PHASES) + f" {sum(t.values()):>7.3f}")


if __name__ == "__main__":
    main()
