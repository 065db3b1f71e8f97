"""A stalled rank: how long until every process of a two-process DDP job has ended, and whom the job
blames, after one worker is stopped with SIGSTOP (alive, its sockets open, in no collective).

trainyard: `train backend=tch trainer=ddp_sim trainer.collective_timeout_s=T` (its node launcher starts the
two workers). PyTorch: `torchrun --nproc_per_node=2` on a DDP script with `init_process_group("gloo",
timeout=T)`. The same small CNN, batch and thread count on both; rank 1 is stopped once each side has
trained a few steps; alternating rounds.

    .venv-torch-py/bin/python bench/stall_bench.py --train target/debug/train --timeout 10 --rounds 3 --record

Needs torch 2.11 in the interpreter (torchrun beside it) and a `--features torch` build of train.
"""

import argparse
import datetime
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import ROOT, machine, record  # noqa: E402

WORKER = """
import datetime, os, sys, time, torch, torch.distributed as dist, torch.nn as nn
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(sys.argv[1])))
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
for step in range(1_000_000):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    if step == 20 and dist.get_rank() == 0:
        open(sys.argv[2], "w").close()
"""


def children(pid: int) -> list:
    """(pid, RANK) of the live processes whose parent is `pid`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            if ppid != pid:
                continue
            env = open(f"/proc/{entry}/environ", "rb").read().split(b"\0")
            rank = next((e[5:].decode() for e in env if e.startswith(b"RANK=")), "")
            out.append((int(entry), rank))
        except (OSError, ValueError):
            pass
    return out


def stall_and_time(cmd: list, ready, cwd: str, env: dict) -> tuple:
    """Start `cmd`, wait for `ready()`, SIGSTOP its rank-1 worker; returns (seconds until the job ended,
    its exit code, its stderr, whether every worker was gone)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while not ready():
        if proc.poll() is not None or time.time() > deadline:
            sys.exit(f"{cmd[0]} ended or stalled before training: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.05)
    workers = children(proc.pid)
    victim = next(p for p, r in workers if r == "1")
    os.kill(victim, signal.SIGSTOP)
    stopped = time.time()
    _, err = proc.communicate()
    took = time.time() - stopped
    time.sleep(0.2)
    gone = all(not os.path.exists(f"/proc/{p}") or ") Z " in open(f"/proc/{p}/stat").read() for p, _ in workers)
    if not gone:
        os.kill(victim, signal.SIGKILL)
    return took, proc.returncode, err.decode(errors="replace"), gone


def blamed(err: str, side: str) -> str:
    """Which rank the job's message blames."""
    if side == "trainyard":
        m = re.search(r"worker rank (\d+) \(pid \d+\) (\w+)", err)
        return f"rank {m.group(1)} ({m.group(2)})" if m else "none"
    m = re.search(r"rank\s*:\s*(\d+)", err[err.find("Root Cause"):]) if "Root Cause" in err else None
    return f"rank {m.group(1)} (its exception)" if m else "none"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", default=os.path.join(ROOT, "target", "debug", "train"))
    ap.add_argument("--timeout", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    args.train = os.path.abspath(args.train)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    work = tempfile.mkdtemp(prefix="trainyard-stall-")
    script = os.path.join(work, "worker.py")
    open(script, "w").write(WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TRAIN_CONFIG_PATH", None)
    results = {"trainyard": [], "torchrun": []}
    for r in range(args.rounds):
        run = os.path.join(work, f"ours{r}")
        ours = [args.train, "experiment=quickstart", "backend=tch", "trainer=ddp_sim", "data.train_size=4096",
                "data.batch_size=16", "data.num_workers=0", "trainer.max_epochs=50",
                f"trainer.collective_timeout_s={args.timeout}", f"hydra.run.dir={run}"]
        results["trainyard"].append(stall_and_time(
            ours, lambda: os.path.exists(os.path.join(run, "checkpoints", "last.safetensors")), work, env))
        marker = os.path.join(work, f"theirs{r}.ready")
        theirs = [torchrun, "--nproc_per_node=2", "--master_port", str(29600 + r), script, str(args.timeout),
                  marker]
        results["torchrun"].append(stall_and_time(theirs, lambda: os.path.exists(marker), work, env))
        for side in results:
            took, code, err, gone = results[side][-1]
            print(f"round {r} {side}: ended {took:.1f}s after SIGSTOP, exit {code}, blames {blamed(err, side)}, "
                  f"every worker gone: {gone}")
    med = {side: statistics.median(t for t, *_ in rs) for side, rs in results.items()}
    print(f"median: trainyard {med['trainyard']:.1f}s, torchrun {med['torchrun']:.1f}s "
          f"(timeout {args.timeout}s)")
    if args.record:
        ty, tr = results["trainyard"][-1], results["torchrun"][-1]
        record("A stalled rank (SIGSTOP of one of two DDP workers): time until every process ended",
               f"| {datetime.date.today().isoformat()} | collective timeout {args.timeout}s, small CNN, Gloo, "
               f"{args.rounds} alternated rounds | {med['trainyard']:.1f}s, exit {ty[1]}, blames "
               f"{blamed(ty[2], 'trainyard')} | torchrun 2.11 {med['torchrun']:.1f}s, exit {tr[1]}, blames "
               f"{blamed(tr[2], 'torchrun')} | {med['torchrun'] / med['trainyard']:.2f}x sooner | {machine()} "
               f"| `python bench/stall_bench.py --timeout {args.timeout} --rounds {args.rounds}` |")


if __name__ == "__main__":
    main()
