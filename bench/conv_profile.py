"""Per-op profile of ResNet-18's convolutions (CIFAR stem, batch 64): PyTorch eager (oneDNN) against ours
(`examples/step_profile resnet-convs`: the im2col path and the blocked direct path), forward and backward
(input + weight gradients) for every conv shape, same thread count, same machine, one run. Shows where the
next gap is; the whole train step is `bench/train_step_bench.py`.

    cargo build --release --example step_profile
    .venv-torch/bin/python bench/conv_profile.py --threads 2 [--record]
"""

import argparse
import datetime
import os
import re
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import ROOT, cap_isa, machine, record  # noqa: E402

PROFILE = os.environ.get("STEP_PROFILE", os.path.join(ROOT, "target", "release", "examples", "step_profile"))

# (c_in, c_out, hw_in, k, stride, count): as in examples/step_profile.rs
SHAPES = [
    (3, 64, 32, 3, 1, 1), (64, 64, 32, 3, 1, 4), (64, 128, 32, 3, 2, 1), (64, 128, 32, 1, 2, 1),
    (128, 128, 16, 3, 1, 3), (128, 256, 16, 3, 2, 1), (128, 256, 16, 1, 2, 1), (256, 256, 8, 3, 1, 3),
    (256, 512, 8, 3, 2, 1), (256, 512, 8, 1, 2, 1), (512, 512, 4, 3, 1, 3),
]


def median_ms(f, n):
    f()
    times = []
    for _ in range(n):
        s = time.perf_counter()
        f()
        times.append((time.perf_counter() - s) * 1e3)
    return sorted(times)[n // 2]


def torch_rows(n):
    # One pass over every shape first: oneDNN's first call per shape builds its kernels.
    for c_in, c_out, hw, k, s, _ in SHAPES:
        x = torch.randn(64, c_in, hw, hw, requires_grad=True)
        F.conv2d(x, torch.randn(c_out, c_in, k, k, requires_grad=True), stride=s, padding=k // 2).sum().backward()
    rows = []
    for c_in, c_out, hw, k, s, count in SHAPES:
        x = torch.randn(64, c_in, hw, hw, requires_grad=True)
        w = torch.randn(c_out, c_in, k, k, requires_grad=True)
        fwd = median_ms(lambda: F.conv2d(x, w, stride=s, padding=k // 2), n)
        both = median_ms(lambda: F.conv2d(x, w, stride=s, padding=k // 2).sum().backward(), n)
        rows.append((fwd, both - fwd))
    return rows


def ours_rows(n, threads):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    out = subprocess.run([PROFILE, "resnet-convs", str(n)], env=env, check=True,
                         capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.findall(r"(im2col|direct) fwd +([\d.]+) ms bwd +([\d.]+) ms", line)
        if m:
            rows.append({name: (float(f), float(b)) for name, f, b in m})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--isa", default="native", choices=["native", "avx2"],
                    help="avx2: both sides capped at AVX2 on this CPU")
    ap.add_argument("--record", action="store_true")
    a = ap.parse_args()
    cap_isa(a.isa)
    torch.set_num_threads(a.threads)
    theirs = torch_rows(a.reps)
    ours = ours_rows(a.reps, a.threads)
    print(f"{'shape':28} {'PyTorch fwd/bwd ms':>20} {'direct fwd/bwd ms':>20} {'im2col fwd/bwd ms':>20}")
    tot = {"torch": [0.0, 0.0], "direct": [0.0, 0.0], "im2col": [0.0, 0.0]}
    for (c_in, c_out, hw, k, s, count), t, o in zip(SHAPES, theirs, ours):
        d, i = o.get("direct", (float("nan"),) * 2), o["im2col"]
        print(f"{c_in:3}->{c_out:3} {hw:2}px k{k} s{s} x{count:<6} {t[0]:9.2f} {t[1]:9.2f}  "
              f"{d[0]:9.2f} {d[1]:9.2f}  {i[0]:9.2f} {i[1]:9.2f}")
        for key, v in (("torch", t), ("direct", d), ("im2col", i)):
            tot[key][0] += v[0] * count
            tot[key][1] += v[1] * count
    print("totals (ms, fwd/bwd): " + ", ".join(f"{k} {v[0]:.1f}/{v[1]:.1f}" for k, v in tot.items()))
    ratio = sum(tot["torch"]) / sum(tot["direct"])
    print(f"direct vs PyTorch over all convs: {ratio:.2f}x")
    if a.record:
        record(
            "Convolution profile, CPU (issue 23)",
            f"| {datetime.date.today()} | ResNet-18-CIFAR convolutions, batch 64, {a.threads} threads, forward + backward "
            f"summed over the network (per shape: `bench/conv_profile.py`) | direct {sum(tot['direct']):.0f} ms "
            f"(fwd {tot['direct'][0]:.0f}, bwd {tot['direct'][1]:.0f}); im2col {sum(tot['im2col']):.0f} ms "
            f"| PyTorch {torch.__version__} eager (oneDNN): {sum(tot['torch']):.0f} ms (fwd {tot['torch'][0]:.0f}, "
            f"bwd {tot['torch'][1]:.0f}) | **{ratio:.2f}x** | {machine(a.isa)} "
            f"| `.venv-torch/bin/python bench/conv_profile.py --threads {a.threads}"
            f"{'' if a.isa == 'native' else ' --isa ' + a.isa} --record` |",
        )

if __name__ == "__main__":
    main()
