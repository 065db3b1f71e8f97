"""Data-loader throughput: trainyard's loader (worker threads, JPEG decode + ImageNet training augmentation)
vs torchvision's ImageFolder + DataLoader (worker processes, PIL decode) on the same generated JPEG image
folder, same transforms, batch size and number of workers, alternating runs. Whole epochs are timed for both,
worker start-up included (what a user pays per epoch without persistent workers).

    python3 bench/loader_bench.py --workers 1 2 --rounds 3 --record                  # every 20th image large
    python3 bench/loader_bench.py --workers 1 2 --rounds 3 --large-every 0 --record  # all 500x375

Needs torch 2.11 + torchvision in the interpreter and `cargo build --release --example loader_bench` first.
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

import numpy as np
import torch
import torchvision
import torchvision.transforms as T
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import ROOT, record, machine  # noqa: E402

OURS = os.path.join(ROOT, "target", "release", "examples", "loader_bench")


def make_folder(root: str, classes: int, per_class: int, large_every: int = 0, seed: int = 0) -> None:
    """ImageNet-like JPEGs (500x375, quality 90, textured so they compress like photos); with
    `large_every` > 0, every such image of the folder 1600x1200 instead (ImageNet's few large photos)."""
    rng = np.random.default_rng(seed)
    grids = {size: np.mgrid[0:size[1], 0:size[0]].astype(np.float32) for size in [(500, 375), (1600, 1200)]}
    n = 0
    for c in range(classes):
        d = os.path.join(root, "train", f"n{c:08d}")
        os.makedirs(d, exist_ok=True)
        for i in range(per_class):
            n += 1
            yy, xx = grids[(1600, 1200) if large_every and n % large_every == 0 else (500, 375)]
            fx, fy, phase = rng.uniform(0.005, 0.05, 2).tolist() + [rng.uniform(0, 6.28)]
            base = 127 + 80 * np.sin(xx * fx + yy * fy + phase)
            img = np.stack([base, np.roll(base, 40, 1), np.roll(base, 80, 0)], -1)
            img += rng.normal(0, 18, img.shape)
            Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(
                os.path.join(d, f"img_{i:04d}.JPEG"), quality=90
            )


class DecodeJpegFolder(torch.utils.data.Dataset):
    """The same folder read as bytes and decoded by torchvision.io.decode_jpeg (libjpeg-turbo), then
    transforms v2 on uint8 tensors: torchvision's fast path."""

    def __init__(self, root: str, transform):
        folder = torchvision.datasets.ImageFolder(os.path.join(root, "train"))
        self.samples, self.transform = folder.samples, transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        data = torchvision.io.read_file(path)
        return self.transform(torchvision.io.decode_jpeg(data)), label


def decode_jpeg_epoch(root: str, workers: int, batch: int) -> float:
    from torchvision.transforms import v2
    tf = v2.Compose([
        v2.RandomResizedCrop(224, antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    loader = torch.utils.data.DataLoader(DecodeJpegFolder(root, tf), batch_size=batch, shuffle=True,
                                         num_workers=workers)
    start = time.perf_counter()
    n = sum(len(labels) for _, labels in loader)
    return n / (time.perf_counter() - start)


def torchvision_epoch(root: str, workers: int, batch: int) -> float:
    tf = T.Compose([
        T.RandomResizedCrop(224),
        T.RandomHorizontalFlip(),
        T.ToTensor(),
        T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    ds = torchvision.datasets.ImageFolder(os.path.join(root, "train"), tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers)
    start = time.perf_counter()
    n = sum(len(labels) for _, labels in loader)
    return n / (time.perf_counter() - start)


def ours_epoch(root: str, workers: int, batch: int) -> float:
    out = subprocess.run([OURS, root, str(workers), str(batch), "1"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["images_per_s"]


def entropy_ab(root: str, what: str, args) -> None:
    """trainyard's Huffman decoder vs libjpeg-turbo's inside the same decode (same files, same thread,
    alternating rounds): the old JPEG path against the new one."""
    out = subprocess.run([OURS, root, "entropy", str(max(args.rounds, 3))], check=True, capture_output=True,
                         text=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    for scale, label in [("scale_8", "whole image"), ("scale_1", "at 1/8 scale (Huffman decoding left)")]:
        o, l = r[scale]["trainyard_ms"], r[scale]["libjpeg_ms"]
        print(f"decode {label}: trainyard's Huffman decoder {o:.3f} ms/img, libjpeg-turbo's {l:.3f} ms/img "
              f"(ratio {l / o:.2f})")
        if args.record:
            record(
                "Data loading, JPEG image folder (issue: training core)",
                f"| {datetime.date.today()} | {what}, JPEG decode {label}, 1 thread, median of "
                f"{max(args.rounds, 3)} alternated rounds | {o:.3f} ms/img | libjpeg-turbo's own Huffman "
                f"decoder (the previous path), same decode: {l:.3f} ms/img | {l / o:.2f}x | {machine()} | "
                f"`python3 bench/loader_bench.py --workers 1 --large-every {args.large_every} --entropy "
                f"--record` |",
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--images", type=int, default=640)
    ap.add_argument("--large-every", type=int, default=20,
                    help="every Nth image 1600x1200 instead of 500x375 (0: none)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--entropy", action="store_true",
                    help="also time trainyard's Huffman decoder against libjpeg-turbo's on the same files")
    args = ap.parse_args()
    torch.set_num_threads(1)
    what = f"{args.images} JPEGs 500x375" + (f" (every {args.large_every}th 1600x1200)" if args.large_every else "")
    with tempfile.TemporaryDirectory() as root:
        make_folder(root, 10, args.images // 10, args.large_every)
        if args.entropy:
            entropy_ab(root, what, args)
        for w in args.workers:
            ours, pil, dj = [], [], []
            for _ in range(args.rounds):
                ours.append(ours_epoch(root, w, args.batch))
                pil.append(torchvision_epoch(root, w, args.batch))
                dj.append(decode_jpeg_epoch(root, w, args.batch))
            o, t, d = statistics.median(ours), statistics.median(pil), statistics.median(dj)
            print(f"workers={w}: trainyard {o:.1f} img/s, torchvision PIL {t:.1f} img/s (ratio {o / t:.2f}), "
                  f"decode_jpeg + v2 {d:.1f} img/s (ratio {o / d:.2f}); rounds: ours {[round(x) for x in ours]}, "
                  f"PIL {[round(x) for x in pil]}, decode_jpeg {[round(x) for x in dj]}")
            if args.record:
                cmd = (f"`python3 bench/loader_bench.py --workers {w} --large-every {args.large_every} "
                       f"--rounds {args.rounds} --record`")
                record(
                    "Data loading, JPEG image folder (issue: training core)",
                    f"| {datetime.date.today()} | {what}, RandomResizedCrop 224 + flip + "
                    f"normalize, batch {args.batch}, {w} worker(s), median of {args.rounds} epochs | "
                    f"{o:.1f} img/s | torchvision {torchvision.__version__} DataLoader, PIL: {t:.1f} img/s "
                    f"(**{o / t:.2f}x**); decode_jpeg + transforms v2: {d:.1f} img/s ({o / d:.2f}x) | "
                    f"{o / t:.2f}x | {machine()} | {cmd} |",
                )


if __name__ == "__main__":
    main()
