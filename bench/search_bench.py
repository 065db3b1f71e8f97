#!/usr/bin/env python3
"""Search quality: trainyard's TPE sampler (Rust, examples/search_bench.rs) vs Optuna's, on three minimisation
problems. For every (function, sampler, seed) one study of T trials is run and its best-so-far value after
each trial kept; the report gives, after T/2 and T trials, the mean ± standard error (over S seeds) of the best
value for six samplers, plus one-sided Mann-Whitney U tests (normal approximation, tie correction):

  trainyard-tpe    vs optuna-tpe     H1: trainyard is worse  -> "not worse" when p > 0.05
  trainyard-tpe-mv vs optuna-tpe-mv  H1: trainyard is worse  -> "not worse" when p > 0.05
  trainyard-tpe    vs trainyard-random, optuna-tpe vs optuna-random  H1: TPE is better -> "better" when p < 0.05

Optuna samplers: TPESampler(seed, multivariate=False) (hydra-optuna-sweeper's default), TPESampler(seed,
multivariate=True) (Optuna's own default for one objective), RandomSampler(seed). The functions:
  quadratic  lr log [1e-5, 1e-1], batch_size int [16, 512], optimizer {sgd, adam, adamw}, dropout [0, 0.5]
  branin     x1 [-5, 10], x2 [0, 15]; minimum 0.397887
  hartmann6  x1..x4 [0, 1], x5 [0, 1] step 0.05, x6 log [0.01, 1]; minimum -3.32237

The Rust side is one command whose stdout is JSON lines, one per study,
  {"function": "branin", "sampler": "tpe", "seed": 0, "best": [b1, ..., bT], "seconds": 0.01}
(samplers tpe, tpe-mv, random; "seconds", the study's wall time, is optional: without it the command's wall
time is spread evenly over its studies). `{seeds}` and `{trials}` in --rust-cmd are filled in.

Usage (from the repo root):
    .venv-bench/bin/python bench/search_bench.py --seeds 50 --trials 50 --record
    .venv-bench/bin/python bench/search_bench.py --seeds 3 --trials 12 --rust-json curves.jsonl --functions branin
"""
import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import optuna

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import machine, record  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTION = "Search sweeper quality (issue 21)"
RUST_CMD = "cargo run --release --quiet --example search_bench -- --seeds {seeds} --trials {trials}"
SAMPLERS = ["trainyard-tpe", "optuna-tpe", "trainyard-tpe-mv", "optuna-tpe-mv", "trainyard-random", "optuna-random"]

# ---- the test functions: each is (suggest(trial) -> params, f(**params) -> float) ----
OPT_PENALTY = {"sgd": 0.6, "adam": 0.2, "adamw": 0.0}


def quadratic(lr, batch_size, optimizer, dropout):
    return ((math.log10(lr) + 2.5) ** 2 + (math.log2(batch_size) - 6.5) ** 2 / 4 + OPT_PENALTY[optimizer]
            + 4 * (dropout - 0.15) ** 2 + 0.05 * math.sin(37 * math.log10(lr) + 11 * dropout + 0.3 * batch_size))


def branin(x1, x2):
    a, b, c, r, s, t = 1.0, 5.1 / (4 * math.pi ** 2), 5 / math.pi, 6.0, 10.0, 1 / (8 * math.pi)
    return a * (x2 - b * x1 ** 2 + c * x1 - r) ** 2 + s * (1 - t) * math.cos(x1) + s


H_ALPHA = np.array([1.0, 1.2, 3.0, 3.2])
H_A = np.array([[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14],
                [3, 3.5, 1.7, 10, 17, 8], [17, 8, 0.05, 10, 0.1, 14]])
H_P = 1e-4 * np.array([[1312, 1696, 5569, 124, 8283, 5886], [2329, 4135, 8307, 3736, 1004, 9991],
                       [2348, 1451, 3522, 2883, 3047, 6650], [4047, 8828, 8732, 5743, 1091, 381]])


def hartmann6(x1, x2, x3, x4, x5, x6):
    x = np.array([x1, x2, x3, x4, x5, x6])
    return float(-np.sum(H_ALPHA * np.exp(-np.sum(H_A * (x - H_P) ** 2, axis=1))))


FUNCTIONS = {
    "quadratic": (lambda t: dict(lr=t.suggest_float("lr", 1e-5, 1e-1, log=True),
                                 batch_size=t.suggest_int("batch_size", 16, 512),
                                 optimizer=t.suggest_categorical("optimizer", ["sgd", "adam", "adamw"]),
                                 dropout=t.suggest_float("dropout", 0.0, 0.5)), quadratic),
    "branin": (lambda t: dict(x1=t.suggest_float("x1", -5.0, 10.0), x2=t.suggest_float("x2", 0.0, 15.0)), branin),
    "hartmann6": (lambda t: dict(**{f"x{i}": t.suggest_float(f"x{i}", 0.0, 1.0) for i in range(1, 5)},
                                 x5=t.suggest_float("x5", 0.0, 1.0, step=0.05),
                                 x6=t.suggest_float("x6", 0.01, 1.0, log=True)), hartmann6),
}


