//! Stateful metrics (`metrics:`) in real runs: computed per epoch for train and val and once for the test,
//! logged beside the loss (console, metrics.csv, summary), monitored by ModelCheckpoint, per-class values
//! and confusion matrices kept as files; and on every strategy the same weights measure the same values:
//! `train eval` of one checkpoint on a test split that does not divide evenly gives one process's
//! F1, AUROC and confusion matrix on two ranks too (each sample once, the states combined once).

mod common;

use common::{summary, TRAIN};
use rstest::rstest;
use std::path::Path;
use std::process::{Command, Output};

const METRICS: &[&str] = &[
    "+metrics.f1={_target_: torchmetrics.F1Score, task: multiclass, num_classes: 10, average: macro}",
    "+metrics.auroc={_target_: torchmetrics.AUROC, task: multiclass}",
    "+metrics.confmat={_target_: torchmetrics.ConfusionMatrix, task: multiclass}",
    "+metrics.recall_per_class={_target_: torchmetrics.Recall, task: multiclass, average: null}",
];

const SMALL: &[&str] = &[
    "experiment=quickstart",
    "data.train_size=256",
    "data.val_size=101",
    "data.batch_size=32",
    "trainer.max_epochs=2",
];

fn train(cwd: &Path, args: &[&str]) -> Output {
    Command::new(TRAIN)
        .args(args)
        .current_dir(cwd)
        .env_remove("TRAIN_CONFIG_PATH")
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    );
    assert!(out.status.success(), "{o}\n{e}");
    o
}

fn csv(dir: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let text = std::fs::read_to_string(dir.join("metrics.csv")).unwrap();
    let mut lines = text.lines();
    let header: Vec<String> = lines.next().unwrap().split(',').map(String::from).collect();
    let rows = lines
        .map(|l| l.split(',').map(String::from).collect())
        .collect();
    (header, rows)
}

