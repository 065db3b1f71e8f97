#!/usr/bin/env python3
"""Hydra 1.3 oracle for the conformance suite.

For every case in tests/conformance/cases.yaml, compose the named config tree with hydra-core 1.3.2 and write
what Hydra produced to tests/conformance/expected/<name>.json. The Rust test tests/conformance.rs checks
trainyard against these files. The fields of `expect` are described in tests/conformance/README.md.

Regenerate (from the repo root; the versions are the ones the committed expectations were made with):
    python3 -m venv .venv-oracle
    .venv-oracle/bin/pip install hydra-core==1.3.2 omegaconf==2.3.1 hydra-colorlog==1.2.0 \
        hydra-optuna-sweeper==1.3.0 pyyaml
    .venv-oracle/bin/python bench/hydra_oracle.py            # every case
    .venv-oracle/bin/python bench/hydra_oracle.py lht_ ...   # only cases whose name starts with one of these

The oracle runs with the repository root as its working directory, so a relative `file://` search path in a
case (`hydra.searchpath=[file://tests/conformance/trees/...]`) means the same thing here and under `cargo test`.
"""
import copy
import json
import math
import os
import sys
import warnings

import yaml
from hydra import initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import setup_globals
from hydra.types import RunMode
from omegaconf import OmegaConf, open_dict, read_write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONF = os.path.join(ROOT, "tests", "conformance")

