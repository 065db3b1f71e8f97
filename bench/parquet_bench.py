"""Reading a hub dataset's parquet files: trainyard's loader (`data=parquet`: row groups read by worker
threads, PNG decode, CIFAR's training augmentation) against what a Hugging Face user writes — `datasets`'
`load_dataset("parquet", ...)` with `with_transform` (PIL decode, torchvision transforms) in PyTorch's
DataLoader — on the same files (CIFAR-10's shape: 32x32 PNG images, `img` {bytes, path} and `label`, two
files), the same transforms, batch size and worker count, alternating runs. Whole epochs are timed on both
sides, worker start-up included; `datasets`' one-time conversion into its Arrow cache is done before timing.

    python3 bench/parquet_bench.py --images 10000 --workers 1 2 --rounds 3 --record

Needs torch, torchvision, pyarrow and datasets in the interpreter, and
`cargo build --release --example loader_bench` first.
"""

import argparse
import datetime
import glob
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import ROOT, machine, record  # noqa: E402

OURS = os.path.join(ROOT, "target", "release", "examples", "loader_bench")
MEAN, STD = [0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]


def cifar_like_pngs(images: int) -> list[bytes]:
    """`images` CIFAR-10-shaped PNGs: smooth colour fields with noise, so PNG compresses them as it does
    photos (also bench/webdataset_bench.py's)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:32, 0:32].astype(np.float32)
    pngs = []
    for _ in range(images):
        base = rng.uniform(0, 255, 3)
        field = base + 40 * np.sin(xx[..., None] / rng.uniform(2, 8) + yy[..., None] / rng.uniform(2, 8))
        pixels = np.clip(field + rng.normal(0, 8, (32, 32, 3)), 0, 255).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, format="PNG")
        pngs.append(out.getvalue())
    return pngs


def make_files(root: str, images: int) -> None:
    """`cifar_like_pngs` in the hub's schema, two files of row groups of 1000."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"bytes": png, "path": None} for png in cifar_like_pngs(images)]
    labels = [i % 10 for i in range(images)]
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    # The hub's metadata: `datasets` reads `img` as its Image feature (PIL images) and `label` as a ClassLabel.
    features = {"img": {"_type": "Image"}, "label": {"names": [str(c) for c in range(10)], "_type": "ClassLabel"}}
    schema = pa.schema([("img", kind), ("label", pa.int64())]).with_metadata(
        {b"huggingface": json.dumps({"info": {"features": features}}).encode()})
    half = images // 2
    for k, (a, b) in enumerate([(0, half), (half, images)]):
        table = pa.table({"img": pa.array(rows[a:b], type=kind), "label": pa.array(labels[a:b], pa.int64())},
                         schema=schema)
        pq.write_table(table, os.path.join(root, f"train-0000{k}-of-00002.parquet"), row_group_size=1000)


def hf_loader(root: str, workers: int, batch: int, cache: str):
    import datasets
    import torch
    import torchvision.transforms as T

    tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = datasets.load_dataset("parquet", data_files={"train": sorted(glob.glob(os.path.join(root, "*.parquet")))},
                               split="train", cache_dir=cache)

    def transform(b):
        return {"pixel_values": [tf(img.convert("RGB")) for img in b["img"]], "label": b["label"]}

    ds = ds.with_transform(transform)
    return torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers)


def hf_epoch(root: str, workers: int, batch: int, cache: str) -> float:
    start = time.perf_counter()
    loader = hf_loader(root, workers, batch, cache)
    n = sum(len(b["label"]) for b in loader)
    return n / (time.perf_counter() - start)


def ours_epoch(root: str, workers: int, batch: int) -> float:
    out = subprocess.run([OURS, root, str(workers), str(batch), "1", "parquet"], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["images_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    import datasets
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root, tempfile.TemporaryDirectory() as cache:
        make_files(root, args.images)
        hf_loader(root, 0, args.batch, cache)  # datasets' Arrow cache, made once, outside the timing
        for w in args.workers:
            ours, theirs = [], []
            for _ in range(args.rounds):
                ours.append(ours_epoch(root, w, args.batch))
                theirs.append(hf_epoch(root, w, args.batch, cache))
            o, t = statistics.median(ours), statistics.median(theirs)
            print(f"workers={w}: trainyard {o:.1f} img/s, datasets + DataLoader {t:.1f} img/s, ratio {o / t:.2f}"
                  f" (rounds: ours {[round(x) for x in ours]}, theirs {[round(x) for x in theirs]})")
            if args.record:
                record(
                    "Data loading, the hub's parquet files (issue: data at scale)",
                    f"| {datetime.date.today()} | {args.images} CIFAR-sized PNGs in 2 parquet files (hub schema), "
                    f"random crop 32 pad 4 + flip + normalize, batch {args.batch}, {w} worker(s), whole epochs, "
                    f"median of {args.rounds} | {o:.1f} img/s | datasets {datasets.__version__} + torch "
                    f"{torch.__version__} DataLoader: {t:.1f} img/s | **{o / t:.2f}x** | {machine()} | "
                    f"`python3 bench/parquet_bench.py --images {args.images} --workers {w} --rounds {args.rounds} "
                    f"--record` |",
                )


if __name__ == "__main__":
    main()
