//! A user copies lightning-hydra-template's `trainer/`, `callbacks/`, `logger/`, `paths/` and `model/`
//! groups (Hydra `_target_` nodes naming Lightning's classes and the template's own MNISTLitModule) into a
//! trainyard project and trains with them.

use rstest::rstest;
mod common;
use common::{copy_dir, real_project, summary};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// This repository's conf/ and experiments/ with the template's groups laid over them.
fn project_with_template_groups() -> tempfile::TempDir {
    let p = real_project();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/template");
    for group in ["trainer", "callbacks", "logger", "paths", "model"] {
        copy_dir(&fixtures.join(group), &p.path().join("conf").join(group));
    }
    p
}

fn train(root: &Path, args: &[&str]) -> Output {
    Command::new(common::TRAIN)
        .args(args)
        .current_dir(root)
        .env_remove("TRAIN_CONFIG_PATH")
        .env("PROJECT_ROOT", root)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// The template monitors its own module's `val/acc`; trainyard logs `val/acc1`.
const MONITOR: &[&str] = &[
    "callbacks.model_checkpoint.monitor=val/acc1",
    "data.train_size=128",
    "data.val_size=64",
    "model.channels=[4]",
];

/// The template's trainer, callbacks and CSV logger on the quick start, then `extra`.
fn template_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "experiment=quickstart",
        "trainer=cpu",
        "callbacks=default",
        "logger=csv",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(MONITOR);
    args
}

/// A run with the template's groups and `extra`, which must succeed; its run directory.
fn run_with_template(p: &Path, extra: &[&str]) -> PathBuf {
    let out = train(p, &template_args(extra));
    assert!(out.status.success(), "{}", stderr(&out));
    only_run(p)
}