def check_functions():
    """The formulas at their known minima (and a fixed quadratic point the Rust side can test against)."""
    assert abs(branin(math.pi, 2.275) - 0.397887) < 1e-6
    assert abs(branin(-math.pi, 12.275) - 0.397887) < 1e-6 and abs(branin(9.42478, 2.475) - 0.397887) < 1e-6
    assert abs(hartmann6(0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573) + 3.32237) < 1e-5
    assert abs(quadratic(1e-3, 64, "adam", 0.1) - 0.502744529254) < 1e-9


# ---- the two sides ----
def run_optuna(fn, sampler, seed, trials):
    suggest, f = FUNCTIONS[fn]
    if sampler == "optuna-random":
        s = optuna.samplers.RandomSampler(seed=seed)
    else:
        s = optuna.samplers.TPESampler(seed=seed, multivariate=sampler == "optuna-tpe-mv")
    t0 = time.perf_counter()
    study = optuna.create_study(direction="minimize", sampler=s)
    study.optimize(lambda t: f(**suggest(t)), n_trials=trials)
    seconds = time.perf_counter() - t0
    return np.minimum.accumulate([t.value for t in study.trials]).tolist(), seconds


def run_rust(args):
    """{(function, 'trainyard-'+sampler, seed): (best, seconds or None)} from --rust-json or --rust-cmd."""
    if args.rust_json:
        text, wall = open(args.rust_json).read(), None
    else:
        cmd = args.rust_cmd.format(seeds=args.seeds, trials=args.trials)
        print(f"running: {cmd}", file=sys.stderr)
        t0 = time.perf_counter()
        text = subprocess.run(cmd, shell=True, cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True).stdout
        wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in text.splitlines() if line.strip().startswith("{")]
    out = {}
    for r in rows:
        secs = r.get("seconds", wall / len(rows) if wall is not None else None)
        out[(r["function"], "trainyard-" + r["sampler"], int(r["seed"]))] = (list(map(float, r["best"])), secs)
    return out


