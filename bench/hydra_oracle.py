#!/usr/bin/env python3
"""Hydra 1.3 oracle for the conformance suite.

For every case in tests/conformance/cases.yaml, compose the named config tree with hydra-core 1.3.2 and write
what Hydra produced to tests/conformance/expected/<name>.json: the composed config (unresolved and resolved),
the chosen option of every group, the jobs a multirun launches, or the error Hydra raised. The Rust test
tests/conformance.rs checks trainyard against these files.

Regenerate (from the repo root):
    python3 -m venv .venv-oracle && .venv-oracle/bin/pip install hydra-core==1.3.2
    .venv-oracle/bin/python bench/hydra_oracle.py
"""
import json
import math
import os
import sys

import yaml
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import setup_globals
from omegaconf import OmegaConf, open_dict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONF = os.path.join(ROOT, "tests", "conformance")


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


def compose_case(case, tree):
    with initialize_config_dir(config_dir=tree, version_base="1.3"):
        try:
            cfg = compose(case["config_name"], overrides=case["overrides"], return_hydra_config=True)
        except Exception as exc:  # noqa: BLE001 - every failure is an expected result
            return error(exc)
        choices = {k: v for k, v in OmegaConf.to_container(cfg.hydra.runtime.choices).items() if not k.startswith("hydra/")}
        with open_dict(cfg):
            del cfg["hydra"]
        out = {"config": jsonable(OmegaConf.to_container(cfg, resolve=False)), "choices": choices}
        try:
            out["resolved"] = jsonable(OmegaConf.to_container(cfg, resolve=True))
            out["resolve_error"] = None
        except Exception as exc:  # noqa: BLE001
            out["resolved"] = None
            out["resolve_error"] = str(exc)
        return out


def multirun_case(case, tree):
    """The jobs BasicSweeper launches: sweeper params from the master config first, then the overrides."""
    with initialize_config_dir(config_dir=tree, version_base="1.3"):
        gh = GlobalHydra.instance()
        loader = gh.config_loader()
        try:
            from hydra.types import RunMode

            master = loader.load_configuration(case["config_name"], case["overrides"], run_mode=RunMode.MULTIRUN)
            params = [f"{k}={v}" for k, v in (master.hydra.sweeper.params or {}).items()]
            parser = OverridesParser.create(config_loader=loader)
            overrides = parser.parse_overrides(params + case["overrides"])
            batches = BasicSweeper.split_arguments(overrides, None)
            return {"jobs": [list(job) for batch in batches for job in batch]}
        except Exception as exc:  # noqa: BLE001
            return error(exc)


def main():
    setup_globals()
    with open(os.path.join(CONF, "cases.yaml")) as f:
        cases = yaml.safe_load(f)
    out_dir = os.path.join(CONF, "expected")
    os.makedirs(out_dir, exist_ok=True)
    for old in os.listdir(out_dir):
        if old.endswith(".json"):
            os.remove(os.path.join(out_dir, old))
    for case in sorted(cases, key=lambda c: c["name"]):
        tree = os.path.join(CONF, "trees", case["tree"])
        saved = dict(os.environ)
        os.environ.update(case.get("env", {}))
        try:
            expect = multirun_case(case, tree) if case["mode"] == "multirun" else compose_case(case, tree)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        record = dict(case, expect=expect)
        with open(os.path.join(out_dir, case["name"] + ".json"), "w") as f:
            json.dump(record, f, indent=1, sort_keys=False)
            f.write("\n")
    print(f"wrote {len(cases)} cases to {os.path.relpath(out_dir, ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