# What `${hydra:runtime.output_dir}` and `${hydra:runtime.cwd}` resolve to in `resolved`. Hydra computes the
# first when a job starts (compose leaves it missing) and takes the second from the process; both are pinned so
# the expectations do not depend on where or when the oracle ran. The Rust side resolves with the same values.
PINNED = {"output_dir": "/pinned/output", "cwd": "/pinned/cwd"}
# Volatile or machine-dependent parts of the `hydra` node, left out of `expect.hydra`.
VOLATILE_RUNTIME = ("version", "cwd", "config_sources", "output_dir")
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def jsonable(value):
    """Containers to JSON; inf/nan as {"$float": ...} since JSON has no such numbers."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return {"$float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    return value


def error(exc):
    return {"error": str(exc), "error_type": type(exc).__name__}


def hydra_node(cfg):
    """The composed `hydra` node, unresolved, without the volatile runtime values."""
    node = OmegaConf.to_container(cfg.hydra, resolve=False, enum_to_str=True)
    for key in VOLATILE_RUNTIME:
        node.get("runtime", {}).pop(key, None)
    return jsonable(node)


def choices_of(cfg):
    return OmegaConf.to_container(cfg.hydra.runtime.choices)


def job_part(cfg):
    job = copy.deepcopy(cfg)
    with open_dict(job):
        del job["hydra"]
    return job


def cfg_job_resolve(cfg):
    """What `--cfg job --resolve` prints: Hydra installs the hydra node as composed (runtime.cwd is the process's,
    pinned here; runtime.output_dir is still missing, it is only set when a job runs) and resolves the job."""
    full = copy.deepcopy(cfg)
    with read_write(full.hydra.runtime):
        full.hydra.runtime.cwd = PINNED["cwd"]
    HydraConfig.instance().set_config(full)
    job = job_part(full)
    try:
        OmegaConf.resolve(job)
        return {"cfg_job_resolve": OmegaConf.to_yaml(job)}
    except Exception as exc:  # noqa: BLE001
        return {"cfg_job_resolve": None, "cfg_job_resolve_error": str(exc)}


def compose_case(case, tree):
    run_mode = RunMode.MULTIRUN if case.get("run_mode") == "multirun" else RunMode.RUN
    with initialize_config_dir(config_dir=tree, version_base="1.3"):
        gh = GlobalHydra.instance()
        try:
            # What hydra.compose() does, with the run mode of the case.
            cfg = gh.hydra.compose_config(
                config_name=case["config_name"],
                overrides=case["overrides"],
                run_mode=run_mode,
                from_shell=False,
                with_log_configuration=False,
            )
        except Exception as exc:  # noqa: BLE001 - every failure is an expected result
            return error(exc)
        all_choices = choices_of(cfg)
        choices = {k: v for k, v in all_choices.items() if not k.startswith("hydra/")}
        job = job_part(cfg)
        out = {
            "config": jsonable(OmegaConf.to_container(job, resolve=False)),
            "choices": choices,
            "hydra_choices": all_choices,
            "hydra": hydra_node(cfg),
            "cfg_job": OmegaConf.to_yaml(job),
        }
        out.update(cfg_job_resolve(cfg))
        # `resolved`: the job config resolved with the hydra node installed and output_dir/cwd pinned.
        with read_write(cfg.hydra.runtime):
            cfg.hydra.runtime.output_dir = PINNED["output_dir"]
            cfg.hydra.runtime.cwd = PINNED["cwd"]
        # As in hydra.core.utils.run_job: the hydra node is installed from the full config and the job resolves a
        # copy without it, so an interpolation inside the hydra node (sweep.subdir: ${hydra.job.num}) still finds
        # the rest of the hydra node.
        HydraConfig.instance().set_config(cfg)
        job = job_part(cfg)
        try:
            out["resolved"] = jsonable(OmegaConf.to_container(job, resolve=True))
            out["resolve_error"] = None
        except Exception as exc:  # noqa: BLE001
            out["resolved"] = None
            out["resolve_error"] = str(exc)
        out["pinned"] = dict(PINNED)
        return out


def multirun_case(case, tree):
    """The jobs BasicSweeper launches, as Hydra.multirun + BasicSweeper.sweep compute them: the sweeper's params
    from the master config first, then the task overrides (hydra.* overrides are not passed to the sweeper)."""
    with initialize_config_dir(config_dir=tree, version_base="1.3"):
        gh = GlobalHydra.instance()
        loader = gh.config_loader()
        try:
            master = loader.load_configuration(
                case["config_name"], case["overrides"], run_mode=RunMode.MULTIRUN, from_shell=False
            )
            sweeper = OmegaConf.to_container(master.hydra.sweeper, resolve=False, enum_to_str=True)
            out = {
                "sweeper": jsonable(sweeper),
                "mode": OmegaConf.to_container(master.hydra, resolve=False, enum_to_str=True)["mode"],
            }
            if sweeper.get("_target_") != BASIC_SWEEPER:
                raise SystemExit(f"case {case['name']}: only BasicSweeper jobs can be computed ({sweeper.get('_target_')})")
            params = [f"{k}={v}" for k, v in (master.hydra.sweeper.params or {}).items()]
            task = list(OmegaConf.to_container(master.hydra.overrides.task, resolve=False))
            parser = OverridesParser.create(config_loader=loader)
            overrides = parser.parse_overrides(params + task)
            batches = BasicSweeper.split_arguments(overrides, master.hydra.sweeper.max_batch_size)
            out["jobs"] = [list(job) for batch in batches for job in batch]
            out["batches"] = [[list(job) for job in batch] for batch in batches]
            return out
        except SystemExit:
            raise
        except Exception as exc:  # noqa: BLE001
            return error(exc)


def main():
    os.chdir(ROOT)
    setup_globals()
    warnings.simplefilter("ignore", UserWarning)
    prefixes = sys.argv[1:]
    with open(os.path.join(CONF, "cases.yaml")) as f:
        cases = yaml.safe_load(f)
    names = [c["name"] for c in cases]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise SystemExit(f"duplicate case names: {dups}")
    out_dir = os.path.join(CONF, "expected")
    os.makedirs(out_dir, exist_ok=True)
    selected = [c for c in cases if not prefixes or c["name"].startswith(tuple(prefixes))]
    for old in os.listdir(out_dir):
        if old.endswith(".json") and (not prefixes or old.startswith(tuple(prefixes))):
            os.remove(os.path.join(out_dir, old))
    for case in sorted(selected, key=lambda c: c["name"]):
        tree = os.path.join(CONF, "trees", case["tree"])
        saved = dict(os.environ)
        os.environ.update(case.get("env", {}))
        try:
            expect = multirun_case(case, tree) if case["mode"] == "multirun" else compose_case(case, tree)
        finally:
            os.environ.clear()
            os.environ.update(saved)
            HydraConfig.instance().cfg = None
        record = dict(case, expect=expect)
        with open(os.path.join(out_dir, case["name"] + ".json"), "w") as f:
            json.dump(record, f, indent=1, sort_keys=False, ensure_ascii=False)
            f.write("\n")
    print(f"wrote {len(selected)} cases to {os.path.relpath(out_dir, ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