fn only_run(root: &Path) -> PathBuf {
    let runs: Vec<PathBuf> = std::fs::read_dir(root.join("logs/quickstart/runs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs[0].clone()
}

#[test]
fn trains_with_the_template_trainer_callbacks_and_csv_logger() {
    let p = project_with_template_groups();
    let run = run_with_template(p.path(), &["trainer.max_epochs=3"]);
    let s = summary(&run);
    assert_eq!(s["epochs_completed"], 3, "trainer.max_epochs honoured: {s}");
    // ModelCheckpoint's dirpath is `${paths.output_dir}/checkpoints`, its filename `epoch_{epoch:03d}`.
    let ckpts: Vec<String> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    assert!(ckpts.iter().any(|c| c.starts_with("epoch_0")), "{ckpts:?}");
    assert!(
        ckpts.iter().any(|c| c.starts_with("last")),
        "save_last: {ckpts:?}"
    );
    let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    assert!(csv.lines().count() > 3, "{csv}");
    // paths.work_dir is `${hydra:runtime.cwd}`: where the run was launched.
    let resolved = std::fs::read_to_string(run.join(".hydra/resolved.yaml")).unwrap();
    assert!(resolved.contains("work_dir: /"), "{resolved}");
}

#[test]
fn early_stopping_from_the_template_stops_the_run() {
    let p = project_with_template_groups();
    // EarlyStopping with patience 0 on a metric that cannot improve after the first epoch (lr 0).
    let run = run_with_template(
        p.path(),
        &[
            "trainer.max_epochs=5",
            "optimizer.lr=1e-9",
            "scheduler=constant",
            "+callbacks.early_stopping={_target_: lightning.pytorch.callbacks.EarlyStopping, monitor: val/loss, patience: 0, mode: min, min_delta: 0.5}",
        ],
    );
    let s = summary(&run);
    assert!(
        s["epochs_completed"].as_u64().unwrap() < 5,
        "stopped early: {s}"
    );
}

/// The template's `debug/profiler.yaml` sets `trainer.profiler: "simple"` on its Trainer: the run ends with
/// SimpleProfiler's report, as under Lightning.
#[test]
fn the_template_trainer_takes_the_simple_profiler() {
    let p = project_with_template_groups();
    let run = run_with_template(
        p.path(),
        &["trainer.max_epochs=1", "+trainer.profiler=simple"],
    );
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(log.contains("FIT Profiler Report"), "{log}");
    assert!(summary(&run)["profile"].is_array());
}

#[rstest]
#[case::comet(&["+logger.comet._target_=lightning.pytorch.loggers.CometLogger"], "CometLogger")]
#[case::user_module(&["+model._target_=src.models.cifar_module.CifarLitModule"], "is Python code of your project")]
#[case::lit_module_without_net(&["+model._target_=src.models.mnist_module.MNISTLitModule"], "MNISTLitModule needs its net")]
#[case::unknown_callback(&["+callbacks.swa._target_=lightning.pytorch.callbacks.StochasticWeightAveraging"], "StochasticWeightAveraging is not one trainyard knows")]
#[case::advanced_profiler(&["+trainer.profiler=advanced"], "cProfile")]
#[case::unknown_trainer_key(&["+trainer.reload_dataloaders_every_n_epochs=1"], "reload_dataloaders_every_n_epochs")]
fn what_cannot_run_is_refused_with_the_reason(#[case] extra: &[&str], #[case] expected: &str) {
    let p = project_with_template_groups();
    let out = train(p.path(), &template_args(extra));
    assert!(!out.status.success(), "{extra:?} ran");
    let err = stderr(&out);
    assert!(err.contains(expected), "{extra:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// The template's `model=mnist` (its MNISTLitModule: SimpleDenseNet, a partial Adam and ReduceLROnPlateau
/// on `val/loss`) trains as the declared network it is, with the template's trainer and callbacks.
#[test]
fn the_template_lit_module_trains_as_its_dense_net() {
    let p = project_with_template_groups();
    let out = train(
        p.path(),
        &[
            "model=mnist",
            // The module builds its optimizer and scheduler: the project's own are removed.
            "~optimizer",
            "~scheduler",
            "trainer=cpu",
            "callbacks=default",
            "logger=csv",
            "data=synthetic",
            "data.channels=1",
            "data.image_size=28",
            "data.train_size=1024",
            "data.val_size=128",
            "data.num_workers=0",
            "trainer.max_epochs=4",
            "callbacks.model_checkpoint.monitor=val/acc1",
            "+callbacks.lr_monitor.logging_interval=epoch",
            "hydra.run.dir=run",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let run = p.path().join("run");
    let s = summary(&run);
    assert_eq!(s["model"], "declared", "{s}");
    // 784·64+64 + 2·64 + 64·128+128 + 2·128 + 128·64+64 + 2·64 + 64·10+10: SimpleDenseNet's parameters.
    assert_eq!(s["num_parameters"], 67_978, "{s}");
    let acc = s["final_metrics"]["val/acc1"].as_f64().unwrap();
    assert!(acc > 0.4, "val/acc1 {acc} (chance 0.1): {s}");
    // The module's Adam (its moments in the checkpoint) at the module's rate, which ReduceLROnPlateau
    // (patience 10) left alone.
    let ckpt = trainyard::checkpoint::load(&run.join("checkpoints/last.safetensors")).unwrap();
    assert!(
        ckpt.state.keys().any(|k| k.ends_with("exp_avg_sq")),
        "no Adam state"
    );
    let lrs: Vec<f64> = common::csv_rows(&run)
        .iter()
        .filter(|r| r.iter().any(|(k, _)| k == "val/loss"))
        .filter_map(|r| r.iter().find(|(k, _)| k == "lr").map(|(_, v)| *v))
        .collect();
    assert_eq!(lrs, vec![0.001; 4]);

    // The project's optimizer beside the module's would be ignored: refused.
    let out = train(p.path(), &["model=mnist"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("builds its own optimizer"),
        "{}",
        stderr(&out)
    );

    // Another net than SimpleDenseNet is the project's own Python code.
    let out = train(
        p.path(),
        &[
            "model=mnist",
            "model.net._target_=src.models.components.unet.UNet",
        ],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("net is src.models.components.simple_dense_net.SimpleDenseNet here"),
        "{}",
        stderr(&out)
    );
}
