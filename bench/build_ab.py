"""Two builds of `train` on the same train step, alternated round by round: the A/B a code change that must
keep (or gain) speed is judged by. Each round runs both builds once (which goes first alternates), each
reporting `median_step_time_s` from its run's summary.json over the same model, batch and thread count as
`train_step_bench.py` measures (forward, backward and SGD step; data loading excluded).

    python3 bench/build_ab.py --a target/release/train --b /tmp/train-before --rounds 11 \
        --label "candle-core from crates.io (no vendored patch) vs the vendored patch" --record

No PyTorch is needed: both sides are trainyard.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import machine, record  # noqa: E402

MODELS = {
    "resnet18-cifar": ["model=resnet18", "model.cifar_stem=true", "~model.channels"],
    "cnn": ["model=cnn", "model.channels=[16,32,64]"],
    "resnet50-64px": ["model=resnet50", "~model.channels", "data.image_size=64"],
    "vit-tiny": ["model=vit_b32", "~model.channels", "model.variant=tiny", "model.patch_size=8"],
}


def step_time(train: str, model: str, batch: int, steps: int, threads: int, precision: str) -> float:
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            train, "experiment=quickstart", *MODELS[model], f"data.batch_size={batch}",
            "optimizer=sgd", "optimizer.lr=0.01", "scheduler=constant", "trainer.max_epochs=1",
            f"trainer.limit_train_batches={steps + 1}", "trainer.limit_val_batches=0", "callbacks=none",
            "data.num_workers=0", f"data.train_size={batch * (steps + 1)}", f"hydra.run.dir={out}",
            f"trainer.precision={precision}", "trainer.accelerator=cpu",
        ]
        env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return json.load(open(os.path.join(out, "summary.json")))["median_step_time_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="the new build")
    ap.add_argument("--b", required=True, help="the build it is compared with")
    ap.add_argument("--model", default="resnet18-cifar", choices=sorted(MODELS))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--precision", default="32-true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--label", default="A vs B")
    ap.add_argument("--record", action="store_true", help="append a row to bench/RESULTS.md")
    args = ap.parse_args()
    a_times, b_times = [], []
    for r in range(args.rounds):
        order = [("a", args.a), ("b", args.b)] if r % 2 == 0 else [("b", args.b), ("a", args.a)]
        for side, train in order:
            t = step_time(train, args.model, args.batch, args.steps, args.threads, args.precision)
            (a_times if side == "a" else b_times).append(t)
        print(f"round {r + 1}: A {a_times[-1] * 1e3:.1f} ms, B {b_times[-1] * 1e3:.1f} ms, "
              f"B/A {b_times[-1] / a_times[-1]:.3f}", flush=True)
    a, b = statistics.median(a_times), statistics.median(b_times)
    faster = sum(1 for x, y in zip(a_times, b_times) if x < y)
    print(f"median step: A {a * 1e3:.1f} ms, B {b * 1e3:.1f} ms; A is {b / a:.3f}x B "
          f"(A faster in {faster} of {args.rounds} rounds)")
    if args.record:
        cmd = (f"`python3 bench/build_ab.py --a {args.a} --b {args.b} --model {args.model} --batch {args.batch} "
               f"--threads {args.threads} --rounds {args.rounds} --precision {args.precision}`")
        row = (f"| {datetime.date.today()} | {args.model} Candle train step, batch {args.batch}, {args.precision}, "
               f"{args.threads} threads: {args.label}; {args.rounds} alternated rounds (A faster in {faster}) | "
               f"A {a * 1e3:.1f} ms | B {b * 1e3:.1f} ms | **{b / a:.3f}x** | {machine()} | {cmd} |")
        record("Builds compared (A/B)", row)


if __name__ == "__main__":
    main()
