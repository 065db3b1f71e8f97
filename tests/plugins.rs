//! Loggers and callbacks written in Rust and registered under a `_target_` (`trainyard::register_logger!`,
//! `trainyard::register_callback!`), as a user's crate does: this test binary registers one of each, trains
//! through trainyard's whole command line in this process, and checks what the config engine says about
//! bad arguments and unknown names.

mod common;

use serde::Deserialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use trainyard::registry::{
    Callback, CallbackRun, EpochEnd, Flow, LoggerRun, MetricSink, Row, RowKind, RunEnd,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonlArgs {
    /// Relative to the run directory.
    file: String,
}

/// Every row as one JSON line, and a last line with the final metrics.
struct Jsonl(std::fs::File);

fn jsonl(args: JsonlArgs, run: &LoggerRun) -> anyhow::Result<Jsonl> {
    let header = serde_json::json!({"task": run.task_name, "seed": run.config["seed"]});
    let mut file = std::fs::File::create(run.run_dir.join(args.file))?;
    writeln!(file, "{header}")?;
    Ok(Jsonl(file))
}

impl MetricSink for Jsonl {
    fn log(&mut self, row: &Row) -> anyhow::Result<()> {
        let kind = match row.kind {
            RowKind::Step => "step",
            RowKind::MidEpochValidation { .. } => "mid_epoch",
            RowKind::Epoch => "epoch",
            RowKind::Test => "test",
        };
        let values: serde_json::Map<String, serde_json::Value> = row
            .values
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
            .collect();
        let line = serde_json::json!({"kind": kind, "epoch": row.epoch, "step": row.step, "values": values});
        writeln!(self.0, "{line}")?;
        Ok(())
    }

    fn finish(&mut self, end: &RunEnd) -> anyhow::Result<()> {
        writeln!(self.0, "{}", serde_json::json!({"end": end.final_metrics}))?;
        Ok(())
    }
}

trainyard::register_logger!("tests.loggers.Jsonl", jsonl);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StopAfterArgs {
    epochs: u64,
}

/// Stops the run once `epochs` epochs ended; writes what it saw when the run ends.
struct StopAfter {
    epochs: u64,
    rows: usize,
    seen_acc: Vec<f64>,
    out: PathBuf,
}

fn stop_after(args: StopAfterArgs, run: &CallbackRun) -> anyhow::Result<StopAfter> {
    Ok(StopAfter {
        epochs: args.epochs,
        rows: 0,
        seen_acc: Vec::new(),
        out: run
            .run_dir
            .join(format!("stop_after.rank{}.json", run.rank)),
    })
}

impl Callback for StopAfter {
    fn on_row(&mut self, _row: &Row) -> anyhow::Result<()> {
        self.rows += 1;
        Ok(())
    }

    fn on_epoch_end(&mut self, end: &EpochEnd) -> anyhow::Result<Flow> {
        self.seen_acc.push(end.metrics["val/acc1"]);
        Ok(match end.epoch + 1 >= self.epochs {
            true => Flow::Stop(format!("{} epochs are enough", self.epochs)),
            false => Flow::Continue,
        })
    }

    fn on_fit_end(&mut self, end: &RunEnd) -> anyhow::Result<()> {
        let record = serde_json::json!({
            "rows": self.rows,
            "seen_acc": self.seen_acc,
            "final_acc": end.final_metrics.get("val/acc1"),
        });
        std::fs::write(&self.out, record.to_string())?;
        Ok(())
    }
}

trainyard::register_callback!("tests.callbacks.StopAfter", stop_after);

/// A project with the shipped conf/ plus a logger and a callback config that name the registered ones.
fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    common::copy_dir(&root.join("conf"), &dir.path().join("conf"));
    std::fs::write(
        dir.path().join("conf/logger/rows.yaml"),
        "defaults:\n  - csv\n\nrows:\n  _target_: tests.loggers.Jsonl\n  file: rows.jsonl\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("conf/callbacks/stop.yaml"),
        "defaults:\n  - default\n\nstop:\n  _target_: tests.callbacks.StopAfter\n  epochs: 2\n",
    )
    .unwrap();
    dir
}

