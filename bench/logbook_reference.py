#!/usr/bin/env python3
"""What a user would write instead of `train logbook`: pandas + matplotlib over the same run records.

Reads every run directory under the given paths (a directory holding `.hydra/`): `.hydra/resolved.yaml`,
`.hydra/overrides.yaml`, `summary.json`, `run.json`, `metrics.csv`; writes one markdown page with a table per
experiment (the logbook's columns), the command reproducing each run, SVG loss / top-1 curves and a throughput
chart per experiment, and a section per sweep (swept values, outcome, best). It is the reference side of
bench/logbook_bench.py, kept as plain as such a script usually is.

Usage: python bench/logbook_reference.py LOGS_DIR [-o logbook.md] [--no-plots]
"""
import argparse
import json
import os
import shlex

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402


def find_runs(root):
    for dirpath, dirnames, _ in os.walk(root):
        if ".hydra" in dirnames:
            dirnames.clear()
            yield dirpath
        else:
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def read_run(d):
    with open(os.path.join(d, ".hydra", "resolved.yaml")) as f:
        cfg = yaml.safe_load(f) or {}
    with open(os.path.join(d, ".hydra", "overrides.yaml")) as f:
        overrides = yaml.safe_load(f) or []
    summary = read_json(os.path.join(d, "summary.json")) or {}
    state = read_json(os.path.join(d, "run.json")) or {}
    metrics_path = os.path.join(d, "metrics.csv")
    metrics = pd.read_csv(metrics_path) if os.path.exists(metrics_path) else pd.DataFrame()
    parent = os.path.dirname(d)
    sweep = parent if os.path.exists(os.path.join(parent, "multirun.yaml")) else None
    gpu = (summary.get("device_stats") or {}).get("gpu") or {}
    tb = os.path.join(d, "tensorboard")
    best = lambda col: metrics[col].max() if col in metrics else summary.get("final_metrics", {}).get(col)  # noqa: E731
    fm = summary.get("final_metrics", {})
    status = summary.get("status") or ("FAILED" if state.get("state") == "failed" else state.get("state", "unknown"))
    return {
        "dir": d,
        "label": f"{os.path.basename(sweep)}#{os.path.basename(d)}" if sweep else os.path.basename(d),
        "sweep": sweep,
        "job": os.path.basename(d),
        "task": cfg.get("task_name", "unnamed"),
        "status": status,
        "model": cfg.get("model", {}).get("name"),
        "data": cfg.get("data", {}).get("name"),
        "backend": cfg.get("backend"),
        "strategy": cfg.get("trainer", {}).get("strategy"),
        "nodes×devices": f"{summary.get('num_nodes', '–')}×{summary.get('devices', '–')}",
        "precision": summary.get("precision"),
        "global batch": summary.get("global_batch_size", cfg.get("data", {}).get("batch_size")),
        "epochs": summary.get("epochs_completed"),
        "best val top-1": best("val/acc1"),
        "best val top-5": best("val/acc5"),
        "val top-1": fm.get("val/acc1"),
        "val top-5": fm.get("val/acc5"),
        "val loss": fm.get("val/loss"),
        "train loss": fm.get("train/loss"),
        "wall time s": summary.get("wall_time_s"),
        "throughput": summary.get("train_samples_per_s"),
        "peak GPU mem": gpu.get("memory_used_bytes_peak"),
        "mean GPU mem": gpu.get("memory_used_bytes_mean"),
        "mean GPU util": gpu.get("utilization_percent_mean"),
        "max batch size": (summary.get("batch_size_finder") or {}).get("found"),
        "peak RSS": summary.get("peak_rss_bytes"),
        "train state per rank": max(
            (sum(row.values()) for row in summary.get("state_bytes_per_rank") or []), default=None
        ),
        "checkpoint": summary.get("best_checkpoint") or summary.get("last_checkpoint"),
        "TensorBoard": tb if os.path.isdir(tb) else None,
        "overrides": overrides,
        "batch_size": cfg.get("data", {}).get("batch_size"),
        "metrics": metrics,
    }


def mib(b):
    return None if b is None or pd.isna(b) else f"{b / 2**20:.0f} MiB"


def plot_curves(runs, column, title, path):
    fig, ax = plt.subplots(figsize=(7, 4))
    for _, r in runs.iterrows():
        m = r["metrics"]
        if column in m:
            rows = m.dropna(subset=[column])
            ax.plot(rows["step"], rows[column], label=r["label"])
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.legend(fontsize=6)
    fig.savefig(path, format="svg")
    plt.close(fig)


