"""Append a row to a section of bench/RESULTS.md (created with its table header when missing)."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = os.path.join(ROOT, "bench", "RESULTS.md")
HEADER = "| date | what | trainyard | reference | ratio | machine | command |\n|---|---|---|---|---|---|---|\n"

# `--isa avx2`: both sides held to AVX2 on this CPU, a stand-in for an AVX2 machine when none is had: our
# kernels' AVX2 path, and PyTorch's ATen kernels, oneDNN's convolutions and MKL's products capped at AVX2
# (read when each library starts, so a script re-runs itself with them set: `cap_isa`).
AVX2_ENV = {"TRAINYARD_CONV_ISA": "avx2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
            "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def cap_isa(isa: str) -> None:
    """With `isa == "avx2"`, re-runs this script with both sides capped at AVX2 (no return) unless they are."""
    if isa == "avx2" and any(os.environ.get(k) != v for k, v in AVX2_ENV.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], dict(os.environ, **AVX2_ENV))


def machine(isa: str = "native") -> str:
    """This machine as a results row names it: CPU model, the widest vector ISA it has (or the cap both sides
    ran under), core count."""
    model, flags = "unknown CPU", set()
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    widest = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "sse/neon"
    if isa == "avx2" and widest != "avx2":
        widest = f"avx2 (both sides capped; the CPU has {widest})"
    return f"{model}, {widest}{l1d()}, {os.cpu_count()} cores"


def l1d() -> str:
    """`, 32 KiB L1d per core` from sysfs (the level-1 data cache), or nothing where it cannot be read."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(base)):
            d = os.path.join(base, index)
            if open(os.path.join(d, "level")).read().strip() == "1" and \
                    open(os.path.join(d, "type")).read().strip() == "Data":
                size = open(os.path.join(d, "size")).read().strip().replace("K", " KiB")
                return f", {size} L1d per core"
    except OSError:
        pass
    return ""


def record(section: str, row: str) -> None:
    """Adds `row` to the end of the first table of `section` (the section and table made if missing), so
    rows stay in their table when prose follows it."""
    text = open(PATH).read() if os.path.exists(PATH) else "# Benchmark results\n"
    title = f"## {section}\n"
    if title not in text:
        text = text.rstrip("\n") + f"\n\n{title}\n{HEADER}"
    start = text.index(title)
    nxt = text.find("\n## ", start + len(title))
    end = len(text) if nxt == -1 else nxt + 1
    lines = text[start:end].rstrip("\n").split("\n")
    first = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if first is None:
        lines += ["", *HEADER.rstrip("\n").split("\n")]
        first = len(lines) - 2
    last = first
    while last + 1 < len(lines) and lines[last + 1].startswith("|"):
        last += 1
    lines.insert(last + 1, row.rstrip("\n"))
    body = "\n".join(lines) + "\n"
    if nxt != -1:
        body += "\n"
    tmp = PATH + ".tmp"
    with open(tmp, "w") as f:
        f.write(text[:start] + body + text[end:])
    os.replace(tmp, PATH)
    print(f"recorded in {PATH}: {row.strip()}")
