//! The user's `train` (trainyard's command line with this crate's model registered), run from this folder
//! as a user runs it: it trains and learns, its checkpoint resumes (only the remaining epoch runs), a bad
//! argument is refused with this project's file and line, and under `--features torch` it trains with DDP.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn train(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_train"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("TRAIN_CONFIG_PATH")
        .output()
        .unwrap()
}

/// A run into a fresh temp dir; panics with the output when it fails.
fn run(dir: &Path, extra: &[&str]) -> PathBuf {
    let out_dir = format!("hydra.run.dir={}", dir.display());
    let mut args = vec![
        "data.train_size=1024",
        "data.val_size=256",
        "data.batch_size=32",
        "data.num_workers=0",
        "optimizer.lr=0.01",
        "callbacks.model_checkpoint.save_top_k=-1",
        "callbacks.model_checkpoint.monitor=null",
        out_dir.as_str(),
    ];
    args.extend_from_slice(extra);
    let out = train(&args);
    assert!(
        out.status.success(),
        "train {}\n{}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    dir.to_path_buf()
}

fn summary(run: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap()
}

fn weights(run: &Path) -> Vec<(String, Vec<f32>)> {
    let ckpt =
        trainyard::storage::checkpoint::load(&run.join("checkpoints/last.safetensors")).unwrap();
    ckpt.state
        .into_iter()
        .filter(|(k, _)| !k.starts_with("optimizer."))
        .map(|(k, t)| (k, t.data))
        .collect()
}

#[test]
fn the_own_model_trains_learns_and_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let straight = run(&tmp.path().join("straight"), &["trainer.max_epochs=3"]);
    let s = summary(&straight);
    assert_eq!(s["model"], "registered", "{s}");
    let acc = s["final_metrics"]["val/acc1"].as_f64().unwrap();
    assert!(
        acc > 0.5,
        "val/acc1 {acc} is not far above chance (0.1): {s}"
    );
    let names: Vec<String> = weights(&straight).into_iter().map(|(k, _)| k).collect();
    for want in [
        "stem.weight",
        "conv.bias",
        "se.squeeze.weight",
        "se.excite.bias",
        "head.weight",
    ] {
        assert!(names.iter().any(|n| n == want), "no {want} in {names:?}");
    }

    let first = straight.join("checkpoints/epoch_000.safetensors");
    let ckpt = format!("ckpt_path={}", first.display());
    let resumed = run(
        &tmp.path().join("resumed"),
        &["trainer.max_epochs=3", &ckpt],
    );
    let csv = std::fs::read_to_string(resumed.join("metrics.csv")).unwrap();
    assert!(
        csv.lines().skip(1).all(|l| !l.starts_with("0,")),
        "the resumed run must not train epoch 0 again:\n{csv}"
    );
    assert_eq!(
        weights(&straight),
        weights(&resumed),
        "resumed != uninterrupted"
    );
}

