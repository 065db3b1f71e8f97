#!/usr/bin/env python3
"""Run, in a feature build, only the tests that build adds.

CI's default `cargo test` runs every test the default features compile. The `--features s3,torch` pass
used to run its targets whole, so each default test in them ran twice (the SLURM cluster's 200 s among
them). A test's code does not change with the features unless its name does: feature-gated cases are
separate functions or rstest cases (`#[cfg(feature = ...)]`, `#[cfg_attr(feature = ..., case(...))]`), and
a test whose expectation depends on the build is written as two functions. So the feature pass runs, per
test target, the names the default build's target lacks.

    feature_tests.py list OUT.json [cargo test args...]   # after the default `cargo test`
    feature_tests.py run  OUT.json [cargo test args...]   # the feature pass: build, then the added tests
"""
import json
import re
import subprocess
import sys
from pathlib import Path


def executables(cargo_args):
    """{target key: (executable, cargo selector)} of the test binaries `cargo test <args>` builds."""
    out = subprocess.run(
        ["cargo", "test", "--no-run", "--message-format=json", *cargo_args],
        stdout=subprocess.PIPE,
        check=True,
        text=True,
    ).stdout
    found = {}
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue
        target = msg["target"]
        kind = target["kind"][0]
        if kind in ("lib", "rlib"):
            found["lib"] = (msg["executable"], ["--lib"])
        elif kind == "test":
            found[f"test:{target['name']}"] = (msg["executable"], ["--test", target["name"]])
    return found


def test_names(executable):
    """The tests a libtest binary holds (`--list --format terse`: `name: test` lines)."""
    out = subprocess.run(
        [executable, "--list", "--format", "terse"], stdout=subprocess.PIPE, check=True, text=True
    ).stdout
    return sorted(line[: -len(": test")] for line in out.splitlines() if line.endswith(": test"))


def same_test(name):
    """A named rstest case without its index: `f::case_3_ddp` is `f::case_ddp`, so a case the features
    add before it (`#[cfg_attr(feature = ..., case::tch(...))]`) does not make a default case look new.
    Unnamed cases (`case_3`) keep their index."""
    return re.sub(r"::case_\d+_(\w+)$", r"::case_\1", name)


def list_tests(path, cargo_args):
    names = {key: test_names(exe) for key, (exe, _) in executables(cargo_args).items()}
    Path(path).write_text(json.dumps(names, indent=1))
    print(f"feature_tests: {sum(map(len, names.values()))} tests in {len(names)} default targets")


def without_selectors(cargo_args):
    """The build's arguments less its target selectors (`--lib`, `--test NAME`), for one target's run."""
    kept, skip = [], False
    for arg in cargo_args:
        if skip:
            skip = False
        elif arg == "--test":
            skip = True
        elif arg != "--lib":
            kept.append(arg)
    return kept


def run_added(path, cargo_args):
    default = json.loads(Path(path).read_text())
    common = without_selectors(cargo_args)
    added, failed = 0, []
    for key, (exe, selector) in sorted(executables(cargo_args).items()):
        known = {same_test(n) for n in default.get(key, [])}
        names = [n for n in test_names(exe) if same_test(n) not in known]
        if not names:
            continue
        added += len(names)
        print(f"== {key}: {len(names)} tests the features add", flush=True)
        # Each name exactly: libtest takes several filters, and --exact keeps `a` from matching `a_b`.
        cmd = ["cargo", "test", *common, *selector, "--", "--exact", *names]
        if subprocess.run(cmd).returncode != 0:
            failed.append(key)
    print(f"feature_tests: {added} tests the features add, run")
    if failed:
        sys.exit(f"feature_tests: failures in {', '.join(failed)}")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("list", "run"):
        sys.exit(__doc__)
    (list_tests if sys.argv[1] == "list" else run_added)(sys.argv[2], sys.argv[3:])
