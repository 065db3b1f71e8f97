"""Soak: memory, descriptors, threads and throughput over a long run and over a long sweep.

1. ResNet-18 (CIFAR stem) trained for `--minutes` (Lightning's Timer: `callbacks.timer.max_time`) on a
   generated JPEG image folder in CINIC-10's layout (32x32, 10 classes) with 2 loader workers: the `train`
   process's resident memory, open descriptors and threads sampled every `--every` seconds, and its
   throughput per epoch (its log's img/s).
2. A `--jobs`-job sweep on the joblib launcher (2 jobs at a time, each a short quick start): the launcher's
   memory, descriptors and threads sampled the same way while it starts and reaps its jobs.

Growth is the median of the last three samples over that of the first three after `--warmup` minutes
(caches filled, the loader's pool up); the issue's bar is under 5% for each. No reference tool runs beside it: the
numbers are trainyard's own, over time.

    cargo build --release && python3 bench/soak.py --minutes 30 --jobs 200 --record

Needs numpy and Pillow (to write the JPEGs) in the interpreter.
"""

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import ROOT, machine, record  # noqa: E402

TRAIN = os.path.join(ROOT, "target", "release", "train")


def make_folder(root: str, per_class: dict, seed: int = 0) -> None:
    """CINIC-10's layout, `root/{train,valid,test}/<class>/*.jpg`, 32x32 JPEGs whose class sets their
    colour and stripes (learnable), with noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:32, 0:32].astype(np.float32)
    for split, n in per_class.items():
        for c in range(10):
            d = os.path.join(root, split, f"class{c}")
            os.makedirs(d, exist_ok=True)
            for i in range(n):
                base = 127 + 90 * np.sin(xx * (0.2 + 0.05 * c) + yy * 0.1 * (c % 3) + rng.uniform(0, 6.28))
                img = np.stack([base, np.roll(base, 3 * c, 1), 255 - base], -1) + rng.normal(0, 25, (32, 32, 3))
                Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(
                    os.path.join(d, f"{i:05d}.jpg"), quality=90)


def sample(pid: int) -> dict:
    """Resident memory (MiB), open descriptors and threads of a live process, from /proc."""
    status = open(f"/proc/{pid}/status").read()
    rss_kb = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return {"rss_mib": rss_kb / 1024, "fds": fds, "threads": threads}


def watch(proc: subprocess.Popen, every: float, samples: list) -> None:
    """Sample `proc` every `every` seconds until it ends (the first at once)."""
    t0 = time.time()
    while proc.poll() is None:
        try:
            samples.append({"t_min": (time.time() - t0) / 60, **sample(proc.pid)})
        except (OSError, AttributeError):
            pass
        deadline = time.time() + every
        while time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)


def growth(samples: list, warmup_min: float, key: str) -> tuple:
    """(median of the first three samples after warm-up, median of the last three, growth in %): a leak
    shows as the end above the start; a count that comes and goes (a loader thread per epoch) does not."""
    after = [s[key] for s in samples if s["t_min"] >= warmup_min] or [samples[-1][key]]
    window = max(1, min(3, len(after) // 2))
    base, end = statistics.median(after[:window]), statistics.median(after[-window:])
    return base, end, 100.0 * (end - base) / base if base else 0.0


def run_watched(cmd: list, cwd: str, every: float, log_path: str) -> tuple:
    samples = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        watcher = threading.Thread(target=watch, args=(proc, every, samples))
        watcher.start()
        code = proc.wait()
        watcher.join()
    if code != 0:
        sys.exit(f"{' '.join(cmd)} failed ({code}); see {log_path}")
    return samples


def report(name: str, samples: list, warmup: float) -> dict:
    out = {}
    print(f"\n{name}: {len(samples)} samples over {samples[-1]['t_min']:.1f} min")
    for s in samples:
        print(f"  {s['t_min']:6.1f} min  rss {s['rss_mib']:8.1f} MiB  fds {s['fds']:4d}  threads {s['threads']:3d}")
    for key in ("rss_mib", "fds", "threads"):
        out[key] = growth(samples, warmup, key)
        peak = max(s[key] for s in samples if s["t_min"] >= min(warmup, samples[-1]["t_min"]))
        print(f"  {key}: {out[key][0]:.1f} after warm-up, {out[key][1]:.1f} at the end ({out[key][2]:+.1f}%), "
              f"{peak:.1f} at most")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--every", type=float, default=60, help="seconds between samples")
    ap.add_argument("--warmup", type=float, default=3, help="minutes before growth is measured")
    ap.add_argument("--per-class", type=int, default=500, help="training images per class")
    ap.add_argument("--train", default=TRAIN, help="the train binary (default: the release build)")
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    args.train = os.path.abspath(args.train)
    if not os.path.exists(args.train):
        sys.exit(f"{args.train} is missing: cargo build --release")
    work = tempfile.mkdtemp(prefix="trainyard-soak-")
    data = os.path.join(work, "cinic")
    make_folder(data, {"train": args.per_class, "valid": max(args.per_class // 5, 1), "test": 1})

    hms = str(datetime.timedelta(minutes=args.minutes)).rjust(8, "0")
    run_cmd = [args.train, "model=resnet18", "model.cifar_stem=true", "data=cinic10", f"data.root={data}",
               "data.num_workers=2", "data.batch_size=64", "trainer.max_epochs=100000",
               f"++callbacks.timer.max_time=00:{hms}", "task_name=soak", "hydra.run.dir=run"]
    started = time.time()
    run = run_watched(run_cmd, work, args.every, os.path.join(work, "run.out"))
    run_minutes = (time.time() - started) / 60
    log = open(os.path.join(work, "run", "train.log")).read()
    speeds = [float(v) for v in re.findall(r"epoch \d+/\d+ .* (\d+(?:\.\d+)?) img/s", log)]
    run_growth = report("ResNet-18 run", run, args.warmup)
    steady = speeds[1:] or speeds
    spread = 100.0 * (max(steady) - min(steady)) / statistics.median(steady) if steady else 0.0
    print(f"  throughput per epoch (img/s): {speeds}; after the first, spread {spread:.1f}% of the median")

    sweep_cmd = [args.train, "-m", "experiment=quickstart", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                 f"seed=range(0,{args.jobs})", "trainer.max_epochs=1", "data.train_size=256",
                 "data.val_size=64", "data.num_workers=0", "task_name=soak_sweep",
                 "hydra.sweep.dir=sweep", "callbacks.model_summary=null"]
    started = time.time()
    sweep = run_watched(sweep_cmd, work, args.every, os.path.join(work, "sweep.out"))
    sweep_minutes = (time.time() - started) / 60
    # A sweep of short jobs may end before the run's warm-up does: its own is the first half minute.
    sweep_warmup = min(args.warmup, 0.5)
    sweep_growth = report(f"{args.jobs}-job joblib sweep (the launcher)", sweep, sweep_warmup)
    print(f"\nwork folder (delete when done): {work}")

    if args.record:
        today = datetime.date.today().isoformat()
        build = "" if args.train == TRAIN else f" --train {os.path.relpath(args.train, ROOT)}"
        cmd = f"`python3 bench/soak.py --minutes {args.minutes:g} --jobs {args.jobs}{build}`"

        def cells(g: dict) -> str:
            return ", ".join(f"{k} {g[k][0]:.0f}→{g[k][1]:.0f} ({g[k][2]:+.1f}%)"
                             for k in ("rss_mib", "fds", "threads"))
        worst_run = max(v[2] for v in run_growth.values())
        worst_sweep = max(v[2] for v in sweep_growth.values())
        record("Soak (memory, descriptors, threads over time)",
               f"| {today} | ResNet-18 (CIFAR stem), JPEG folder, 2 loader workers, {run_minutes:.0f} min, "
               f"{len(speeds)} epochs | {cells(run_growth)}; img/s per epoch {min(steady):.0f}-{max(steady):.0f} "
               f"(spread {spread:.1f}%) | growth after {args.warmup:g} min warm-up under 5% | worst "
               f"{worst_run:+.1f}% | {machine()} | {cmd} |")
        record("Soak (memory, descriptors, threads over time)",
               f"| {today} | {args.jobs}-job joblib sweep (2 at a time), the launcher, {sweep_minutes:.0f} min "
               f"| {cells(sweep_growth)} | growth after {sweep_warmup:g} min under 5% | worst {worst_sweep:+.1f}% "
               f"| {machine()} | {cmd} |")


if __name__ == "__main__":
    main()
