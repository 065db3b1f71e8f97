#!/usr/bin/env python3
"""Logbook benchmark: `train logbook` vs the pandas + matplotlib script a user would otherwise write
(bench/logbook_reference.py), over the same N run directories.

The runs are real records, multiplied: `train` makes one short run and one one-job sweep in a scratch project;
their directories are cloned N times into experiments of single runs and sweeps, each clone with its own
task name, overrides, summary numbers and a metrics.csv of `--epochs` epochs (step and epoch rows with the
header `train` writes). Both tools are checked to read all N runs, then timed alternately (ours, reference,
ours, ...) as whole processes; medians and their ratio are printed and, with --record, appended to
bench/RESULTS.md.

Usage (from the repo root):
    cargo build --release
    python3 -m venv .venv-bench && .venv-bench/bin/pip install pandas pyyaml tabulate matplotlib
    .venv-bench/bin/python bench/logbook_bench.py --runs 200 --rounds 5 --record
"""
import argparse
import datetime
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import matplotlib
import pandas

from results import record, machine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
SHORT = [
    "experiment=quickstart", "trainer.max_epochs=2", "data.train_size=128", "data.val_size=64",
    "model.channels=[8,16]", "data.num_workers=0", "logger=many", "logger.console.plain=true",
]
JOBS_PER_SWEEP = 10


def run(cmd, cwd):
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    return time.perf_counter() - start, out.stdout


def only_dir(path):
    (entry,) = os.listdir(path)
    return os.path.join(path, entry)


def make_templates(binary, project):
    """One real single run and one real one-job sweep, made by `train`."""
    for sub in ("conf", "experiments"):
        shutil.copytree(os.path.join(ROOT, sub), os.path.join(project, sub))
    run([binary, *SHORT], project)
    run([binary, "-m", *SHORT, "seed=1"], project)
    single = only_dir(os.path.join(project, "logs", "quickstart", "runs"))
    sweep = only_dir(os.path.join(project, "logs", "quickstart", "multiruns"))
    return single, sweep


def metrics_csv(header, epochs, rng):
    """A plausible metrics.csv: 5 step rows and an epoch row (with validation) per epoch."""
    cols = header.split(",")
    lines = [header]
    step, loss, acc = 0, 2.3, 0.1
    for epoch in range(epochs):
        for _ in range(5):
            step += 20
            loss *= 0.97 + 0.02 * rng.random()
            row = {"epoch": epoch, "step": step, "lr": 0.01, "train/loss": loss, "train/acc1": acc}
            lines.append(",".join(str(row.get(c, "")) for c in cols))
        acc = min(0.99, acc + 0.8 / epochs * rng.random() * 2)
        row = {
            "epoch": epoch, "step": step, "lr": 0.01, "train/loss": loss, "train/acc1": acc, "val/loss": loss * 1.1,
            "val/acc1": acc * 0.95, "val/acc5": min(1.0, acc * 1.3), "epoch_time_s": 12.5 + rng.random(),
            "samples_per_s": 800 + 100 * rng.random(), "device/cpu_percent_mean": 180.0,
            "device/cpu_percent_max": 199.0, "device/rss_bytes_mean": 3e8, "device/rss_bytes_max": 3.2e8,
        }
        lines.append(",".join(str(row.get(c, "")) for c in cols))
    return "\n".join(lines) + "\n", acc


def clone(template, dest, task, overrides, epochs, rng, batch_size=None):
    shutil.copytree(template, dest, ignore=shutil.ignore_patterns("checkpoints"))
    resolved = os.path.join(dest, ".hydra", "resolved.yaml")
    text = open(resolved).read()
    open(resolved, "w").write(re.sub(r"(?m)^task_name: .*$", f"task_name: {task}", text))
    with open(os.path.join(dest, ".hydra", "overrides.yaml"), "w") as f:
        f.write("".join(f"- {o}\n" for o in overrides))
    path = os.path.join(dest, "metrics.csv")
    header = open(path).readline().strip()
    csv, acc = metrics_csv(header, epochs, rng)
    open(path, "w").write(csv)
    summary = json.load(open(os.path.join(dest, "summary.json")))
    summary.update(
        task_name=task, epochs_completed=epochs, global_step=epochs * 100,
        wall_time_s=epochs * 13.0 * (0.9 + 0.2 * rng.random()), train_samples_per_s=700 + 200 * rng.random(),
        best_checkpoint=os.path.join(dest, "checkpoints", "epoch_000.safetensors"),
        last_checkpoint=os.path.join(dest, "checkpoints", "last.safetensors"),
    )
    if batch_size is not None:
        summary.update(batch_size=batch_size, global_batch_size=batch_size)
    summary["final_metrics"].update({"val/acc1": acc * 0.95, "val/acc5": min(1.0, acc * 1.3)})
    json.dump(summary, open(os.path.join(dest, "summary.json"), "w"), indent=2)


