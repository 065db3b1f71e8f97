"""Per-op profile of ViT-Tiny/8 at 32 px (batch 64: 17 tokens of 192, 3 heads): PyTorch eager against ours
(`examples/step_profile vit-ops`: the ops the Candle backend's ViT runs), forward and backward of each, and
the three products of each linear layer on our GEMM alone (`trainyard-conv`'s `gemm_shapes`) beside MKL's
(`torch.addmm`/`torch.mm`); same thread count, same machine, one run. Shows where the next gap is; the
whole train step is
`bench/train_step_bench.py --models vit-tiny`.

    cargo build --release --example step_profile
    cargo build --release --manifest-path crates/trainyard-conv/Cargo.toml --example gemm_shapes
    .venv-torch/bin/python bench/vit_profile.py --threads 2 [--record]
"""

import argparse
import datetime
import os
import re
import subprocess
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conv_profile import median_ms  # noqa: E402
from results import ROOT, cap_isa, machine, record  # noqa: E402

PROFILE = os.environ.get("STEP_PROFILE", os.path.join(ROOT, "target", "release", "examples", "step_profile"))
GEMMS = os.environ.get("GEMM_SHAPES", os.path.join(ROOT, "crates", "trainyard-conv", "target", "release", "examples",
                                                  "gemm_shapes"))
B, N, D, HEADS = 64, 17, 192, 3


def fwd_bwd(f, x, n, params=()):
    """(forward ms, backward ms) of `f(x)`, the backward seeded with ones as step_profile's `op` does. The
    gradients of `x` and `params` are dropped before each backward, as a train step's
    `zero_grad(set_to_none=True)` does: kept, every backward would add into them (an extra pass ours,
    which returns fresh gradients, does not make; it put PyTorch's linears 20-40% behind before)."""
    fwd = median_ms(lambda: f(x), n)

    def both():
        for t in (x, *params):
            t.grad = None
        y = f(x)
        y.backward(torch.ones_like(y))

    return fwd, median_ms(both, n) - fwd


def attention(qkv):
    q, k, v = qkv.reshape(B, N, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4).unbind(0)
    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, D)


def torch_rows(n):
    """Rows keyed like step_profile's names (the ops a timm ViT block runs)."""
    x = torch.randn(B, N, D, requires_grad=True)
    hidden = torch.randn(B, N, 4 * D, requires_grad=True)
    rows = {}
    for name, inp, i, o in [("linear qkv", x, D, 3 * D), ("linear proj", x, D, D),
                            ("linear fc1", x, D, 4 * D), ("linear fc2", hidden, 4 * D, D)]:
        lin = torch.nn.Linear(i, o)
        rows[name] = fwd_bwd(lin, inp, n, tuple(lin.parameters()))
    ln = torch.nn.LayerNorm(D, eps=1e-6)
    rows["layer norm"] = fwd_bwd(ln, x, n, tuple(ln.parameters()))
    rows["gelu"] = fwd_bwd(F.gelu, hidden, n)
    rows["attention"] = fwd_bwd(attention, torch.randn(B, N, 3 * D, requires_grad=True), n)
    return rows


def ours_rows(n, threads):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    out = subprocess.run([PROFILE, "vit-ops", str(n)], check=True, capture_output=True, text=True, env=env).stdout
    rows = {}
    for line in out.splitlines():
        m = re.match(r"\s+(.+?)\s+fwd\s+([\d.-]+) ms\s+bwd\s+([\d.-]+) ms", line)
        if m:
            key = next((k for k in ("linear qkv", "linear proj", "linear fc1", "linear fc2", "layer norm", "gelu",
                                    "attention") if m.group(1).startswith(k)), None)
            if key:
                rows[key] = (float(m.group(2)), float(m.group(3)))
    return rows


def torch_gemms(n):
    """MKL's products on the shapes of `gemm_shapes`: (fwd, dx, dw) ms per linear."""
    rows, out = B * N, {}
    for name, i, o in [("qkv", D, 3 * D), ("proj", D, D), ("fc1", D, 4 * D), ("fc2", 4 * D, D)]:
        x, w, b, dy = torch.randn(rows, i), torch.randn(o, i), torch.randn(o), torch.randn(rows, o)
        out[name] = (median_ms(lambda: torch.addmm(b, x, w.t()), n), median_ms(lambda: torch.mm(dy, w), n),
                     median_ms(lambda: torch.mm(dy.t(), x), n))
    return out


