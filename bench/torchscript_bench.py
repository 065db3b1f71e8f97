"""A PyTorch user's own network, as it is: a ResNet-18 scripted with `torch.jit.script` and saved, trained
by trainyard (`model=torchscript model.path=resnet18.pt`, backend tch) and by PyTorch eager training the
same loaded module (`torch.jit.load`, SGD with momentum, cross-entropy), on the same machine, in the same
run, with the same thread count. Figure: the median optimizer step (forward, backward, update; data loading
excluded on both sides: trainyard's `median_step_time_s`, PyTorch's timed loop over batches already in
memory). torch.compile does not apply to a ScriptModule, so it has no row here.

    python3 bench/torchscript_bench.py --steps 30 --batch 32 --image 32 --threads 2 --record

Needs a `--features torch` build of train (TRAIN=<path>; default target-torch/release/train) and PyTorch.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import ROOT, machine, record  # noqa: E402

TRAIN = os.environ.get("TRAIN", os.path.join(ROOT, "target-torch", "release", "train"))


def resnet18(classes: int):
    """torchvision's ResNet-18 (BasicBlock, [2, 2, 2, 2]), written out so the bench needs no torchvision."""
    import torch.nn as nn

    class Basic(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                               if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(out)) + self.downsample(x))

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            widths, layers, cin = [64, 128, 256, 512], [], 64
            for i, w in enumerate(widths):
                stride = 1 if i == 0 else 2
                layers.append(nn.Sequential(Basic(cin, w, stride), Basic(w, w, 1)))
                cin = w
            self.layer1, self.layer2, self.layer3, self.layer4 = layers
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512, classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return ResNet18()


def accelerator(args) -> str:
    return "gpu" if args.device == "cuda" else "cpu"


def trainyard(args, net: str) -> float:
    with tempfile.TemporaryDirectory() as out:
        cmd = [TRAIN, "model=torchscript", f"model.path={net}", "data=synthetic", "data.num_classes=10",
               f"data.image_size={args.image}", f"data.batch_size={args.batch}",
               f"data.train_size={args.batch * args.steps}", f"data.val_size={args.batch}",
               "optimizer=sgd", "optimizer.lr=0.01", "optimizer.momentum=0.9", "optimizer.weight_decay=0",
               "scheduler=constant",
               "data.num_workers=0", "trainer.max_epochs=1", f"trainer.accelerator={accelerator(args)}",
               "backend=tch", "~callbacks.model_checkpoint",
               "~callbacks.early_stopping", "~callbacks.device_stats", "callbacks.model_summary=null",
               f"hydra.run.dir={out}"]
        env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads))
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, cwd=ROOT)
        return json.load(open(os.path.join(out, "summary.json")))["median_step_time_s"]


def pytorch(args, net: str) -> float:
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model = torch.jit.load(net, map_location=device)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    # On CUDA the batches start in pinned host memory and are copied in each step, as a loader's are.
    batches = [(torch.randn(args.batch, 3, args.image, args.image, generator=g),
                torch.randint(0, 10, (args.batch,), generator=g)) for _ in range(args.steps)]
    if device.type == "cuda":
        batches = [(x.pin_memory(), y.pin_memory()) for x, y in batches]
    times = []
    for x, y in batches:
        started = time.perf_counter()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        _ = loss.item()  # logged each step, as self.log does
        times.append(time.perf_counter() - started)
    return statistics.median(times[2:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--image", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    import torch
    with tempfile.TemporaryDirectory() as tmp:
        net = os.path.join(tmp, "resnet18.pt")
        torch.manual_seed(0)
        torch.jit.script(resnet18(10)).save(net)
        ours, theirs = [], []
        for _ in range(args.rounds):
            ours.append(trainyard(args, net))
            theirs.append(pytorch(args, net))
    t, p = statistics.median(ours), statistics.median(theirs)
    ratio = p / t
    print(f"trainyard {t * 1e3:.1f} ms/step, PyTorch eager {p * 1e3:.1f} ms/step: {ratio:.2f}x")
    if args.record:
        where = torch.cuda.get_device_name(0) if args.device == "cuda" else machine()
        what = (f"scripted ResNet-18 (`torch.jit.script`, {args.image}x{args.image}, batch {args.batch}, SGD "
                f"momentum), median step over {args.steps} steps, {args.threads} threads, median of "
                f"{args.rounds} rounds, {args.device}; PyTorch trains the same `torch.jit.load`ed module")
        record("TorchScript modules (issue 38)",
               f"| {datetime.date.today()} | {what} | {t * 1e3:.1f} ms/step | PyTorch eager: {p * 1e3:.1f} "
               f"ms/step | **{ratio:.2f}x** | {where} | `python3 bench/torchscript_bench.py --steps "
               f"{args.steps} --batch {args.batch} --image {args.image} --threads {args.threads} --rounds {args.rounds} "
               f"--device {args.device} --record` |")


if __name__ == "__main__":
    main()