fn train(dir: &Path, extra: &[&str]) -> (std::process::ExitCode, PathBuf) {
    let run = dir.join("run");
    let mut args = vec![
        "train".to_string(),
        "-cp".into(),
        dir.join("conf").display().to_string(),
        "-cn".into(),
        "train".into(),
        "model=cnn".into(),
        "data.train_size=256".into(),
        "data.val_size=64".into(),
        "data.num_workers=0".into(),
        "trainer.max_epochs=5".into(),
        format!("hydra.run.dir={}", run.display()),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let code = trainyard::app::main_entry(args.iter().map(std::ffi::OsString::from));
    (code, run)
}

/// The registered logger gets the rows metrics.csv gets, and the end; the registered callback stops
/// the run after its second epoch, sees each epoch's metrics, and hears the end.
#[test]
fn a_registered_logger_and_callback_run_with_the_training() {
    let dir = project();
    let (code, run) = train(dir.path(), &["logger=rows", "callbacks=stop"]);
    assert_eq!(code, std::process::ExitCode::SUCCESS);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    let status = summary["status"].as_str().unwrap_or_default();
    assert!(
        status.starts_with(
            "early stopped: callbacks.stop stopped the run after epoch 1: 2 epochs are enough"
        ),
        "{summary}"
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(run.join("rows.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["task"], "train", "{:?}", lines[0]);
    let epochs: Vec<&serde_json::Value> = lines.iter().filter(|l| l["kind"] == "epoch").collect();
    assert_eq!(
        epochs.len(),
        2,
        "two epochs ran, then the callback stopped the run"
    );
    // The same values as metrics.csv's epoch rows.
    let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let acc_col = header.iter().position(|h| *h == "val/acc1").unwrap();
    let csv_acc: Vec<f64> = csv
        .lines()
        .skip(1)
        .filter_map(|l| l.split(',').nth(acc_col)?.parse().ok())
        .collect();
    let logged_acc: Vec<f64> = epochs
        .iter()
        .map(|e| e["values"]["val/acc1"].as_f64().unwrap())
        .collect();
    assert_eq!(csv_acc.len(), 2, "{csv}");
    for (a, b) in csv_acc.iter().zip(&logged_acc) {
        assert!((a - b).abs() < 1e-5, "{csv_acc:?} vs {logged_acc:?}");
    }
    let end = lines.last().unwrap();
    assert_eq!(
        end["end"]["val/acc1"].as_f64(),
        summary["final_metrics"]["val/acc1"].as_f64(),
        "{end}"
    );
    let seen: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("stop_after.rank0.json")).unwrap())
            .unwrap();
    assert!(seen["rows"].as_u64().unwrap() >= 2, "{seen}");
    let seen_acc: Vec<f64> = seen["seen_acc"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(seen_acc.len(), 2, "{seen}");
    for (a, b) in seen_acc.iter().zip(&logged_acc) {
        assert!((a - b).abs() < 1e-5, "{seen_acc:?} vs {logged_acc:?}");
    }
}

fn experiment(logger: &str, callbacks: &str) -> Result<trainyard::schema::Experiment, String> {
    let text = format!(
        "task_name: t\nseed: 3\nmodel: {{name: cnn, channels: [4], num_classes: 4}}\n\
         data: {{name: synthetic, num_classes: 4, image_size: 8, batch_size: 4}}\n\
         optimizer: {{name: sgd, lr: 0.1}}\nscheduler: {{name: constant}}\n\
         trainer: {{strategy: single, devices: 1, accelerator: cpu, precision: 32, max_epochs: 1}}\n\
         paths: {{root_dir: ., data_dir: d, log_dir: l, output_dir: o}}\n\
         logger: {logger}\ncallbacks: {callbacks}\n"
    );
    let node = trainyard::config::yaml::parse(&text, "t.yaml")
        .unwrap()
        .unwrap();
    trainyard::schema::extract(&node).map_err(|e| e.to_string())
}

#[test]
fn registered_plugins_are_typed_into_the_experiment() {
    let exp = experiment(
        "{rows: {_target_: tests.loggers.Jsonl, file: r.jsonl}, csv: {}}",
        "{stop: {_target_: tests.callbacks.StopAfter, epochs: 3}}",
    )
    .unwrap();
    assert!(exp.logger.csv.is_some());
    assert_eq!(exp.logger.registered.len(), 1);
    assert_eq!(exp.logger.registered[0].section, "logger.rows");
    assert_eq!(exp.logger.registered[0].args["file"], "r.jsonl");
    assert_eq!(
        exp.callbacks.registered[0].target,
        "tests.callbacks.StopAfter"
    );
}

#[rstest::rstest]
#[case::unknown_argument(
    "{rows: {_target_: tests.loggers.Jsonl, fil: r.jsonl}}",
    "{}",
    &["logger.rows", "unknown field `fil`", "t.yaml:9"]
)]
#[case::wrong_type(
    "{}",
    "{stop: {_target_: tests.callbacks.StopAfter, epochs: many}}",
    &["callbacks.stop.epochs", "invalid type", "t.yaml:10"]
)]
#[case::misspelt_logger(
    "{rows: {_target_: tests.loggers.Jsnl, file: r}}",
    "{}",
    &["logger: _target_ tests.loggers.Jsnl is not one trainyard knows", "Did you mean 'tests.loggers.Jsonl'", "t.yaml:9"]
)]
#[case::misspelt_callback(
    "{}",
    "{stop: {_target_: tests.callbacks.StopAftr, epochs: 1}}",
    &["Registered by this program: tests.callbacks.StopAfter", "t.yaml:10"]
)]
fn bad_registered_plugins_fail_with_the_key_and_the_place(
    #[case] logger: &str,
    #[case] callbacks: &str,
    #[case] wanted: &[&str],
) {
    let err = experiment(logger, callbacks).expect_err("an error");
    for w in wanted {
        assert!(err.contains(w), "missing {w:?} in:\n{err}");
    }
}