def plot_bars(labels, values, title, path):
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.barh(labels, values)
    ax.set_title(title)
    ax.set_xlabel("images / s")
    fig.savefig(path, format="svg")
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+")
    ap.add_argument("-o", "--output", default="logbook.md")
    ap.add_argument("--no-plots", action="store_true", help="markdown only (the cheap lower bound)")
    args = ap.parse_args()
    if args.no_plots:
        global plot_curves, plot_bars
        plot_curves = plot_bars = lambda *a: None  # noqa: E731
    out_dir = os.path.dirname(os.path.abspath(args.output))
    stem = os.path.splitext(os.path.basename(args.output))[0]
    runs = pd.DataFrame([read_run(d) for p in args.paths for d in sorted(find_runs(p))])
    md = [f"# Logbook\n\n{len(runs)} run(s).\n"]
    columns = [
        "run", "status", "model", "data", "backend", "strategy", "nodes×devices", "precision", "global batch",
        "epochs", "best val top-1", "best val top-5", "val top-1", "val top-5", "val loss", "train loss",
        "wall time", "throughput", "speed-up vs single", "peak GPU mem", "mean GPU mem", "mean GPU util",
        "max batch size", "peak RSS", "train state per rank", "checkpoint", "TensorBoard",
    ]
    for task, group in runs.groupby("task", sort=True):
        table = group.copy()
        table["run"] = [f"[{r.label}]({os.path.relpath(r.dir, out_dir)})" for r in group.itertuples()]
        single = group[(group["strategy"] == "single") & (group["nodes×devices"] == "1×1")]
        base = {b: t for b, t in zip(single["batch_size"], single["throughput"])}
        table["speed-up vs single"] = [
            f"{r.throughput / base[r.batch_size]:.2f}x" if r.batch_size in base and r.throughput else None
            for r in group.itertuples()
        ]
        table["wall time"] = group["wall time s"].map(lambda s: None if pd.isna(s) else f"{s:.1f} s")
        table["throughput"] = group["throughput"].map(lambda t: None if pd.isna(t) else f"{t:.1f} img/s")
        for col in ["peak GPU mem", "mean GPU mem", "peak RSS", "train state per rank"]:
            table[col] = group[col].map(mib)
        md.append(f"## Experiment `{task}`\n")
        md.append(table[columns].to_markdown(index=False, floatfmt=".4f", missingval="–") + "\n")
        md.append("Reproduce:\n\n```sh")
        md += [f"train {' '.join(shlex.quote(o) for o in r.overrides)}   # {r.label}" for r in group.itertuples()]
        md.append("```\n")
        for column, what in [("train/loss", "loss"), ("val/acc1", "top1")]:
            name = f"{stem}-{task}-{what}.svg"
            plot_curves(group, column, f"{task}: {column}", os.path.join(out_dir, name))
            md.append(f"![{task}: {column}]({name})\n")
        name = f"{stem}-{task}-throughput.svg"
        plot_bars(list(group["label"]), list(group["throughput"].fillna(0)), f"{task}: throughput", os.path.join(out_dir, name))
        md.append(f"![{task}: throughput]({name})\n")
    for sweep, jobs in runs[runs["sweep"].notna()].groupby("sweep", sort=True):
        values = pd.DataFrame([dict(o.split("=", 1) for o in ov if "=" in o) for ov in jobs["overrides"]])
        swept = [c for c in values.columns if values[c].nunique(dropna=False) > 1]
        table = pd.concat([jobs[["job", "status", "throughput", "peak RSS", "val top-1", "val loss"]].reset_index(drop=True),
                           values[swept]], axis=1)
        table["peak RSS"] = table["peak RSS"].map(mib)
        name = os.path.basename(sweep)
        md.append(f"## Sweep {name}\n\n{len(jobs)} job(s), swept: {', '.join(swept)}\n")
        md.append(table.to_markdown(index=False, floatfmt=".4f", missingval="–") + "\n")
        done = jobs.dropna(subset=["val top-1"])
        if len(done):
            best = done.loc[done["val top-1"].idxmax()]
            md.append(f"- Best val top-1: **{best['val top-1']:.4f}**, job {best['job']}\n")
        fig_name = f"{stem}-sweep-{name}-throughput.svg"
        labels = [",".join(str(v) for v in row) for row in values[swept].itertuples(index=False)]
        plot_bars(labels, list(jobs["throughput"].fillna(0)), f"sweep {name}: throughput", os.path.join(out_dir, fig_name))
        md.append(f"![sweep {name}: throughput]({fig_name})\n")
        for column, what in [("train/loss", "loss"), ("val/acc1", "top1")]:
            fig_name = f"{stem}-sweep-{name}-{what}.svg"
            plot_curves(jobs, column, f"sweep {name}: {column}", os.path.join(out_dir, fig_name))
            md.append(f"![sweep {name}: {column}]({fig_name})\n")
    with open(args.output, "w") as f:
        f.write("\n".join(md))
    print(f"Logbook: {args.output} ({len(runs)} run(s))")


if __name__ == "__main__":
    main()
