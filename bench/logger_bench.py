#!/usr/bin/env python3
"""Logger overhead: training throughput of the quickstart with `logger=csv` (metrics.csv alone) against
`logger=wandb` (metrics.csv plus the W&B offline run), `logger=mlflow` (metrics.csv plus an MLflow
tracking server on loopback, started here from .venv-mlflow when it exists: the server's own work shares
the machine's cores) and `logger=mlflow` against a null HTTP endpoint that answers at once (the client's
own cost), in the same scratch project, alternating them for --rounds rounds. Every optimizer step is logged (`trainer.log_every_n_steps=1`),
the worst case for a logger. Throughput is each run's own `train_samples_per_s` from summary.json; medians
and their ratio are printed and, with --record, appended to bench/RESULTS.md.

Usage (from the repo root):
    cargo build --release
    python3 bench/logger_bench.py --rounds 5 --record
(MLflow: python3 -m venv .venv-mlflow && .venv-mlflow/bin/pip install mlflow)
"""
import argparse
import datetime
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request

from results import machine, record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
RUN = ["experiment=quickstart", "trainer.max_epochs=2", "trainer.log_every_n_steps=1", "callbacks.model_summary=null"]
LOGGERS = {"csv": ["logger=csv"], "wandb": ["logger=wandb"]}


def mlflow_server(scratch: str):
    """`mlflow server` on a free loopback port (its own process group, stopped by pid), or None."""
    mlflow = os.path.join(ROOT, ".venv-mlflow", "bin", "mlflow")
    if not os.path.exists(mlflow):
        return None, None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [mlflow, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{scratch}/mlflow.db", "--artifacts-destination", f"{scratch}/artifacts"],
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=1)
            return proc, uri
        except OSError:
            time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit("mlflow server did not start")


NULL_SERVER = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.reply({"experiment": {"experiment_id": "1"}})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.reply({"run": {"info": {"run_id": "r", "artifact_uri": "mlflow-artifacts:/1/r/artifacts"}}})
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def null_server():
    """An HTTP endpoint answering MLflow's calls with the least work: the client's own cost, alone."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["python3", "-c", NULL_SERVER, str(port)], start_new_session=True)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the null server did not start")


def throughput(train: str, project: str, logger: str, n: int) -> float:
    out = os.path.join(project, "logs", f"{logger}-{n}")
    args = RUN + LOGGERS[logger] + [f"hydra.run.dir={out}"]
    subprocess.run([train, *args], cwd=project, check=True, capture_output=True)
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)["train_samples_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--record", action="store_true")
    a = ap.parse_args()
    train = os.path.join(TARGET, "release", "train")
    with tempfile.TemporaryDirectory() as project:
        for sub in ("conf", "experiments"):
            shutil.copytree(os.path.join(ROOT, sub), os.path.join(project, sub))
        server, uri = mlflow_server(project)
        if uri:
            LOGGERS["mlflow"] = ["logger=mlflow", f"logger.mlflow.tracking_uri={uri}"]
        null, null_uri = null_server()
        LOGGERS["mlflow-client"] = ["logger=mlflow", f"logger.mlflow.tracking_uri={null_uri}"]
        try:
            throughput(train, project, "csv", -1)  # warm the page cache and the data
            got = {name: [] for name in LOGGERS}
            for n in range(a.rounds):
                for name in LOGGERS:
                    got[name].append(throughput(train, project, name, n))
        finally:
            if server:
                os.killpg(server.pid, signal.SIGKILL)
            os.killpg(null.pid, signal.SIGKILL)
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"machine: {machine()}")
    for k, v in got.items():
        print(f"{k:6s} img/s: " + ", ".join(f"{x:.0f}" for x in v) + f"  (median {med[k]:.0f})")
    for name in [k for k in LOGGERS if k != "csv"]:
        ratio = med[name] / med["csv"]
        print(f"{name} / csv throughput: {ratio:.3f}")
        if a.record:
            what = {"wandb": "logger=wandb (offline run file)",
                    "mlflow": "logger=mlflow, `mlflow server` (SQLite) on the same 2 cores",
                    "mlflow-client": "logger=mlflow against a null HTTP endpoint (the client's own cost)"}[name]
            record("Logger overhead (issue 22)",
                   f"| {datetime.date.today()} | quickstart, 2 epochs, every step logged: {what} vs csv alone, "
                   f"median of {a.rounds} alternating runs | {med[name]:.0f} img/s | csv: {med['csv']:.0f} img/s | "
                   f"{ratio:.3f}x | {machine()} | `python3 bench/logger_bench.py --rounds {a.rounds}` |")


if __name__ == "__main__":
    main()
