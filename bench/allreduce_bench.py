"""All-reduce bandwidth: our c10d shim (examples/allreduce_bench.rs) vs torch.distributed with Gloo, the
same tensor size, world size and machine, alternating rounds. Both sides are launched the same way
(RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT per process) and report the median time per all-reduce.

usage: .venv-torch/bin/python bench/allreduce_bench.py --exe target-torch/debug/examples/allreduce_bench \
           [--mb 100] [--iters 10] [--world 2] [--rounds 3] [--record]
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def torch_worker(mb, iters):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(int(mb * 1e6 / 4), dtype=torch.float32)
    dist.all_reduce(t)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - start)
    times.sort()
    median = times[len(times) // 2]
    if rank == 0:
        busbw = 2 * (world - 1) / world * t.numel() * 4 / median / 1e9
        print(json.dumps({"impl": "torch.distributed", "megabytes": mb, "world": world,
                          "median_s": round(median, 6), "busbw_gbps": round(busbw, 4)}))
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cmd, world, **extra_env):
    """Start `world` copies of `cmd` as torchrun would; returns rank 0's last stdout line as JSON."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **extra_env)
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate()[0] for p in procs]
    for p in procs:
        if p.returncode != 0:
            sys.exit(f"{cmd} failed with {p.returncode}")
    return json.loads(outs[0].strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", default="target-torch/debug/examples/allreduce_bench")
    ap.add_argument("--mb", type=float, default=100.0)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        torch_worker(a.mb, a.iters)
        return
    ours, theirs = [], []
    for _ in range(a.rounds):
        ours.append(launch([a.exe, str(a.mb), str(a.iters)], a.world)["median_s"])
        theirs.append(launch([sys.executable, __file__, "--worker", "--mb", str(a.mb), "--iters", str(a.iters)],
                             a.world)["median_s"])
    o, t = statistics.median(ours), statistics.median(theirs)
    bus = lambda s: 2 * (a.world - 1) / a.world * a.mb * 1e6 / s / 1e9
    line = (f"| all-reduce {a.mb:.0f} MB, {a.world} processes, Gloo, loopback | trainyard c10d shim "
            f"{o * 1e3:.1f} ms ({bus(o):.2f} GB/s bus) | torch.distributed {t * 1e3:.1f} ms ({bus(t):.2f} GB/s) "
            f"| **{t / o:.2f}x** |")
    print(line)
    print(f"rounds (ours, torch): {ours} {theirs}")
    if a.record:
        cmd = ("`.venv-torch/bin/python bench/allreduce_bench.py --exe " + a.exe +
               f" --mb {a.mb:g} --iters {a.iters} --world {a.world} --rounds {a.rounds} --record`")
        with open(os.path.join(HERE, "RESULTS.md"), "a") as f:
            f.write(f"\n### All-reduce bandwidth ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores)\n\n"
                    f"Command: {cmd}\n\n| case | ours | reference | speed ratio (theirs/ours time) |\n"
                    f"|---|---|---|---|\n{line}\n")


if __name__ == "__main__":
    main()