def make_logs(single, sweep, logs, n, epochs, seed):
    """N runs over 4 experiments: two of single runs, two of sweeps of JOBS_PER_SWEEP jobs each."""
    rng = random.Random(seed)
    sweep_job = os.path.join(sweep, "0")
    counters = {}
    for i in range(n):
        kind = i % 4
        task = f"exp{kind}"
        k = counters.setdefault(task, 0)
        counters[task] = k + 1
        lr = [0.1, 0.03, 0.01, 0.003, 0.001][k % 5]
        if kind < 2:
            dest = os.path.join(logs, task, "runs", f"2026-01-01_00-00-{k:04d}")
            clone(single, dest, task, [*SHORT, f"optimizer.lr={lr}"], epochs, rng)
        else:
            sweep_dir = os.path.join(logs, task, "multiruns", f"2026-01-01_00-{k // JOBS_PER_SWEEP:04d}")
            job = k % JOBS_PER_SWEEP
            if job == 0:
                # The sweep's plan: as many jobs as this sweep will get (the last one may be short).
                jobs = min(JOBS_PER_SWEEP, len(range(kind, n, 4)) - k)
                os.makedirs(sweep_dir)
                shutil.copy(os.path.join(sweep, "multirun.yaml"), sweep_dir)
                plan = json.load(open(os.path.join(sweep, "sweep.json")))
                template_job = plan["jobs"][0]
                plan["task_name"] = task
                plan["jobs"] = [
                    dict(template_job, num=j, overrides=[*SHORT, f"data.batch_size={16 * (j + 1)}"])
                    for j in range(jobs)
                ]
                json.dump(plan, open(os.path.join(sweep_dir, "sweep.json"), "w"), indent=2)
            batch = 16 * (job + 1)
            clone(sweep_job, os.path.join(sweep_dir, str(job)), task, [*SHORT, f"data.batch_size={batch}"],
                  epochs, rng, batch_size=batch)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200, help="run directories to generate")
    ap.add_argument("--epochs", type=int, default=30, help="epochs in each generated metrics.csv")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--binary", default=os.path.join(TARGET, "release", "train"))
    ap.add_argument("--no-plots", action="store_true", help="the reference writes markdown only (ours still plots)")
    ap.add_argument("--record", action="store_true", help="append the result to bench/RESULTS.md")
    args = ap.parse_args()
    if not os.path.exists(args.binary):
        sys.exit(f"{args.binary} not found: run `cargo build --release` first (or pass --binary)")
    with tempfile.TemporaryDirectory() as tmp:
        single, sweep = make_templates(args.binary, os.path.join(tmp, "project"))
        logs = os.path.join(tmp, "logs")
        make_logs(single, sweep, logs, args.runs, args.epochs, seed=0)
        ours_out, ref_out = os.path.join(tmp, "ours", "logbook.md"), os.path.join(tmp, "ref", "logbook.md")
        os.makedirs(os.path.dirname(ref_out))
        ours_cmd = [args.binary, "logbook", logs, "-o", ours_out]
        ref_cmd = [sys.executable, os.path.join(ROOT, "bench", "logbook_reference.py"), logs, "-o", ref_out]
        if args.no_plots:
            ref_cmd.append("--no-plots")
        # Warm the page cache and check both read every run.
        for cmd in (ours_cmd, ref_cmd):
            out = run(cmd, tmp)[1]
            if f"({args.runs} run(s)" not in out:
                sys.exit(f"{' '.join(cmd)} did not read {args.runs} runs: {out}")
        ours, ref = [], []
        for _ in range(args.rounds):
            ours.append(run(ours_cmd, tmp)[0])
            ref.append(run(ref_cmd, tmp)[0])
    m_ours, m_ref = statistics.median(ours), statistics.median(ref)
    ratio = m_ref / m_ours
    reference = (
        f"pandas {pandas.__version__} script, markdown only (bench/logbook_reference.py --no-plots)"
        if args.no_plots
        else f"pandas {pandas.__version__} + matplotlib {matplotlib.__version__} script (bench/logbook_reference.py)"
    )
    print(f"train logbook : median {m_ours * 1000:.1f} ms over {args.rounds} rounds")
    print(f"{reference} : median {m_ref * 1000:.1f} ms over {args.rounds} rounds")
    print(f"speed-up      : {ratio:.1f}x")
    if args.record:
        record(
            "Logbook (issue: logbook)",
            f"| {datetime.date.today()} | logbook of {args.runs} run directories ({args.epochs}-epoch metrics.csv, "
            f"4 experiments, 2 of them sweeps): markdown tables + SVG curves and throughput charts, whole process "
            f"| {m_ours * 1000:.0f} ms | {reference}: {m_ref * 1000:.0f} ms | **{ratio:.1f}x** "
            f"| {machine()} "
            f"| `.venv-bench/bin/python bench/logbook_bench.py --runs {args.runs} --epochs {args.epochs} "
            f"--rounds {args.rounds}{' --no-plots' if args.no_plots else ''} --record` |",
        )


if __name__ == "__main__":
    main()