# ---- statistics ----
def mann_whitney_p(x, y):
    """One-sided p for H1: x tends to be larger than y (normal approximation, tie and continuity correction)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    n1, n2 = len(x), len(y)
    both = np.concatenate([x, y])
    order = np.argsort(both, kind="mergesort")
    ranks = np.empty(len(both))
    ranks[order] = np.arange(1, len(both) + 1)
    _, inverse, counts = np.unique(both, return_inverse=True, return_counts=True)
    ranks = (np.bincount(inverse, weights=ranks) / counts)[inverse]  # average ranks over ties
    u1 = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - np.sum(counts ** 3 - counts) / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (u1 - n1 * n2 / 2 - 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(z / math.sqrt(2))


def mean_se(v):
    v = np.asarray(v, float)
    return v.mean(), (v.std(ddof=1) / math.sqrt(len(v)) if len(v) > 1 else float("nan"))


def fmt(x):
    return f"{x:.4g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"


COMPARISONS = [  # (a, b, H1 text, a-is-worse test?)
    ("trainyard-tpe", "optuna-tpe", "trainyard worse", True),
    ("trainyard-tpe-mv", "optuna-tpe-mv", "trainyard worse", True),
    ("trainyard-tpe", "trainyard-random", "TPE better", False),
    ("optuna-tpe", "optuna-random", "TPE better", False),
]


def compare(best, a, b, worse_test):
    """p and verdict: worse_test -> H1 a > b (not worse when p > 0.05); else H1 a < b (better when p < 0.05)."""
    if worse_test:
        p = mann_whitney_p(best[a], best[b])
        return p, "not worse" if p > 0.05 else "**worse**"
    p = mann_whitney_p(best[b], best[a])
    return p, "better" if p < 0.05 else "not better"


def report(fn, curves, times, trials, seeds):
    """Markdown for one function; returns (text, final best values per sampler)."""
    checks = sorted({max(1, trials // 2), trials})
    best = {c: {s: [curves[s][k][c - 1] for k in range(seeds)] for s in SAMPLERS} for c in checks}
    lines = [f"### {fn}", "", "| sampler | " + " | ".join(f"best after {c}" for c in checks) + " | time/study |",
             "|---|" + "---|" * len(checks) + "---|"]
    for s in SAMPLERS:
        cells = ["%s ± %s" % tuple(map(fmt, mean_se(best[c][s]))) for c in checks]
        t = times[s]
        lines.append(f"| {s} | " + " | ".join(cells) + f" | {'n/a' if t is None else f'{t * 1e3:.3g} ms'} |")
    lines += ["", "| comparison (one-sided MWU) | H1 | " + " | ".join(f"p after {c}" for c in checks) + " |",
              "|---|---|" + "---|" * len(checks)]
    for a, b, h1, worse in COMPARISONS:
        cells = ["%.3g (%s)" % compare(best[c], a, b, worse) for c in checks]
        lines.append(f"| {a} vs {b} | {h1} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n", best[trials]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--functions", default=",".join(FUNCTIONS), help="comma-separated subset of " + ",".join(FUNCTIONS))
    ap.add_argument("--rust-cmd", default=RUST_CMD, help="command printing the Rust side's JSON lines")
    ap.add_argument("--rust-json", help="read the Rust side's JSON lines from this file instead of running it")
    ap.add_argument("--json-out", help="save every study's best-so-far curve (and wall time) here")
    ap.add_argument("--record", action="store_true", help="append one row per function to bench/RESULTS.md")
    args = ap.parse_args()
    functions = [f.strip() for f in args.functions.split(",") if f.strip()]
    unknown = set(functions) - set(FUNCTIONS)
    if unknown:
        ap.error(f"unknown function(s) {sorted(unknown)}; known: {list(FUNCTIONS)}")
    check_functions()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    mach = machine()
    print(f"machine: {mach}; optuna {optuna.__version__}, numpy {np.__version__}; "
          f"{args.seeds} seeds x {args.trials} trials")

    rust = run_rust(args)
    curves = {fn: {s: [] for s in SAMPLERS} for fn in functions}
    seconds = {fn: {s: [] for s in SAMPLERS} for fn in functions}
    for fn in functions:
        for s in SAMPLERS:
            for seed in range(args.seeds):
                if s.startswith("trainyard-"):
                    if (fn, s, seed) not in rust:
                        sys.exit(f"the Rust side printed no study for {fn} / {s} / seed {seed}")
                    curve, secs = rust[(fn, s, seed)]
                else:
                    curve, secs = run_optuna(fn, s, seed, args.trials)
                if len(curve) != args.trials:
                    sys.exit(f"{fn} / {s} / seed {seed}: {len(curve)} values, expected {args.trials}")
                curves[fn][s].append(curve)
                seconds[fn][s].append(secs)
            print(f"  {fn} {s}: done", file=sys.stderr)

    print()
    command = (f".venv-bench/bin/python bench/search_bench.py --seeds {args.seeds} --trials {args.trials}"
               + (f" --functions {args.functions}" if args.functions != ",".join(FUNCTIONS) else "")
               + (f" --rust-json {args.rust_json}" if args.rust_json else "")
               + (f" --rust-cmd '{args.rust_cmd}'" if args.rust_cmd != RUST_CMD and not args.rust_json else ""))
    rows = []
    for fn in functions:
        times = {s: (None if None in seconds[fn][s] else float(np.mean(seconds[fn][s]))) for s in SAMPLERS}
        text, final = report(fn, curves[fn], times, args.trials, args.seeds)
        print(text)
        p_opt, v_opt = compare(final, "trainyard-tpe", "optuna-tpe", True)
        p_mv, v_mv = compare(final, "trainyard-tpe-mv", "optuna-tpe-mv", True)
        p_rnd, v_rnd = compare(final, "trainyard-tpe", "trainyard-random", False)
        ty, ref = mean_se(final["trainyard-tpe"]), mean_se(final["optuna-tpe"])
        rows.append(f"| {datetime.date.today()} | {fn}, best after {args.trials} trials, mean of {args.seeds} seeds "
                    f"(lower is better) | {fmt(ty[0])} ± {fmt(ty[1])} | Optuna {optuna.__version__} TPE: "
                    f"{fmt(ref[0])} ± {fmt(ref[1])} | MWU p={p_opt:.2g} ({v_opt}); multivariate p={p_mv:.2g} "
                    f"({v_mv}); vs random p={p_rnd:.2g} ({v_rnd}) | {mach} | `{command}` |")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"machine": mach, "optuna": optuna.__version__, "seeds": args.seeds, "trials": args.trials,
                       "studies": [{"function": fn, "sampler": s, "seed": k, "best": curves[fn][s][k],
                                    "seconds": seconds[fn][s][k]}
                                   for fn in functions for s in SAMPLERS for k in range(args.seeds)]}, f)
        print(f"curves saved to {args.json_out}")
    if args.record:
        for row in rows:
            record(SECTION, row)


if __name__ == "__main__":
    main()