#[test]
fn a_bad_argument_is_refused_with_where_it_was_set() {
    let out = train(&["model.reduction=0", "trainer.max_epochs=1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("reduction must be between 1 and width"),
        "{err}"
    );
    let out = train(&["+model.depth=3", "trainer.max_epochs=1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("model.depth"), "{err}");
    assert!(err.contains("unknown field `depth`"), "{err}");
    assert!(err.contains("+model.depth=3"), "{err}");
    let out = train(&["model.width=many", "trainer.max_epochs=1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("model.width"), "{err}");
    assert!(err.contains("model.width=many"), "{err}");
}

#[test]
fn help_lists_the_registered_model() {
    let out = train(&["--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("Models this program registered") && text.contains("own_model.models.SeNet"),
        "{text}"
    );
}

#[cfg(feature = "torch")]
#[test]
fn the_own_model_trains_with_ddp() {
    let tmp = tempfile::tempdir().unwrap();
    let run = run(
        &tmp.path().join("ddp"),
        &[
            "trainer=ddp_sim",
            "data.batch_size=16",
            "trainer.max_epochs=3",
        ],
    );
    let s = summary(&run);
    assert_eq!(s["strategy"], "ddp", "{s}");
    assert_eq!(s["devices"], 2, "{s}");
    let acc = s["final_metrics"]["val/acc1"].as_f64().unwrap();
    assert!(acc > 0.5, "val/acc1 {acc} is not far above chance: {s}");
}

/// The same model written with tch (`register_tch_model!`, same `_target_`) trains on libtorch, resumes
/// exactly, and trains with DDP over c10d.
#[cfg(feature = "torch")]
#[test]
fn the_tch_version_trains_resumes_and_runs_ddp() {
    let tmp = tempfile::tempdir().unwrap();
    let straight = run(
        &tmp.path().join("straight"),
        &["backend=tch", "trainer.max_epochs=3"],
    );
    let s = summary(&straight);
    assert_eq!(s["backend"], "tch", "{s}");
    let acc = s["final_metrics"]["val/acc1"].as_f64().unwrap();
    assert!(acc > 0.5, "val/acc1 {acc} is not far above chance: {s}");
    let names: Vec<String> = weights(&straight).into_iter().map(|(k, _)| k).collect();
    assert!(names.iter().any(|n| n == "se.squeeze.weight"), "{names:?}");
    let first = straight.join("checkpoints/epoch_000.safetensors");
    let ckpt = format!("ckpt_path={}", first.display());
    let resumed = run(
        &tmp.path().join("resumed"),
        &["backend=tch", "trainer.max_epochs=3", &ckpt],
    );
    assert_eq!(
        weights(&straight),
        weights(&resumed),
        "resumed != uninterrupted"
    );
    let ddp = run(
        &tmp.path().join("ddp"),
        &[
            "backend=tch",
            "trainer=ddp_sim",
            "data.batch_size=16",
            "trainer.max_epochs=2",
        ],
    );
    assert_eq!(summary(&ddp)["strategy"], "ddp");
}

/// `experiment=houses` into a fresh dir: the regression on data/houses.csv (checkpoints every epoch).
fn houses(dir: &Path, extra: &[&str]) -> PathBuf {
    let out_dir = format!("hydra.run.dir={}", dir.display());
    let mut args = vec![
        "experiment=houses",
        "trainer.max_epochs=6",
        "callbacks.model_checkpoint.save_top_k=-1",
        out_dir.as_str(),
    ];
    args.extend_from_slice(extra);
    let out = train(&args);
    assert!(
        out.status.success(),
        "train {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    dir.to_path_buf()
}

#[test]
fn the_house_price_regression_learns_reports_its_metrics_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let straight = houses(&tmp.path().join("straight"), &[]);
    let s = summary(&straight);
    let m = &s["final_metrics"];
    // Predicting the training mean misses validation prices by 1.35 on average.
    let mae = m["val/mae"].as_f64().unwrap();
    assert!(
        mae < 0.4,
        "val/mae {mae}: the regression did not learn: {s}"
    );
    assert!(m["val/mape"].as_f64().unwrap() < 10.0, "{s}");
    assert_eq!(s["best"]["monitor"], "val/mae", "{s}");
    assert!(m.get("val/acc1").is_none(), "{s}");
    let csv = std::fs::read_to_string(straight.join("metrics.csv")).unwrap();
    let header = csv.lines().next().unwrap();
    for column in ["train/mae", "train/mape", "val/loss", "val/mae", "val/mape"] {
        assert!(
            header.split(',').any(|c| c == column),
            "no {column} in {header}"
        );
    }

    let second = straight.join("checkpoints/epoch_001.safetensors");
    let resumed = houses(
        &tmp.path().join("resumed"),
        &[&format!("ckpt_path={}", second.display())],
    );
    assert_eq!(
        weights(&straight),
        weights(&resumed),
        "resumed != uninterrupted"
    );
}

#[test]
fn a_bad_table_argument_names_the_column_and_the_config_line() {
    let out = train(&["experiment=houses", "data.target=prise"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for want in ["data.target", "no column 'prise'", "data.target=prise"] {
        assert!(err.contains(want), "missing {want:?} in {err}");
    }
    let out = train(&["experiment=houses", "+data.shuffle=true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("unknown field `shuffle`"), "{err}");
}

#[cfg(feature = "torch")]
#[test]
fn the_house_price_regression_trains_with_ddp() {
    let tmp = tempfile::tempdir().unwrap();
    let run = houses(
        &tmp.path().join("ddp"),
        &["trainer=ddp_sim", "data.batch_size=32"],
    );
    let s = summary(&run);
    assert_eq!(s["strategy"], "ddp", "{s}");
    let mae = s["final_metrics"]["val/mae"].as_f64().unwrap();
    assert!(mae < 0.5, "val/mae {mae}: {s}");
}
