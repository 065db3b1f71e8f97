//! `logger=mlflow` against a real MLflow tracking server (`mlflow server` from PyPI on loopback, started
//! and stopped by pid here; `TRAINYARD_MLFLOW` names its venv's `bin/`, `.ci/run` installs it). What the
//! server keeps is read back with MLflow's own `MlflowClient` and compared with `metrics.csv`. Without
//! MLflow these tests say SKIPPED and pass.

mod common;
use common::{csv_rows, free_port, real_project, train};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn mlflow_bin() -> Option<PathBuf> {
    let dir = std::env::var_os("TRAINYARD_MLFLOW")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-mlflow/bin"));
    if dir.join("mlflow").is_file() {
        return Some(dir);
    }
    common::skip(
        "mlflow",
        "MLflow is not installed (TRAINYARD_MLFLOW, or .venv-mlflow with `pip install mlflow`)",
    );
    None
}

/// `mlflow server` on a free loopback port with a SQLite store in a temp dir; killed (by pid) on drop.
struct Server {
    child: Child,
    uri: String,
    bin: PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(bin: &Path) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let child = Command::new(bin.join("mlflow"))
            .args(["server", "--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--backend-store-uri")
            .arg(format!(
                "sqlite:///{}",
                dir.path().join("mlflow.db").display()
            ))
            .arg("--artifacts-destination")
            .arg(dir.path().join("artifacts"))
            .args(["--workers", "1"])
            .env("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
            // Its own process group: the server's web workers are its children, stopped with it.
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let uri = format!("http://127.0.0.1:{port}");
        let mut server = Server {
            child,
            uri,
            bin: bin.to_path_buf(),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
            || server
                .read("[e.name for e in c.search_experiments()]")
                .is_none()
        {
            assert!(
                Instant::now() < deadline,
                "mlflow server did not answer on {}",
                server.uri
            );
            assert!(
                server.child.try_wait().unwrap().is_none(),
                "mlflow server exited"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        server
    }

    /// Evaluate a Python expression with MLflow's client `c` bound to this server; its JSON.
    fn read(&self, expr: &str) -> Option<serde_json::Value> {
        let script = format!(
            "import json, mlflow\nc = mlflow.tracking.MlflowClient('{}')\nprint(json.dumps({expr}))",
            self.uri
        );
        let out = Command::new(self.bin.join("python"))
            .args(["-c", &script])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).ok())
            .flatten()
    }

    fn stop(&mut self) {
        // SAFETY: a signal to the process group this test started.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

const TINY: &[&str] = &[
    "experiment=quickstart",
    "data.train_size=256",
    "data.val_size=64",
    "model.channels=[4]",
    "trainer.max_epochs=2",
    "callbacks.model_summary=null",
    "logger=mlflow",
];

fn text(o: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn run_with(root: &Path, server: &Server, extra: &[&str]) -> Output {
    let uri = format!("logger.mlflow.tracking_uri={}", server.uri);
    let mut args = TINY.to_vec();
    args.push(&uri);
    args.extend_from_slice(extra);
    train(root, &args)
}

/// Every run of `experiment` with its params, tags, status, artifacts and each metric's (step, value) history.
fn runs_of(server: &Server, experiment: &str) -> Vec<serde_json::Value> {
    let expr = format!(
        "[dict(name=r.info.run_name, status=r.info.status, params=r.data.params, tags=r.data.tags, \
         artifacts=sorted(a.path for a in c.list_artifacts(r.info.run_id)) + \
         sorted(a.path for a in c.list_artifacts(r.info.run_id, 'checkpoints')) + \
         sorted(a.path for a in c.list_artifacts(r.info.run_id, 'logbook')), \
         metrics={{k: [[m.step, m.value] for m in sorted(c.get_metric_history(r.info.run_id, k), \
         key=lambda m: (m.step, m.timestamp))] for k in r.data.metrics}}) \
         for r in c.search_runs([c.get_experiment_by_name('{experiment}').experiment_id], \
         order_by=['attributes.start_time ASC'])]"
    );
    server
        .read(&expr)
        .unwrap_or_else(|| panic!("could not read experiment {experiment}"))
        .as_array()
        .unwrap()
        .clone()
}

/// One cluster of checks per server start (a server takes seconds to come up).
#[test]
fn runs_land_on_a_real_tracking_server_row_for_row() {
    let Some(bin) = mlflow_bin() else { return };
    let server = Server::start(&bin);
    let p = real_project();

    // One run: every metrics.csv value, the config as params, the tags, the best checkpoint as artifact.
    let out = run_with(
        p.path(),
        &server,
        &[
            "trainer.log_every_n_steps=1",
            "logger.mlflow.experiment_name=single",
            "logger.mlflow.log_model=true",
            "+logger.mlflow.tags.team=vision",
            "hydra.run.dir=logs/single",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let run_dir = p.path().join("logs/single");
    let runs = runs_of(&server, "single");
    assert_eq!(runs.len(), 1, "{runs:?}");
    let r = &runs[0];
    assert_eq!(r["status"], "FINISHED");
    assert_eq!(r["name"], "quickstart");
    assert_eq!(r["params"]["data.train_size"], "256");
    assert_eq!(r["params"]["optimizer.lr"], "0.003");
    assert_eq!(r["params"]["model.name"], "cnn");
    assert_eq!(r["tags"]["team"], "vision");
    let rows = csv_rows(&run_dir);
    for column in ["train/loss", "train/acc1", "val/loss", "val/acc1", "lr"] {
        let want: Vec<(u64, f64)> = rows
            .iter()
            .filter_map(|row| {
                let step = row.iter().find(|(k, _)| k == "step")?.1 as u64;
                let v = row.iter().find(|(k, _)| k == column)?.1;
                Some((step, v))
            })
            .collect();
        let got: Vec<(u64, f64)> = r["metrics"][column]
            .as_array()
            .unwrap_or_else(|| panic!("no {column} on the server: {r}"))
            .iter()
            .map(|m| (m[0].as_u64().unwrap(), m[1].as_f64().unwrap()))
            .collect();
        assert_eq!(got.len(), want.len(), "{column}");
        for ((gs, gv), (ws, wv)) in got.iter().zip(&want) {
            assert_eq!(gs, ws, "{column}");
            assert!(
                (gv - wv).abs() <= 1e-6 * wv.abs().max(1.0),
                "{column} at {gs}: {gv} vs {wv}"
            );
        }
    }
    let s = common::summary(&run_dir);
    let best = Path::new(s["best_checkpoint"].as_str().unwrap());
    let artifacts: Vec<&str> = r["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert!(artifacts.contains(&"summary.json"), "{artifacts:?}");
    let ckpt = format!(
        "checkpoints/{}",
        best.file_name().unwrap().to_string_lossy()
    );
    assert!(artifacts.contains(&ckpt.as_str()), "{artifacts:?}");
    assert!(artifacts.contains(&"logbook/logbook.md"), "{artifacts:?}");

    // A sweep: one run per job, tagged with the sweep.
    let out = run_with(
        p.path(),
        &server,
        &[
            "-m",
            "seed=1,2",
            "logger.mlflow.experiment_name=sweep",
            "hydra.sweep.dir=logs/sw",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let runs = runs_of(&server, "sweep");
    assert_eq!(runs.len(), 2);
    for (r, job) in runs.iter().zip(["0", "1"]) {
        assert_eq!(r["name"], format!("quickstart-{job}").as_str());
        assert_eq!(r["tags"]["trainyard.sweep"], "sw");
        // Without log_model no sink keeps the run's logbook section, so none is written.
        assert!(!p
            .path()
            .join("logs/sw")
            .join(job)
            .join("logbook.md")
            .exists());
        assert_eq!(r["status"], "FINISHED");
    }

    // A run that fails ends its MLflow run as FAILED.
    let out = run_with(
        p.path(),
        &server,
        &[
            "logger.mlflow.experiment_name=failing",
            "callbacks.model_checkpoint.dirpath=/proc/trainyard-cannot-write-here",
            "hydra.run.dir=logs/failing",
        ],
    );
    assert!(!out.status.success());
    assert_eq!(runs_of(&server, "failing")[0]["status"], "FAILED");

    // Loggers as a list of the group's options, as Hydra selects several: all of them log.
    let uri = format!("logger.mlflow.tracking_uri={}", server.uri);
    let mut args: Vec<&str> = TINY
        .iter()
        .copied()
        .filter(|a| !a.starts_with("logger="))
        .collect();
    args.extend([
        "logger=[csv,wandb,mlflow]",
        uri.as_str(),
        "logger.mlflow.experiment_name=both",
        "hydra.run.dir=logs/both",
    ]);
    let out = train(p.path(), &args);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(runs_of(&server, "both")[0]["status"], "FINISHED");
    assert!(p.path().join("logs/both/wandb/latest-run").exists());
    assert!(p.path().join("logs/both/metrics.csv").is_file());
}

#[test]
fn a_server_that_goes_away_costs_the_rows_not_the_run() {
    let Some(bin) = mlflow_bin() else { return };
    let mut server = Server::start(&bin);
    let p = real_project();
    let uri = format!("logger.mlflow.tracking_uri={}", server.uri);
    let mut args = TINY.to_vec();
    args.extend([
        uri.as_str(),
        "trainer.max_epochs=6",
        "trainer.log_every_n_steps=1",
        "logger.csv.flush_every_n_steps=1",
        "hydra.run.dir=logs/gone",
    ]);
    let child = Command::new(common::TRAIN)
        .args(&args)
        .current_dir(p.path())
        .env_remove("TRAIN_CONFIG_PATH")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once the run has logged some rows, the server dies.
    let csv = p.path().join("logs/gone/metrics.csv");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(&csv).map_or(0, |t| t.lines().count()) < 3 {
        assert!(Instant::now() < deadline, "the run logged nothing");
        std::thread::sleep(Duration::from_millis(20));
    }
    server.stop();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the run completes: {}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches("were not logged").count(),
        1,
        "said once: {err}"
    );
    let rows = csv_rows(&p.path().join("logs/gone")).len();
    assert!(err.contains(&format!("of {rows} rows")), "{err}");
    assert_eq!(
        common::summary(&p.path().join("logs/gone"))["status"],
        "completed"
    );
}

/// DDP (two processes over Gloo, feature torch): one MLflow run, from rank 0, with every row.
#[cfg(feature = "torch")]
#[test]
fn a_ddp_run_is_one_mlflow_run_from_rank_zero() {
    let Some(bin) = mlflow_bin() else { return };
    let server = Server::start(&bin);
    let p = real_project();
    let out = run_with(
        p.path(),
        &server,
        &[
            "trainer=ddp_sim",
            "data.batch_size=16",
            "logger.mlflow.experiment_name=ddp",
            "hydra.run.dir=logs/ddp",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let runs = runs_of(&server, "ddp");
    assert_eq!(runs.len(), 1, "rank 1 makes no run: {runs:?}");
    let rows = csv_rows(&p.path().join("logs/ddp"));
    let logged = rows
        .iter()
        .filter(|r| r.iter().any(|(k, _)| k == "train/loss"))
        .count();
    assert_eq!(
        runs[0]["metrics"]["train/loss"].as_array().unwrap().len(),
        logged
    );
}
