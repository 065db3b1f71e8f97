//! Tasks beyond classification, measured as a Lightning user measures them (torchmetrics' metrics over
//! whole epochs, declared in the config, nothing global in the crate): the U-Net segments the generated
//! shapes (mean IoU and Dice lead the run: console, metrics.csv, ModelCheckpoint, logbook), and the house
//! price regression reports R², whose value `train predict`'s rows reproduce.

mod common;
use common::{summary, train};
use std::path::{Path, PathBuf};

/// `train <args> hydra.run.dir=<dir>`: its stdout; panics with both streams when it fails.
fn ok(dir: &Path, args: &[&str]) -> String {
    let out_dir = format!("hydra.run.dir={}", dir.display());
    let args = [args, &[out_dir.as_str()]].concat();
    let out = train(&args);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "train {}\n{stdout}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_unet_segments_the_shapes_and_mean_iou_leads_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("shapes");
    let stdout = ok(&run, &["experiment=shapes"]);
    let s = summary(&run);
    let m = &s["final_metrics"];
    // Labelling every pixel background scores a mean IoU of ~0.27.
    let miou = m["val/miou"].as_f64().unwrap();
    assert!(miou > 0.75, "val/miou {miou}: the U-Net did not learn: {s}");
    assert!(m["val/dice"].as_f64().unwrap() > 0.75, "{s}");
    assert_eq!(s["best"]["monitor"], "val/miou", "{s}");
    assert_eq!(s["lead"]["name"], "val/miou", "{s}");
    assert!(stdout.contains("val/miou"), "{stdout}");
    let header = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let header = header.lines().next().unwrap();
    for column in ["train/miou", "val/miou", "val/dice", "val/acc"] {
        assert!(header.split(',').any(|c| c == column), "{column}: {header}");
    }
    let logbook = tmp.path().join("logbook.md");
    let out = train(&[
        "logbook",
        &run.display().to_string(),
        "-o",
        &logbook.display().to_string(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&logbook).unwrap();
    assert!(text.contains("val/miou"), "{text}");

    // A mask is not a row: predicting says so, and what to use.
    let out = train(&[
        "predict",
        "experiment=shapes",
        &format!(
            "ckpt_path={}",
            run.join("checkpoints/last.safetensors").display()
        ),
        &format!("hydra.run.dir={}", tmp.path().join("pred").display()),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("one row per input") && err.contains("[3, 16, 16]"),
        "{err}"
    );
}

/// The rows' R², in f64.
fn r2(rows: &[(f64, f64)]) -> f64 {
    let n = rows.len() as f64;
    let mean = rows.iter().map(|(t, _)| t).sum::<f64>() / n;
    let total: f64 = rows.iter().map(|(t, _)| (t - mean).powi(2)).sum();
    let residual: f64 = rows.iter().map(|(t, v)| (t - v).powi(2)).sum();
    1.0 - residual / total
}

#[test]
fn the_regression_reports_r2_and_its_predictions_reproduce_it() {
    let tmp = tempfile::tempdir().unwrap();
    let fit = tmp.path().join("fit");
    ok(&fit, &["experiment=houses", "trainer.max_epochs=6"]);
    let s = summary(&fit);
    let fitted = s["final_metrics"]["val/r2"].as_f64().unwrap();
    assert!(fitted > 0.8, "val/r2 {fitted}: {s}");

    let ckpt = format!(
        "ckpt_path={}",
        fit.join("checkpoints/last.safetensors").display()
    );
    let eval = tmp.path().join("eval");
    ok(&eval, &["eval", "experiment=houses", &ckpt]);
    let tested = summary(&eval)["final_metrics"]["test/r2"].as_f64().unwrap();

    let pred = tmp.path().join("pred");
    let stdout = ok(&pred, &["predict", "experiment=houses", &ckpt]);
    assert!(stdout.contains("of the test split"), "{stdout}");
    let text = std::fs::read_to_string(pred.join("predictions.csv")).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("index,target,value"));
    let rows: Vec<(f64, f64)> = lines
        .map(|l| {
            let cells: Vec<f64> = l.split(',').map(|c| c.parse().unwrap()).collect();
            (cells[1], cells[2])
        })
        .collect();
    assert!(!rows.is_empty());
    let from_rows = r2(&rows);
    assert!(
        (from_rows - tested).abs() < 1e-4,
        "R² of the predicted rows {from_rows}, train eval's test/r2 {tested}"
    );
}

#[test]
fn the_regression_predicts_the_same_rows_with_ddp() {
    if !cfg!(feature = "torch") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let fit: PathBuf = tmp.path().join("fit");
    ok(&fit, &["experiment=houses", "trainer.max_epochs=2"]);
    let ckpt = format!(
        "ckpt_path={}",
        fit.join("checkpoints/last.safetensors").display()
    );
    let one = tmp.path().join("one");
    ok(&one, &["predict", "experiment=houses", &ckpt]);
    let two = tmp.path().join("two");
    ok(
        &two,
        &["predict", "experiment=houses", "trainer=ddp_sim", &ckpt],
    );
    let read = |dir: &Path| -> Vec<Vec<f64>> {
        let text = std::fs::read_to_string(dir.join("predictions.csv")).unwrap();
        let rows = text.lines().skip(1);
        rows.map(|l| l.split(',').map(|c| c.parse().unwrap()).collect())
            .collect()
    };
    let (a, b) = (read(&one), read(&two));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x[..2], y[..2], "the same input, the same target");
        assert!(
            (x[2] - y[2]).abs() <= 1e-5 * x[2].abs().max(1.0),
            "{x:?} {y:?}"
        );
    }
}

/// The crate's R² is what an Optuna search optimises: the sweep's table and its logbook section lead with
/// it, and the study's results name its best value.
#[test]
fn an_optuna_search_optimises_the_regressions_r2() {
    let tmp = tempfile::tempdir().unwrap();
    let sweep = tmp.path().join("sweep");
    let out = train(&[
        "-m",
        "experiment=houses",
        "+hparams_search=quickstart_optuna",
        "optimized_metric=val/r2",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.pruner=null",
        "trainer.max_epochs=2",
        &format!("hydra.sweep.dir={}", sweep.display()),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("val/r2 ↑"), "{stdout}");
    let results = std::fs::read_to_string(sweep.join("optimization_results.yaml")).unwrap();
    assert!(results.contains("best_value: 0."), "{results}");
    let logbook = tmp.path().join("logbook.md");
    let out = train(&[
        "logbook",
        &sweep.display().to_string(),
        "-o",
        &logbook.display().to_string(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&logbook).unwrap();
    assert!(text.contains("Best val/r2 (higher is better)"), "{text}");
}

/// F1 on the crate's own classifier, declared on the command line as a Lightning user adds a metric.
#[test]
fn the_classifier_reports_f1() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("f1");
    let stdout = ok(
        &run,
        &[
            "data.train_size=256",
            "data.val_size=64",
            "trainer.max_epochs=1",
            "+metrics.f1={_target_: torchmetrics.F1Score, task: multiclass, average: macro}",
        ],
    );
    assert!(stdout.contains("val/f1"), "{stdout}");
    let f1 = summary(&run)["final_metrics"]["val/f1"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&f1), "{f1}");
}
