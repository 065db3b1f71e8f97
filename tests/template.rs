//! lightning-hydra-template's configs (tests/fixtures/template/configs, unchanged): its groups laid over a
//! trainyard project (Hydra `_target_` nodes naming Lightning's classes and the template's own
//! MNISTLitModule), and the template itself, `train -cp <template>/configs -cn train`, with its README's
//! commands, on MNIST in torchvision's folder.

use rstest::rstest;
mod common;
use common::{copy_dir, real_project, summary};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// This repository's conf/ and experiments/ with the template's groups laid over them.
fn project_with_template_groups() -> tempfile::TempDir {
    let p = real_project();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/template/configs");
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
fn runs_with_the_template_trainer_callbacks_and_csv_logger() {
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
    // Lightning's rule with patience 0: the first validation sets the best, the second (no 0.5 better)
    // stops the run.
    assert_eq!(
        s["epochs_completed"], 2,
        "stopped after the second epoch: {s}"
    );
    assert!(
        s["status"]
            .as_str()
            .unwrap_or_default()
            .starts_with("early stopped"),
        "{s}"
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
            // In a project of the template's modules a callback is a Lightning `_target_`, as there.
            "+callbacks.lr_monitor={_target_: lightning.pytorch.callbacks.LearningRateMonitor, logging_interval: epoch}",
            "hydra.run.dir=run",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let run = p.path().join("run");
    let s = summary(&run);
    assert_eq!(s["model"], "declared", "{s}");
    // 784·64+64 + 2·64 + 64·128+128 + 2·128 + 128·64+64 + 2·64 + 64·10+10: SimpleDenseNet's parameters.
    assert_eq!(s["num_parameters"], 67_978, "{s}");
    // The module's own names: top-1 as `val/acc` (what its ModelCheckpoint monitors), no top-5.
    let acc = s["final_metrics"]["val/acc"].as_f64().unwrap();
    assert!(acc > 0.4, "val/acc {acc} (chance 0.1): {s}");
    assert!(s["final_metrics"].get("val/acc5").is_none(), "{s}");
    assert!(s["final_metrics"]["val/acc_best"].as_f64().unwrap() >= acc);
    // The module's Adam (its moments in the checkpoint) at the module's rate, which ReduceLROnPlateau
    // (patience 10) left alone.
    let ckpt =
        trainyard::storage::checkpoint::load(&run.join("checkpoints/last.safetensors")).unwrap();
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

// ---- The template itself: its train.yaml / eval.yaml and README commands, unchanged configs ----

/// The template's project: its `configs/` and MNIST where its MNISTDataModule reads it
/// (`${paths.data_dir}/MNIST/raw/`, gzipped IDX as torchvision downloads it): `train` and `test` files of
/// 28×28 digits whose class is a bright square's place, so a dense net can learn them.
fn template_project(train: usize, test: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/template/configs");
    copy_dir(&fixtures, &dir.path().join("configs"));
    let raw = dir.path().join("data/MNIST/raw");
    std::fs::create_dir_all(&raw).unwrap();
    write_mnist(&raw, "train", train, 0);
    write_mnist(&raw, "t10k", test, 1_000);
    dir
}

fn write_mnist(dir: &Path, prefix: &str, n: usize, salt: usize) {
    use std::io::Write;
    let mut images = Vec::new();
    for v in [0x0803u32, n as u32, 28, 28] {
        images.extend_from_slice(&v.to_be_bytes());
    }
    let mut labels = Vec::new();
    for v in [0x0801u32, n as u32] {
        labels.extend_from_slice(&v.to_be_bytes());
    }
    for i in 0..n {
        let class = (i * 7 + salt) % 10;
        let (top, left) = (2 + (class / 5) * 13, 1 + (class % 5) * 5);
        let mut px = vec![0u8; 28 * 28];
        for (j, p) in px.iter_mut().enumerate() {
            let (y, x) = (j / 28, j % 28);
            let inside = (top..top + 8).contains(&y) && (left..left + 5).contains(&x);
            // A little noise that differs per image, so no two are the same.
            *p = if inside {
                255
            } else {
                ((i * 31 + j * 17) % 23) as u8
            };
        }
        images.extend_from_slice(&px);
        labels.push(class as u8);
    }
    for (name, bytes) in [("images-idx3-ubyte", images), ("labels-idx1-ubyte", labels)] {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&bytes).unwrap();
        std::fs::write(
            dir.join(format!("{prefix}-{name}.gz")),
            gz.finish().unwrap(),
        )
        .unwrap();
    }
}

/// `train -cp <project>/configs -cn <name> args...` from the project, as the template's `python
/// src/train.py args...` (its `PROJECT_ROOT` set, as its `.project-root` finder sets it).
fn template(root: &Path, name: &str, args: &[&str]) -> Output {
    let configs = root.join("configs");
    let mut all = vec!["-cp", configs.to_str().unwrap(), "-cn", name];
    all.extend_from_slice(args);
    train(root, &all)
}

/// `train eval -cp <project>/configs -cn eval args...`, as the template's `python src/eval.py args...`.
fn train_eval(root: &Path, args: &[&str]) -> Output {
    let configs = root.join("configs");
    let mut all = vec!["eval", "-cp", configs.to_str().unwrap(), "-cn", "eval"];
    all.extend_from_slice(args);
    train(root, &all)
}

/// The run directories under `logs/<task>/runs/`.
fn template_runs(root: &Path, task: &str) -> Vec<PathBuf> {
    let mut runs: Vec<PathBuf> = std::fs::read_dir(root.join("logs").join(task).join("runs"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    runs.sort();
    runs
}

/// 100 train + 20 test images, cut 80/20/20 (the template's 55k/5k/10k would need the real MNIST).
const SMALL_SPLIT: &str = "data.train_val_test_split=[80,20,20]";

/// `python src/train.py` as the template's README gives it: train, then test the best checkpoint, with
/// its extras (tags enforced and saved, the config printed and saved) and its metric names.
#[test]
fn the_templates_train_yaml_trains_and_tests_unchanged() {
    let p = template_project(100, 20);
    let out = template(p.path(), "train", &[SMALL_SPLIT, "trainer.max_epochs=3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let runs = template_runs(p.path(), "train");
    assert_eq!(runs.len(), 1, "{runs:?}");
    let run = &runs[0];
    let s = summary(run);
    let m = &s["final_metrics"];
    for key in [
        "train/loss",
        "train/acc",
        "val/acc",
        "val/acc_best",
        "test/loss",
        "test/acc",
    ] {
        assert!(m[key].is_number(), "{key} missing: {s}");
    }
    assert_eq!(s["epochs_completed"], 3, "{s}");
    // The template's batch of 128 over 80 training images: one step an epoch.
    assert_eq!(s["global_step"], 3, "{s}");
    // extras: print_config keeps the resolved config, enforce_tags the tags.
    let tree = std::fs::read_to_string(run.join("config_tree.log")).unwrap();
    assert!(
        tree.contains("MNISTDataModule") || tree.contains("train_val_test_split"),
        "{tree}"
    );
    let tags = std::fs::read_to_string(run.join("tags.log")).unwrap();
    assert!(tags.contains("dev"), "{tags}");
    // ModelCheckpoint: `epoch_{epoch:03d}` and last, in `${paths.output_dir}/checkpoints`.
    let ckpts: Vec<String> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(ckpts.iter().any(|c| c.starts_with("epoch_00")), "{ckpts:?}");
    // The template's `${task_name}.log` beside them.
    assert!(run.join("train.log").is_file());
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(log.contains("test  test/loss"), "{log}");
    assert!(log.contains("seed: null, so this run drew seed"), "{log}");

    // `python src/eval.py ckpt_path=...`: the best checkpoint tested again gives the same numbers.
    let best = s["best_checkpoint"].as_str().unwrap().to_string();
    let ckpt = format!("ckpt_path={best}");
    let out = train_eval(p.path(), &[SMALL_SPLIT, &ckpt]);
    assert!(out.status.success(), "{}", stderr(&out));
    let evals = template_runs(p.path(), "eval");
    assert_eq!(evals.len(), 1, "{evals:?}");
    let e = summary(&evals[0]);
    assert_eq!(
        e["epochs_completed"],
        s["best"]["epoch"].as_u64().unwrap() + 1,
        "{e}\n{s}"
    );
    for key in ["test/loss", "test/acc"] {
        assert_eq!(
            e["final_metrics"][key], m[key],
            "{key}: eval {e}\ntrain {s}"
        );
    }

    // `train predict` with the same eval.yaml: a row per test image, whose top-1 is the test's.
    let configs = p.path().join("configs");
    let args = [
        "predict",
        "-cp",
        configs.to_str().unwrap(),
        "-cn",
        "eval",
        SMALL_SPLIT,
        &ckpt,
    ];
    let out = train(p.path(), &args);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows = template_runs(p.path(), "eval")
        .into_iter()
        .find(|r| r.join("predictions.csv").is_file())
        .map(|r| std::fs::read_to_string(r.join("predictions.csv")).unwrap())
        .expect("a predict run");
    let rows: Vec<Vec<&str>> = rows
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 20);
    let hits = rows.iter().filter(|r| r[1] == r[2]).count() as f64;
    let acc = m["test/acc"].as_f64().unwrap();
    assert!((hits / 20.0 - acc).abs() < 1e-6, "{hits}/20 against {acc}");
}

/// `test: true` tests the best checkpoint, not the weights training ended with: ModelCheckpoint here keeps
/// the epoch of the highest `val/loss` (an early one), and the test's numbers are that checkpoint's, not
/// the last one's.
#[test]
fn the_test_after_fitting_is_the_best_checkpoints() {
    let p = template_project(100, 20);
    let args = [
        SMALL_SPLIT,
        "seed=3",
        "trainer.max_epochs=4",
        "callbacks.model_checkpoint.monitor=val/loss",
        "callbacks.model_checkpoint.mode=max",
    ];
    let out = template(p.path(), "train", &args);
    assert!(out.status.success(), "{}", stderr(&out));
    let s = summary(&template_runs(p.path(), "train")[0]);
    assert!(s["best"]["epoch"].as_u64().unwrap() < 3, "{s}");
    // Each evaluation in a directory of its own (two in one second would share the template's).
    let tested = |which: &str| {
        let ckpt = format!("ckpt_path={}", s[which].as_str().unwrap());
        let dir = format!("hydra.run.dir=evals/{which}");
        let out = train_eval(p.path(), &[SMALL_SPLIT, &ckpt, &dir]);
        assert!(out.status.success(), "{}", stderr(&out));
        summary(&p.path().join("evals").join(which))["final_metrics"]["test/loss"].clone()
    };
    let test_loss = &s["final_metrics"]["test/loss"];
    assert_eq!(&tested("best_checkpoint"), test_loss, "{s}");
    assert_ne!(&tested("last_checkpoint"), test_loss, "{s}");
}

/// A resumed run (`ckpt_path=last`) still tests the best checkpoint when no later epoch beats it: the
/// checkpoint names it (Lightning's `best_model_path`), so the test is the first run's.
#[test]
fn a_resumed_run_still_tests_the_best_checkpoint() {
    let p = template_project(100, 20);
    let base = [
        SMALL_SPLIT,
        "seed=3",
        "callbacks.model_checkpoint.monitor=val/loss",
        "callbacks.model_checkpoint.mode=max",
    ];
    let run = |dir: &str, extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let hydra_dir = format!("hydra.run.dir={dir}");
        args.push(&hydra_dir);
        let out = template(p.path(), "train", &args);
        assert!(out.status.success(), "{}", stderr(&out));
        summary(&p.path().join(dir))
    };
    let first = run("first", &["trainer.max_epochs=2"]);
    let last = p.path().join("first/checkpoints/last.safetensors");
    let ckpt = format!("ckpt_path={}", last.display());
    let resumed = run("resumed", &["trainer.max_epochs=4", &ckpt]);
    assert_eq!(
        resumed["best"]["epoch"], first["best"]["epoch"],
        "a later epoch won: {resumed}"
    );
    assert_eq!(
        resumed["best_checkpoint"], first["best_checkpoint"],
        "{resumed}"
    );
    assert_eq!(
        resumed["final_metrics"]["test/loss"], first["final_metrics"]["test/loss"],
        "{resumed}\n{first}"
    );
}

/// `trainer.detect_anomaly` (on in the template's debug configs) stops the run at the first step whose
/// gradients are not finite, naming it; the same run without it goes on (its loss stays finite).
#[test]
fn detect_anomaly_stops_at_the_first_nan_gradient() {
    let p = template_project(100, 20);
    let args = [
        SMALL_SPLIT,
        "seed=1",
        "model.optimizer.lr=1e30",
        "trainer.max_epochs=3",
    ];
    let out = template(p.path(), "train", &args);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut anomaly = args.to_vec();
    anomaly.push("+trainer.detect_anomaly=true");
    let out = template(p.path(), "train", &anomaly);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(
            "trainer.detect_anomaly: the gradients became NaN (their norm) at epoch 1, step 1"
        ),
        "{}",
        stderr(&out)
    );
}

/// `train eval` (the template's eval.py) is the same as `eval.yaml` with `train=false test=true`; its
/// `ckpt_path: ???` must be given.
#[test]
fn eval_needs_its_checkpoint_and_refuses_nothing_to_do() {
    let p = template_project(40, 10);
    let out = train_eval(p.path(), &[SMALL_SPLIT]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("ckpt_path"), "{}", stderr(&out));
    let out = template(
        p.path(),
        "train",
        &[
            "data.train_val_test_split=[30,10,10]",
            "train=false",
            "test=false",
        ],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("leaves nothing to do"),
        "{}",
        stderr(&out)
    );
    // logger=mlflow: its tracking_uri is a local `mlruns` folder, the file store MLflow 3 itself refuses
    // (maintenance mode); trainyard logs to a tracking server and says so.
    let out = template(
        p.path(),
        "train",
        &["data.train_val_test_split=[30,10,10]", "logger=mlflow"],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("tracking server"), "{}", stderr(&out));
    // extras.enforce_tags: an untagged run is refused, naming the fix.
    let out = template(
        p.path(),
        "train",
        &["data.train_val_test_split=[30,10,10]", "tags=[]"],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("extras.enforce_tags"),
        "{}",
        stderr(&out)
    );
}

/// The template README's commands that train, each with its own configs: they run, and do what they say.
#[rstest]
#[case::experiment_example(&["experiment=example"], "experiment")]
#[case::debug_fdr(&["debug=fdr"], "fdr")]
#[case::debug_overfit(&["debug=overfit", "trainer.max_epochs=3"], "overfit")]
#[case::debug_limit(&["debug=limit"], "limit")]
#[case::debug_profiler(&["debug=profiler"], "profiler")]
#[case::callbacks_default(&["callbacks=default", "trainer.max_epochs=2"], "checkpoints")]
#[case::logger_csv(&["logger=csv", "trainer.max_epochs=2"], "csv")]
#[case::logger_tensorboard(&["logger=tensorboard", "trainer.max_epochs=2"], "tensorboard")]
#[case::logger_wandb(&["logger=wandb", "trainer.max_epochs=2"], "wandb")]
fn the_templates_readme_commands_train(#[case] args: &[&str], #[case] what: &str) {
    let p = template_project(100, 20);
    let task = match what {
        "fdr" | "overfit" | "limit" | "profiler" => "debug",
        _ => "train",
    };
    let (run, s) = readme_command(p.path(), args, task);
    let run = &run;
    let resolved = std::fs::read_to_string(run.join(".hydra/config.yaml")).unwrap();
    match what {
        "experiment" => {
            // seed 12345, min/max_epochs 10, clipping 0.5, batch 64, SimpleDenseNet 128/256/64.
            assert_eq!(s["epochs_completed"], 10, "{s}");
            assert_eq!(s["batch_size"], 64, "{s}");
            let params = 784 * 128
                + 128
                + 2 * 128
                + 128 * 256
                + 256
                + 2 * 256
                + 256 * 64
                + 64
                + 2 * 64
                + 64 * 10
                + 10;
            assert_eq!(s["num_parameters"], params, "{s}");
            assert!(resolved.contains("seed: 12345"), "{resolved}");
            let log = std::fs::read_to_string(run.join("train.log")).unwrap();
            assert!(!log.contains("drew seed"), "{log}");
        }
        "fdr" => {
            // fast_dev_run: one batch of each, no checkpoints; detect_anomaly on.
            assert_eq!(s["global_step"], 1, "{s}");
            assert!(!run.join("checkpoints").exists());
            assert!(resolved.contains("detect_anomaly: true"), "{resolved}");
        }
        "overfit" => {
            // The split's 80 training samples are one batch of 128: that batch (of the 3 asked) is
            // trained on in each of 3 epochs, and memorised far past chance (0.1).
            assert_eq!(s["epochs_completed"], 3, "{s}");
            assert_eq!(s["global_step"], 3, "{s}");
            assert!(
                s["final_metrics"]["train/acc"].as_f64().unwrap() > 0.5,
                "{s}"
            );
            assert!(resolved.contains("overfit_batches: 3"), "{resolved}");
        }
        "limit" => {
            // 1% of the one training batch is still one; 3 epochs.
            assert_eq!(
                (s["epochs_completed"].as_u64(), s["global_step"].as_u64()),
                (Some(3), Some(3)),
                "{s}"
            );
            assert!(resolved.contains("limit_test_batches: 0.05"), "{resolved}");
        }
        "profiler" => {
            let log = std::fs::read_to_string(run.join("debug.log")).unwrap();
            assert!(
                log.contains("FIT Profiler Report") && log.contains("run_test"),
                "{log}"
            );
        }
        "checkpoints" => assert!(run.join("checkpoints/last.safetensors").is_file()),
        "csv" => {
            let rows = common::csv_rows(run);
            let test = rows.iter().find(|r| r.iter().any(|(k, _)| k == "test/acc"));
            assert!(test.is_some(), "no test row in metrics.csv: {rows:?}");
        }
        "tensorboard" => {
            let events = walk(run)
                .into_iter()
                .any(|f| f.to_string_lossy().contains("tfevents"));
            assert!(events, "no event file under {}", run.display());
        }
        "wandb" => {
            let offline = walk(run)
                .into_iter()
                .any(|f| f.to_string_lossy().ends_with(".wandb"));
            assert!(offline, "no W&B run under {}", run.display());
        }
        _ => unreachable!(),
    }
}

/// One of the README's commands on the template's project, which must succeed and test: its run
/// directory and summary.
fn readme_command(root: &Path, args: &[&str], task: &str) -> (PathBuf, serde_json::Value) {
    let mut all = vec![SMALL_SPLIT];
    all.extend_from_slice(args);
    let out = template(root, "train", &all);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    let runs = template_runs(root, task);
    assert_eq!(runs.len(), 1, "{runs:?}");
    let s = summary(&runs[0]);
    assert!(s["final_metrics"]["test/acc"].is_number(), "{args:?}: {s}");
    (runs[0].clone(), s)
}

/// `trainer=ddp trainer.devices=2` (the template's ddp.yaml, `sync_batchnorm` on) as two CPU processes:
/// c10d's collectives, so the torch build.
#[cfg(feature = "torch")]
#[test]
fn the_templates_ddp_trains_on_two_processes() {
    let p = template_project(100, 20);
    // Plain SGD for the comparison below: Adam's first steps move every weight by about ±lr whatever the
    // gradient's size, so a bias whose gradient is near zero flips with rounding.
    // The template draws a seed unless one is given: one seed for the three runs compared.
    let sgd = [
        "model.optimizer._target_=torch.optim.SGD",
        "model.optimizer.lr=0.1",
        "seed=12345",
    ];
    let args = [
        "trainer=ddp",
        "trainer.devices=2",
        "trainer.accelerator=cpu",
        "trainer.max_epochs=2",
        sgd[0],
        sgd[1],
        sgd[2],
    ];
    let (ddp_run, s) = readme_command(p.path(), &args, "train");
    assert_eq!(
        (s["strategy"].as_str(), s["devices"].as_u64()),
        (Some("ddp"), Some(2)),
        "{s}"
    );
    // The two processes took one process's steps over the same global batch (SyncBatchNorm: the global
    // batch's statistics), and those steps trained: the weights left where a rate of ~0 keeps them.
    let one = template_project(100, 20);
    let (single_run, _) = readme_command(
        one.path(),
        &["trainer.max_epochs=2", sgd[0], sgd[1], sgd[2]],
        "train",
    );
    let worst = common::worst_relative_difference(
        &common::weights(&ddp_run),
        &common::weights(&single_run),
    );
    assert!(
        worst < 1e-4,
        "DDP's weights differ from one process's by {worst:e}"
    );
    let still = template_project(100, 20);
    let (still_run, _) = readme_command(
        still.path(),
        &[
            "trainer.max_epochs=2",
            sgd[0],
            sgd[2],
            "model.optimizer.lr=1e-30",
        ],
        "train",
    );
    let moved = common::worst_relative_difference(
        &common::weights(&single_run),
        &common::weights(&still_run),
    );
    assert!(moved > 1e-3, "the weights moved only {moved:e}");
    // ddp_sim: Lightning's `ddp_spawn` on two CPU processes.
    let sim = template_project(100, 20);
    let (_, d) = readme_command(
        sim.path(),
        &["trainer=ddp_sim", "trainer.max_epochs=1"],
        "train",
    );
    assert_eq!(
        (d["strategy"].as_str(), d["devices"].as_u64()),
        (Some("ddp"), Some(2)),
        "{d}"
    );
    // The template's batch of 128 is the step's: 64 a process.
    assert_eq!(
        (s["batch_size"].as_u64(), s["global_batch_size"].as_u64()),
        (Some(64), Some(128)),
        "{s}"
    );
}

/// The template's `trainer=gpu` (`accelerator: gpu`, its configs naming no backend) runs on libtorch,
/// trainyard's GPU backend, not on the default Candle: on a GPU it trains; on this CPU machine the refusal is
/// the missing GPU's (a `torch` build) or the missing libtorch's (the default build), never Candle's. One
/// test per build, by name (CI's feature pass runs the names the default build lacks).
fn templates_gpu_trainer_runs_on_libtorch(expected_refusal: &str) {
    let p = template_project(100, 20);
    let out = template(p.path(), "train", &[SMALL_SPLIT, "trainer=gpu"]);
    if out.status.success() {
        let runs = template_runs(p.path(), "train");
        assert_eq!(summary(&runs[0])["backend"], "tch");
        return;
    }
    let err = stderr(&out);
    assert!(!err.contains("on backend=candle"), "{err}");
    assert!(
        err.contains(expected_refusal),
        "expected '{expected_refusal}' in:\n{err}"
    );
}

#[cfg(not(feature = "torch"))]
#[test]
fn the_templates_gpu_trainer_asks_for_libtorch_in_the_default_build() {
    templates_gpu_trainer_runs_on_libtorch("backend=tch: this build has no libtorch");
}

#[cfg(feature = "torch")]
#[test]
fn the_templates_gpu_trainer_runs_on_libtorch_in_a_torch_build() {
    templates_gpu_trainer_runs_on_libtorch("trainer.accelerator=gpu: libtorch's CUDA library");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        match entry.path().is_dir() {
            true => files.extend(walk(&entry.path())),
            false => files.push(entry.path()),
        }
    }
    files
}

/// `-m` sweeps: the template's multirun directory, a job per value, each trained and tested.
#[test]
fn a_multirun_sweep_over_the_template() {
    let p = template_project(100, 20);
    let out = template(
        p.path(),
        "train",
        &[
            "-m",
            SMALL_SPLIT,
            "trainer.max_epochs=1",
            "data.batch_size=32,64",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let sweeps: Vec<PathBuf> = std::fs::read_dir(p.path().join("logs/train/multiruns"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(sweeps.len(), 1, "{sweeps:?}");
    for (job, batch) in [("0", 32), ("1", 64)] {
        let s = summary(&sweeps[0].join(job));
        assert_eq!(s["batch_size"], batch, "{s}");
        assert!(s["final_metrics"]["test/acc"].is_number(), "{s}");
    }
}

/// `-m hparams_search=mnist_optuna experiment=example`: the template's Optuna search (TPE, its params on
/// the module's keys) optimising `val/acc_best`, shortened to 3 trials of 2 epochs.
#[test]
fn the_templates_optuna_search_runs() {
    let p = template_project(100, 20);
    let out = template(
        p.path(),
        "train",
        &[
            "-m",
            "hparams_search=mnist_optuna",
            "experiment=example",
            SMALL_SPLIT,
            "hydra.sweeper.n_trials=3",
            "trainer.min_epochs=1",
            "trainer.max_epochs=2",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let sweeps: Vec<PathBuf> = std::fs::read_dir(p.path().join("logs/train/multiruns"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(sweeps.len(), 1, "{sweeps:?}");
    let trials: Vec<serde_json::Value> = (0..3)
        .map(|i| summary(&sweeps[0].join(i.to_string())))
        .collect();
    let batches: Vec<u64> = trials
        .iter()
        .map(|s| s["batch_size"].as_u64().unwrap())
        .collect();
    assert!(
        batches.iter().all(|b| [32, 64, 128, 256].contains(b)),
        "{batches:?}"
    );
    // The sampler chose each trial's learning rate (experiment=example's is 0.002): three different ones.
    let lrs: Vec<String> = (0..3)
        .map(|i| {
            let config =
                std::fs::read_to_string(sweeps[0].join(format!("{i}/.hydra/config.yaml"))).unwrap();
            let optimizer = &config[config.find("optimizer:").unwrap()..];
            let line = optimizer
                .lines()
                .find(|l| l.trim_start().starts_with("lr:"))
                .unwrap();
            line.trim().to_string()
        })
        .collect();
    assert!(
        lrs[0] != lrs[1]
            && lrs[1] != lrs[2]
            && lrs[0] != lrs[2]
            && !lrs.contains(&"lr: 0.002".into()),
        "{lrs:?}"
    );
    // The study optimised the template's metric, as its logbook section says.
    let logbook = std::fs::read_to_string(sweeps[0].join("logbook.md")).unwrap();
    assert!(logbook.contains("maximize `val/acc_best`"), "{logbook}");
}

/// The template cuts MNIST with `random_split(..., generator=torch.Generator().manual_seed(42))`: the
/// same permutation as PyTorch's, all 70,000 places (torch oracle).
#[test]
fn the_split_is_pytorchs_random_split() {
    let Some(python) = common::torch_python() else {
        return;
    };
    let out = Command::new(python)
        .args([
            "-c",
            "import torch\n\
             from torch.utils.data import random_split\n\
             parts = random_split(range(70000), [55000, 5000, 10000], generator=torch.Generator().manual_seed(42))\n\
             print(' '.join(str(i) for p in parts for i in p.indices))",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let torch: Vec<usize> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    assert_eq!(torch, trainyard::data::split::torch_randperm(70000, 42));
}
