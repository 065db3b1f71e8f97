#!/usr/bin/env python3
"""Writes the fuzzers' seed corpus (fuzz/corpus/<target>/) from the conformance trees and cases hydra-core
checked (tests/conformance/): small YAML files, the cases' overrides, the files with interpolations, and a
few conf trees in the `defaults` target's format (train.yaml, model/a.yaml, model/b.yaml, data/x.yaml and
the overrides, separated by NUL bytes). Deterministic: the same files every run.

    python3 fuzz/seeds.py
"""
import hashlib
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONF = os.path.join(ROOT, "tests", "conformance")
OUT = os.path.join(ROOT, "fuzz", "corpus")


def write(target, data):
    os.makedirs(os.path.join(OUT, target), exist_ok=True)
    name = hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(OUT, target, name), "wb") as f:
        f.write(data)


def yaml_files():
    found = []
    for base, _, files in os.walk(os.path.join(CONF, "trees")):
        for f in sorted(files):
            if f.endswith(".yaml"):
                path = os.path.join(base, f)
                data = open(path, "rb").read()
                if len(data) <= 600:
                    found.append(data)
    return sorted(set(found))


def main():
    files = yaml_files()
    for data in files[::4][:60]:
        write("yaml", data)
    for data in [d for d in files if b"${" in d][:40]:
        write("interpolation", data)
    write("interpolation", b"a: 1\nb: ${a}\nc: x_${b}_${oc.env:HOME}\nd: {e: ${..a}, f: ${.e}}\n"
                           b"g: ${oc.select:missing,7}\nh: ${oc.decode:'[1, {x: 2}]'}\ni: '${now:%Y}'\n")
    write("interpolation", b"a: ${b}\nb: ${a}\n")
    cases = []
    for line in open(os.path.join(CONF, "cases.yaml")):
        line = line.strip()
        if line.startswith("- {"):
            cases.append(json.loads(line[2:]))
    seen = set()
    for case in cases:
        text = "\n".join(case.get("overrides", []))
        if text and text not in seen and len(seen) < 120:
            seen.add(text)
            write("overrides", text.encode())
    trees = [
        ("defaults:\n  - model: a\n  - data: x\n  - _self_\nlr: 0.1\nname: ${model.name}\n",
         "name: a\nwidth: 4\n", "name: b\nwidth: ${lr}\n", "# @package _global_\nbatch: 8\n",
         "model=b\n+extra=1"),
        ("defaults:\n  - _self_\n  - model: a\n  - optional data: x\n", "name: a\n", "defaults:\n  - /data: x\nname: b\n",
         "size: 3\n", "~data\nmodel.name=c"),
        ("defaults:\n  - model@net: a\n  - override model: b\n", "x: 1\n", "x: 2\n", "", ""),
        ("defaults:\n  - model: [a, b]\n", "a: 1\n", "b: 2\n", "", "hydra.job.chdir=false"),
        ("defaults:\n  - data: ???\n", "", "", "k: v\n", "data=x"),
        ("hydra:\n  searchpath: [pkg://trainyard.conf]\ndefaults:\n  - model: a\n", "n: 1\n", "", "", "model=b"),
    ]
    for tree in trees:
        write("defaults", "\0".join(tree).encode())
    for target in sorted(os.listdir(OUT)):
        print(target, len(os.listdir(os.path.join(OUT, target))))


if __name__ == "__main__":
    main()
