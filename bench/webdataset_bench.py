"""Reading WebDataset tar shards: trainyard's loader (`data=webdataset`: the shards indexed once, samples
read by worker threads, PNG decode, CIFAR's training augmentation) against the `webdataset` library a
PyTorch user would use (`wds.WebDataset(urls, shardshuffle=...).shuffle(...).decode("pil")` with
torchvision's transforms, in PyTorch's DataLoader), on the same shards (CIFAR-shaped PNGs and `.cls`
labels, 1000 samples a shard, written by Python's `tarfile` as WebDataset's TarWriter writes them), the
same transforms, batch size and worker count, alternating runs. Whole epochs are timed, worker start-up
included.

    python3 bench/webdataset_bench.py --images 10000 --workers 1 2 --rounds 3 --record
    python3 bench/webdataset_bench.py --images 10000 --workers 1 2 --rounds 3 --stream --record

Needs torch, torchvision, webdataset and Pillow, and `cargo build --release --example loader_bench` first.
"""

import argparse
import datetime
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parquet_bench import MEAN, STD, cifar_like_pngs  # noqa: E402
from results import ROOT, machine, record  # noqa: E402

OURS = os.path.join(ROOT, "target", "release", "examples", "loader_bench")
PER_SHARD = 1000


def make_shards(root: str, images: int) -> list[str]:
    pngs = cifar_like_pngs(images)
    paths = []
    for shard in range((images + PER_SHARD - 1) // PER_SHARD):
        path = os.path.join(root, f"train-{shard:06d}.tar")
        paths.append(path)
        with tarfile.open(path, "w") as tar:
            for i in range(shard * PER_SHARD, min(images, (shard + 1) * PER_SHARD)):
                for name, data in [(f"{i:09d}.png", pngs[i]), (f"{i:09d}.cls", str(i % 10).encode())]:
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return paths


def wds_epoch(shards: list[str], workers: int, batch: int) -> float:
    import torch
    import torchvision.transforms as T
    import webdataset as wds

    tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    start = time.perf_counter()
    ds = (wds.WebDataset(shards, shardshuffle=len(shards), nodesplitter=wds.split_by_node,
                         workersplitter=wds.split_by_worker)
          .shuffle(1000).decode("pil").to_tuple("png", "cls").map_tuple(tf, int).batched(batch))
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    n = sum(len(labels) for _, labels in loader)
    return n / (time.perf_counter() - start)


def ours_epoch(root: str, workers: int, batch: int, kind: str) -> float:
    out = subprocess.run([OURS, root, str(workers), str(batch), "1", kind], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["images_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--stream", action="store_true",
                    help="ours streams the shards (data.stream_shards=true: whole shards, shuffle buffer 1000), "
                         "as the webdataset library does, instead of indexing them")
    args = ap.parse_args()
    kind = "webdataset-stream" if args.stream else "webdataset"
    import torch
    import webdataset as wds

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        shards = make_shards(root, args.images)
        for w in args.workers:
            ours, theirs = [], []
            for _ in range(args.rounds):
                ours.append(ours_epoch(root, w, args.batch, kind))
                theirs.append(wds_epoch(shards, w, args.batch))
            o, t = statistics.median(ours), statistics.median(theirs)
            print(f"workers={w}: trainyard {o:.1f} img/s, webdataset + DataLoader {t:.1f} img/s, ratio {o / t:.2f}"
                  f" (rounds: ours {[round(x) for x in ours]}, theirs {[round(x) for x in theirs]})")
            if args.record:
                record(
                    "Data loading, WebDataset shards (issue: data at scale)",
                    f"| {datetime.date.today()} | {args.images} CIFAR-sized PNGs in {len(shards)} tar shards"
                    f"{', streamed (shuffle buffer 1000), dataset opening included' if args.stream else ''}, random "
                    f"crop 32 pad 4 + flip + normalize, batch {args.batch}, {w} worker(s), whole epochs, median of "
                    f"{args.rounds} | {o:.1f} img/s | webdataset {wds.__version__} + torch {torch.__version__} "
                    f"DataLoader (shuffle buffer 1000): {t:.1f} img/s | **{o / t:.2f}x** | {machine()} | "
                    f"`python3 bench/webdataset_bench.py --images {args.images} --workers {w} --rounds {args.rounds} "
                    f"{'--stream ' if args.stream else ''}--record` |",
                )


if __name__ == "__main__":
    main()