def ours_gemms(n, threads):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    text = subprocess.run([GEMMS, str(n)], check=True, capture_output=True, text=True,
                          env=env).stdout
    return {m.group(1): tuple(float(m.group(k)) for k in (2, 3, 4))
            for m in re.finditer(r"gemm (\w+)\s+fwd\s+([\d.]+) ms\s+dx\s+([\d.]+) ms\s+dw\s+([\d.]+) ms", text)}


# How often each op runs per ViT-Tiny step (12 blocks; the final LayerNorm adds one).
PER_STEP = {"linear qkv": 12, "linear proj": 12, "linear fc1": 12, "linear fc2": 12, "layer norm": 25, "gelu": 12,
            "attention": 12}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--isa", default="native", choices=["native", "avx2"],
                    help="avx2: both sides capped at AVX2 on this CPU")
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    cap_isa(args.isa)
    for path, build in ((PROFILE, "cargo build --release --example step_profile"),
                        (GEMMS, "cargo build --release --manifest-path crates/trainyard-conv/Cargo.toml "
                                "--example gemm_shapes")):
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: build it with `{build}` (or point STEP_PROFILE / GEMM_SHAPES at it)")
    torch.set_num_threads(args.threads)
    theirs, ours = torch_rows(args.n), ours_rows(args.n, args.threads)
    lines = [f"{'op (batch 64, 17 tokens x 192)':32} {'PyTorch fwd/bwd ms':>20} {'ours fwd/bwd ms':>18}"]
    total_t = total_o = 0.0
    for key, count in PER_STEP.items():
        (tf, tb), (of, ob) = theirs[key], ours[key]
        total_t += count * (tf + tb)
        total_o += count * (of + ob)
        lines.append(f"{key:32} {tf:9.2f} {tb:9.2f} {of:9.2f} {ob:9.2f}")
    lines.append(f"per step (ops x count): PyTorch {total_t:.1f} ms, ours {total_o:.1f} ms, "
                 f"ratio {total_t / total_o:.2f}x")
    theirs_g, ours_g = torch_gemms(args.n), ours_gemms(args.n, args.threads)
    lines.append("")
    lines.append(f"{'product (rows 1088)':20} {'MKL fwd/dx/dw ms':>26} {'ours fwd/dx/dw ms':>26}")
    for name, t in theirs_g.items():
        o = ours_g[name]
        lines.append(f"{name:20} " + " ".join(f"{v:8.3f}" for v in t) + "  " + " ".join(f"{v:8.3f}" for v in o))
    gemm_t = sum(map(sum, theirs_g.values()))
    gemm_o = sum(map(sum, ours_g.values()))
    lines.append(f"products per block: MKL {gemm_t:.2f} ms, ours {gemm_o:.2f} ms, ratio {gemm_t / gemm_o:.2f}x")
    print("\n".join(lines))
    if args.record:
        isa = "" if args.isa == "native" else f" --isa {args.isa}"
        record(
            "Transformer kernels, CPU (issue 23)",
            f"| {datetime.date.today()} | ViT-Tiny/8 ops per step (linear x4, LayerNorm, GELU, attention; fwd+bwd "
            f"x their count), batch 64, {args.threads} threads | {total_o:.1f} ms | PyTorch {torch.__version__} "
            f"eager: {total_t:.1f} ms | **{total_t / total_o:.2f}x** | {machine(args.isa)} "
            f"| `.venv-torch/bin/python bench/vit_profile.py --threads {args.threads}{isa} --record` |",
        )
        record(
            "Transformer kernels, CPU (issue 23)",
            f"| {datetime.date.today()} | ViT-Tiny/8 linear products per block (fwd, dx, dw of qkv, proj, fc1, "
            f"fc2; rows 1088), {args.threads} threads | {gemm_o:.2f} ms | MKL (PyTorch {torch.__version__}): "
            f"{gemm_t:.2f} ms | **{gemm_t / gemm_o:.2f}x** | {machine(args.isa)} "
            f"| `.venv-torch/bin/python bench/vit_profile.py --threads {args.threads}{isa} --record` |",
        )


if __name__ == "__main__":
    main()
