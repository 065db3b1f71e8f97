"""Append a row to a section of bench/RESULTS.md (created with its table header when missing)."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = os.path.join(ROOT, "bench", "RESULTS.md")
HEADER = "| date | what | trainyard | reference | ratio | machine | command |\n|---|---|---|---|---|---|---|\n"


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
