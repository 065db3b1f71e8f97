"""Append a row to a section of bench/RESULTS.md (created with its table header when missing)."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = os.path.join(ROOT, "bench", "RESULTS.md")
HEADER = "| date | what | trainyard | reference | ratio | machine | command |\n|---|---|---|---|---|---|---|\n"


def machine() -> str:
    """This machine as a results row names it: CPU model, the widest vector ISA it has, core count."""
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
    isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "sse/neon"
    return f"{model}, {isa}, {os.cpu_count()} cores"


def record(section: str, row: str) -> None:
    text = open(PATH).read() if os.path.exists(PATH) else "# Benchmark results\n"
    title = f"## {section}\n"
    if title not in text:
        text = text.rstrip("\n") + f"\n\n{title}\n{HEADER}"
    start = text.index(title)
    nxt = text.find("\n## ", start + len(title))
    end = len(text) if nxt == -1 else nxt + 1
    body = text[start:end].rstrip("\n") + "\n" + row.rstrip("\n") + "\n"
    if nxt != -1:
        body += "\n"
    tmp = PATH + ".tmp"
    with open(tmp, "w") as f:
        f.write(text[:start] + body + text[end:])
    os.replace(tmp, PATH)
    print(f"recorded in {PATH}: {row.strip()}")
