#!/usr/bin/env python3
"""Whole-process composition benchmark: `train --cfg job ... --resolve` vs a Hydra 1.3 app doing the same.

Both print the composed, resolved job config from the same YAML tree, Hydra's own config groups included
(`hydra/config`, its logging, launcher and sweeper groups; hydra-colorlog's for the template). Two trees:
`--tree trainyard` (default): `experiment=cifar trainer.num_nodes=2` on conf/ plus experiments/ (copied in as
the `experiment` group for Hydra); `--tree template`: lightning-hydra-template's configs (the conformance copy
in tests/conformance/trees/lht) with `experiment=example trainer=ddp debug=fdr logger=csv`. Runs alternate (train, hydra, train,
...) on the same machine so drift hits both alike. Prints medians and the ratio, and with --record appends a
row to bench/RESULTS.md.

Usage (from the repo root; needs hydra-core 1.3.2 in the Python you name):
    cargo build --release
    python3 -m venv .venv-oracle && .venv-oracle/bin/pip install hydra-core==1.3.2
    .venv-oracle/bin/pip install hydra-colorlog   # the template's hydra/default.yaml names colorlog
    .venv-oracle/bin/python bench/compose_bench.py --runs 30 --record
    .venv-oracle/bin/python bench/compose_bench.py --tree template --runs 30 --record
"""
import argparse
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import machine  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OVERRIDES = ["experiment=cifar", "trainer.num_nodes=2"]
TEMPLATE_OVERRIDES = ["experiment=example", "trainer=ddp", "debug=fdr", "logger=csv"]
TEMPLATE_TREE = os.path.join(ROOT, "tests", "conformance", "trees", "lht")

HYDRA_APP = """
import hydra
from omegaconf import DictConfig

@hydra.main(version_base="1.3", config_path=None, config_name="train")
def main(cfg: DictConfig) -> None:
    pass

if __name__ == "__main__":
    main()
"""


def build_hydra_tree(tmp: str) -> str:
    tree = os.path.join(tmp, "conf")
    shutil.copytree(os.path.join(ROOT, "conf"), tree)
    shutil.copytree(os.path.join(ROOT, "experiments"), os.path.join(tree, "experiment"))
    return tree


def timed(cmd, cwd, env):
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit(f"command failed: {' '.join(cmd)}\n{out.stderr}")
    return elapsed, out.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "train"))
    ap.add_argument("--record", action="store_true", help="append the result to bench/RESULTS.md")
    ap.add_argument("--tree", choices=["trainyard", "template"], default="trainyard")
    args = ap.parse_args()
    if not os.path.exists(args.binary):
        sys.exit(f"{args.binary} not found: run `cargo build --release` first")
    if args.tree == "template":
        return template_bench(args)

    with tempfile.TemporaryDirectory() as tmp:
        tree = build_hydra_tree(tmp)
        app = os.path.join(tmp, "hydra_app.py")
        with open(app, "w") as f:
            f.write(HYDRA_APP)
        env = dict(os.environ, PROJECT_ROOT=ROOT, HYDRA_FULL_ERROR="1")
        ours_cmd = [args.binary, "--cfg", "job", "--resolve", *OVERRIDES]
        hydra_cmd = [sys.executable, app, "--config-path", tree, "--cfg", "job", "--resolve", *OVERRIDES]
        # Warm the page cache, check both succeed and print the same config (run-time paths aside).
        ours_cfg = yaml.safe_load(timed(ours_cmd, ROOT, env)[1])
        hydra_cfg = yaml.safe_load(timed(hydra_cmd, tmp, env)[1])
        for cfg in (ours_cfg, hydra_cfg):
            cfg["paths"].pop("output_dir", None)
            cfg["paths"].pop("root_dir", None)
            cfg["paths"].pop("data_dir", None)
            cfg["paths"].pop("log_dir", None)
            cfg["callbacks"]["model_checkpoint"].pop("dirpath", None)
            cfg["data"].pop("root", None)
            cfg["model"].pop("pretrained", None)
        if ours_cfg != hydra_cfg:
            sys.exit(f"the two tools composed different configs:\nours:  {ours_cfg}\nhydra: {hydra_cfg}")
        ours, theirs = [], []
        for _ in range(args.runs):
            ours.append(timed(ours_cmd, ROOT, env)[0])
            theirs.append(timed(hydra_cmd, tmp, env)[0])
    report(args, ours, theirs, OVERRIDES)


def template_bench(args) -> None:
    """lightning-hydra-template's own tree, composed by both tools as it is (no copies needed)."""
    env = dict(os.environ, PROJECT_ROOT=TEMPLATE_TREE, HYDRA_FULL_ERROR="1")
    with tempfile.TemporaryDirectory() as tmp:
        app = os.path.join(tmp, "hydra_app.py")
        with open(app, "w") as f:
            f.write(HYDRA_APP)
        ours_cmd = [args.binary, "-cp", TEMPLATE_TREE, "-cn", "train", "--cfg", "job", "--resolve",
                    *TEMPLATE_OVERRIDES]
        hydra_cmd = [sys.executable, app, "--config-path", TEMPLATE_TREE, "--cfg", "job", "--resolve",
                     *TEMPLATE_OVERRIDES]
        ours_cfg = yaml.safe_load(timed(ours_cmd, tmp, env)[1])
        hydra_cfg = yaml.safe_load(timed(hydra_cmd, tmp, env)[1])
        for cfg in (ours_cfg, hydra_cfg):  # run-time paths differ by design (run directory, cwd)
            for key in ("output_dir", "work_dir"):
                cfg["paths"].pop(key, None)
            cfg["trainer"].pop("default_root_dir", None)
        if ours_cfg != hydra_cfg:
            sys.exit(f"the two tools composed different configs:\nours:  {ours_cfg}\nhydra: {hydra_cfg}")
        ours, theirs = [], []
        for _ in range(args.runs):
            ours.append(timed(ours_cmd, tmp, env)[0])
            theirs.append(timed(hydra_cmd, tmp, env)[0])
    report(args, ours, theirs, TEMPLATE_OVERRIDES, "lightning-hydra-template configs, ", "--tree template ")


def report(args, ours, theirs, overrides, what="", flag="") -> None:
    m_ours, m_theirs = statistics.median(ours), statistics.median(theirs)
    ratio = m_theirs / m_ours
    print(f"train --cfg job --resolve : median {m_ours * 1000:.2f} ms over {args.runs} runs")
    print(f"hydra-core app (python)   : median {m_theirs * 1000:.2f} ms over {args.runs} runs")
    print(f"speed-up                  : {ratio:.1f}x")
    if args.record:
        row = (
            f"| {datetime.date.today()} | compose {what}`{' '.join(overrides)} --cfg job --resolve`, whole process, "
            f"Hydra's own groups composed | {m_ours * 1000:.2f} ms | hydra-core 1.3.2 app: {m_theirs * 1000:.1f} ms "
            f"| **{ratio:.0f}x** | {machine()} "
            f"| `.venv-oracle/bin/python bench/compose_bench.py {flag}--runs {args.runs} --record` |\n"
        )
        path = os.path.join(ROOT, "bench", "RESULTS.md")
        with open(path, "a") as f:
            f.write(row)
        print(f"recorded in {path}")


if __name__ == "__main__":
    main()
