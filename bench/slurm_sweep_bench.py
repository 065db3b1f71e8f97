#!/usr/bin/env python3
"""Sweep overhead through SLURM: 16 quickstart jobs via trainyard's `hydra/launcher=submitit_slurm` vs the
same 16 jobs via Hydra 1.3 + hydra-submitit-launcher 1.2 on the same cluster (scripts/slurm-test-cluster.sh:
two slurmd on this host). Every job is the same `train` command (the Hydra app's task runs it as a
subprocess), so the difference is the launcher: building and submitting the array, starting each job,
noticing it ended and recording the result. Reports the sweep's wall time, the mean submit→start latency
(job start as the job records it minus the sweep's start), and the ratio; --record appends a row to
bench/RESULTS.md. Runs alternate (trainyard, hydra, ...) so drift hits both alike.

Usage (root; from the repo root):
    cargo build --release
    .venv-oracle/bin/pip install hydra-core==1.3.2 hydra-submitit-launcher==1.2.0
    .venv-oracle/bin/python bench/slurm_sweep_bench.py --rounds 3 --record
"""
import argparse
import datetime
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import machine  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "target", "release", "train")
JOB = ["experiment=quickstart", "data.train_size=256", "data.val_size=64", "trainer.max_epochs=1",
       "callbacks.model_summary=null"]
JOBS = 16

HYDRA_APP = """
import json, os, subprocess, sys, time
import hydra
from hydra.core.hydra_config import HydraConfig
@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg):
    start = time.time()
    out_dir = HydraConfig.get().runtime.output_dir
    out = subprocess.run([TRAIN, *JOB, f"seed={cfg.seed}", f"hydra.run.dir={out_dir}/run"], cwd=ROOT,
                         capture_output=True)
    json.dump({"start": start, "end": time.time(), "rc": out.returncode},
              open(os.path.join(out_dir, "bench.json"), "w"))
    assert out.returncode == 0, out.stderr.decode()
main()
"""


def start_cluster(state):
    out = subprocess.run([os.path.join(ROOT, "scripts", "slurm-test-cluster.sh"), "start", state],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip().split("=", 1)[1]


def ours(work, env):
    sweep = os.path.join(work, f"ty-{time.time_ns()}")
    t0 = time.time()
    subprocess.run([TRAIN, "-m", *JOB, f"seed=range(0,{JOBS})", "hydra/launcher=submitit_slurm",
                    f"hydra.sweep.dir={sweep}"], cwd=ROOT, env=env, check=True, capture_output=True)
    wall = time.time() - t0
    starts = []
    for run in glob.glob(os.path.join(sweep, "[0-9]*", "run.json")):
        started = json.load(open(run))["started_at"]
        starts.append(datetime.datetime.fromisoformat(started).timestamp() - t0)
    assert len(starts) == JOBS, starts
    return wall, statistics.mean(starts)


def hydra(work, env, python, app):
    sweep = os.path.join(work, f"hy-{time.time_ns()}")
    t0 = time.time()
    subprocess.run([python, app, "-m", "+seed=range(0,%d)" % JOBS, "hydra/launcher=submitit_slurm",
                    f"hydra.sweep.dir={sweep}", "hydra.launcher.timeout_min=10"],
                   cwd=work, env=env, check=True, capture_output=True)
    wall = time.time() - t0
    starts = [json.load(open(p))["start"] - t0 for p in glob.glob(os.path.join(sweep, "*", "bench.json"))]
    assert len(starts) == JOBS, starts
    return wall, statistics.mean(starts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="slurm-bench-")
    state = os.path.join(work, "cluster")
    env = dict(os.environ, SLURM_CONF=start_cluster(state), RAYON_NUM_THREADS="1", OMP_NUM_THREADS="1")
    app = os.path.join(work, "app.py")
    with open(app, "w") as f:
        f.write(f"TRAIN = {TRAIN!r}\nJOB = {JOB!r}\nROOT = {ROOT!r}\n" + HYDRA_APP)
    results = {"trainyard": [], "hydra": []}
    try:
        for _ in range(args.rounds):
            results["trainyard"].append(ours(work, env))
            results["hydra"].append(hydra(work, env, sys.executable, app))
    finally:
        subprocess.run([os.path.join(ROOT, "scripts", "slurm-test-cluster.sh"), "stop", state])
    med = {k: (statistics.median(w for w, _ in v), statistics.median(s for _, s in v)) for k, v in results.items()}
    ratio = med["hydra"][0] / med["trainyard"][0]
    line = (f"| SLURM sweep, {JOBS} quickstart jobs (submitit_slurm) | {med['trainyard'][0]:.1f} s "
            f"(start +{med['trainyard'][1]:.2f} s) | {med['hydra'][0]:.1f} s (start +{med['hydra'][1]:.2f} s) "
            f"| {ratio:.2f}x | {machine()} | `bench/slurm_sweep_bench.py --rounds {args.rounds}` |")
    print(line)
    for k, v in results.items():
        print(k, ["%.1fs/+%.2fs" % x for x in v])
    if args.record:
        with open(os.path.join(ROOT, "bench", "RESULTS.md"), "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