#[test]
fn metrics_are_logged_monitored_and_kept() {
    let p = tempfile::tempdir().unwrap();
    let args: Vec<&str> = SMALL
        .iter()
        .chain(METRICS)
        .chain(&[
            "callbacks.model_checkpoint.monitor=val/f1",
            "callbacks.model_checkpoint.mode=max",
            "+test=true",
            "hydra.run.dir=logs/m",
        ])
        .copied()
        .collect();
    let stdout = ok(&train(p.path(), &args));
    let run = p.path().join("logs/m");
    let (header, rows) = csv(&run);
    for column in ["train/f1", "val/f1", "val/auroc", "test/f1", "test/auroc"] {
        assert!(
            header.iter().any(|h| h == column),
            "{column} not in {header:?}"
        );
    }
    // Per-class and matrix values are files, not columns.
    assert!(
        !header
            .iter()
            .any(|h| h.contains("confmat") || h.contains("recall_per_class")),
        "{header:?}"
    );
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let epoch_rows: Vec<&Vec<String>> = rows
        .iter()
        .filter(|r| !r[col("val/f1")].is_empty())
        .collect();
    assert_eq!(epoch_rows.len(), 2, "{rows:?}");
    for r in &epoch_rows {
        for name in ["train/f1", "val/f1", "val/auroc"] {
            let v: f64 = r[col(name)].parse().unwrap();
            assert!((0.0..=1.0).contains(&v), "{name} = {v}");
        }
    }
    let s = summary(&run);
    assert_eq!(s["best"]["monitor"], "val/f1", "{s}");
    assert!(s["final_metrics"]["test/auroc"].as_f64().is_some(), "{s}");
    assert!(stdout.contains("val/f1"), "{stdout}");
    let confmat: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(run.join("metrics/val_confmat.json")).unwrap(),
    )
    .unwrap();
    let cells: f64 = confmat["matrix"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()))
        .sum();
    assert_eq!(cells, 101.0, "every validation sample once: {confmat}");
    let per_class: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(run.join("metrics/test_recall_per_class.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(per_class["per_class"].as_array().unwrap().len(), 10);
}

/// One checkpoint measured by `train eval` under `trainer`: the test metrics and confusion matrix.
fn evaluate(
    p: &Path,
    ckpt: &Path,
    trainer: &[&str],
    dir: &str,
) -> (serde_json::Value, serde_json::Value) {
    let ckpt = format!("ckpt_path={}", ckpt.display());
    let run = format!("hydra.run.dir=logs/{dir}");
    let args: Vec<&str> = ["eval"]
        .iter()
        .chain(SMALL)
        .chain(METRICS)
        .chain(trainer)
        .chain(&[
            ckpt.as_str(),
            run.as_str(),
            "data.val_size=77",
            "data.batch_size=16",
        ])
        .copied()
        .collect();
    ok(&train(p, &args));
    let dir = p.join("logs").join(dir);
    let confmat = serde_json::from_str(
        &std::fs::read_to_string(dir.join("metrics/test_confmat.json")).unwrap(),
    )
    .unwrap();
    (summary(&dir)["final_metrics"].clone(), confmat)
}

#[rstest]
#[case::data_parallel(&["trainer=dp_sim"])]
#[cfg_attr(feature = "torch", case::ddp(&["trainer=ddp_sim"]))]
#[cfg_attr(feature = "torch", case::fsdp(&["trainer=fsdp_sim"]))]
fn every_strategy_measures_what_one_process_measures(#[case] trainer: &[&str]) {
    let p = tempfile::tempdir().unwrap();
    let fit: Vec<&str> = SMALL
        .iter()
        .chain(&["trainer.max_epochs=1", "hydra.run.dir=logs/fit"])
        .copied()
        .collect();
    ok(&train(p.path(), &fit));
    let ckpt = p.path().join("logs/fit/checkpoints/last.safetensors");
    let (single, single_confmat) = evaluate(p.path(), &ckpt, &[], "single");
    let (other, other_confmat) = evaluate(p.path(), &ckpt, trainer, "other");
    assert_eq!(single_confmat["matrix"], other_confmat["matrix"]);
    for key in ["test/f1", "test/auroc", "test/acc1"] {
        let (a, b) = (single[key].as_f64().unwrap(), other[key].as_f64().unwrap());
        assert!(
            (a - b).abs() < 1e-9,
            "{key}: one process {a}, {trainer:?} {b}"
        );
    }
}

#[test]
fn a_bad_metric_is_refused_with_its_key_and_the_list() {
    let p = tempfile::tempdir().unwrap();
    let out = train(
        p.path(),
        &[
            "experiment=quickstart",
            "+metrics.f1={_target_: torchmetrics.F1Scor, task: multiclass}",
            "--cfg",
            "job",
        ],
    );
    assert!(
        out.status.success(),
        "composing alone does not build metrics"
    );
    let out = train(
        p.path(),
        &[
            "experiment=quickstart",
            "+metrics.f1={_target_: torchmetrics.F1Scor, task: multiclass}",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("metrics.f1._target_")
            && err.contains("Did you mean 'torchmetrics.F1Score'?")
            && err.contains("torchmetrics.R2Score"),
        "{err}"
    );
    let out = train(
        p.path(),
        &[
            "experiment=quickstart",
            "+metrics.f1={_target_: torchmetrics.F1Score, task: multiclass, averge: macro}",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("metrics.f1") && err.contains("averge"),
        "{err}"
    );
}

/// A sweep judged by a stateful metric leads with it everywhere: the console's last line, the sweep's
/// table (its name and direction as the column), the logbook's sweep section (best job by it, its
/// column, no column empty for every job) and experiment table; the confusion matrix is a picture; no
/// "speed-up vs single" where every run is single-device.
#[test]
fn a_sweep_leads_with_its_monitored_metric() {
    let p = tempfile::tempdir().unwrap();
    let args: Vec<&str> = ["-m"]
        .iter()
        .chain(SMALL)
        .chain(&[
            "+metrics.f1={_target_: torchmetrics.F1Score, task: multiclass, average: macro}",
            "callbacks.model_checkpoint.monitor=val/f1",
            "callbacks.model_checkpoint.mode=max",
            "optimizer.lr=0.001,0.003",
            "hydra.sweep.dir=logs/sweep",
            "trainer.max_epochs=1",
        ])
        .copied()
        .collect();
    let stdout = ok(&train(p.path(), &args));
    assert!(
        stdout.contains("| job | overrides | status | val/f1 ↑ |"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("| 0 |") && l.contains("| ok | 0.")),
        "{stdout}"
    );
    ok(&train(p.path(), &["logbook"]));
    let logbook = std::fs::read_to_string(p.path().join("logs/logbook.md")).unwrap();
    assert!(
        logbook.contains("- Best val/f1 (higher is better): **"),
        "{logbook}"
    );
    assert!(logbook.contains("| val/f1 ↑ |"), "{logbook}");
    assert!(logbook.contains("best val/f1 ↑"), "{logbook}");
    assert!(!logbook.contains("baseline"), "{logbook}");
    // No column every job leaves empty (the sweep has no top-5 column, for one).
    for line in logbook
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| job"))
    {
        assert!(
            !line.contains("| – | – |") || line.contains("no run directory"),
            "{line}"
        );
    }
    let picture = std::fs::read_dir(p.path().join("logs"))
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().contains("confusion"));
    assert!(picture && logbook.contains("confusion matrix"), "{logbook}");
}
