//! The user's `train` (trainyard's command line with this crate's model registered), run from this folder
//! as a user runs it: it trains and learns, its checkpoint resumes (only the remaining epoch runs), a bad
//! argument is refused with this project's file and line, and under `--features torch` it trains with DDP.

mod common;
use common::{summary, train};
use std::path::{Path, PathBuf};

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
    assert!(
        text.contains("Optimizers this program registered (optimizer: {_target_: NAME, ...}): own_model.optim.Lion"),
        "{text}"
    );
    assert!(text.contains("own_model.schedules.WarmupCosine"), "{text}");
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
    fit(
        dir,
        &[
            &[
                "experiment=houses",
                "trainer.max_epochs=6",
                "callbacks.model_checkpoint.save_top_k=-1",
            ],
            extra,
        ]
        .concat(),
    )
}

/// `train <args> hydra.run.dir=<dir>`; panics with the error output when it fails.
fn fit(dir: &Path, args: &[&str]) -> PathBuf {
    let out_dir = format!("hydra.run.dir={}", dir.display());
    let args = [args, &[out_dir.as_str()]].concat();
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

/// `experiment=houses_shards` into a fresh dir: the table read as CSV shards (src/houses/shards.rs).
fn house_shards(dir: &Path, extra: &[&str]) -> PathBuf {
    fit(
        dir,
        &[&["experiment=houses_shards", "trainer.max_epochs=5"], extra].concat(),
    )
}

/// The table streamed from six CSV shards learns as the indexed table does, and a run stopped in its
/// second epoch (19 batches each) resumes at the next unread row and ends equal to an uninterrupted one.
#[test]
fn the_house_prices_streamed_from_csv_shards_learn_and_resume_mid_epoch() {
    let tmp = tempfile::tempdir().unwrap();
    let straight = house_shards(&tmp.path().join("straight"), &[]);
    let s = summary(&straight);
    let mae = s["final_metrics"]["val/mae"].as_f64().unwrap();
    assert!(
        mae < 0.4,
        "val/mae {mae}: the regression did not learn: {s}"
    );
    assert_eq!(s["global_step"], 5 * 19, "{s}");
    let stopped = house_shards(&tmp.path().join("stopped"), &["trainer.max_steps=30"]);
    let last = stopped.join("checkpoints/last.safetensors");
    let resumed = house_shards(
        &tmp.path().join("resumed"),
        &[&format!("ckpt_path={}", last.display())],
    );
    assert_eq!(
        weights(&straight),
        weights(&resumed),
        "resumed != uninterrupted"
    );
}

/// Two ranks read three of the six shards each, a new split every epoch.
#[cfg(feature = "torch")]
#[test]
fn the_house_prices_streamed_from_csv_shards_train_with_ddp() {
    let tmp = tempfile::tempdir().unwrap();
    let run = house_shards(
        &tmp.path().join("ddp"),
        &["trainer=ddp_sim", "data.batch_size=32"],
    );
    let s = summary(&run);
    assert_eq!(s["strategy"], "ddp", "{s}");
    assert_eq!(
        s["global_step"],
        5 * 19,
        "600 rows a rank in batches of 32: {s}"
    );
    let mae = s["final_metrics"]["val/mae"].as_f64().unwrap();
    assert!(mae < 0.5, "val/mae {mae}: {s}");
}

/// This project's optimizer (src/lion.rs) and schedule (src/warmup_cosine.rs), chosen as config groups:
/// the model learns, and Lion's state is in the checkpoint under the parameters' names.
#[test]
fn the_own_optimizer_and_schedule_train_the_model() {
    let tmp = tempfile::tempdir().unwrap();
    let run = run(
        &tmp.path().join("lion"),
        &[
            "optimizer=lion",
            "optimizer.lr=0.01",
            "scheduler=warmup_cosine",
            "trainer.max_epochs=3",
        ],
    );
    let s = summary(&run);
    let acc = s["final_metrics"]["val/acc1"].as_f64().unwrap();
    assert!(acc > 0.5, "val/acc1 {acc} is not far above chance: {s}");
    let ckpt =
        trainyard::storage::checkpoint::load(&run.join("checkpoints/last.safetensors")).unwrap();
    let head = &ckpt.state["head.weight"];
    let slot = &ckpt.state["optimizer.head.weight.exp_avg"];
    assert_eq!(slot.shape, head.shape);
    assert!(slot.data.iter().any(|v| *v != 0.0));
}

/// The largest relative difference between two runs' weights, tensor by tensor.
#[cfg(feature = "torch")]
fn worst_relative_difference(a: &Path, b: &Path) -> f64 {
    worst_of(&weights(a), &weights(b))
}

/// The largest relative difference between two lists of named tensors (the same names, in order);
/// fails on a length mismatch or a value that is not finite.
#[cfg(feature = "torch")]
fn worst_of(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f64 {
    assert!(!a.is_empty(), "nothing to compare");
    assert_eq!(
        a.iter().map(|(k, _)| k).collect::<Vec<_>>(),
        b.iter().map(|(k, _)| k).collect::<Vec<_>>()
    );
    a.iter()
        .zip(b)
        .map(|((k, x), (_, y))| {
            assert_eq!(x.len(), y.len(), "{k}");
            assert!(x.iter().chain(y).all(|v| v.is_finite()), "{k}: not finite");
            let diff: f64 = x.iter().zip(y).map(|(p, q)| f64::from(p - q).powi(2)).sum();
            let norm: f64 = y.iter().map(|q| f64::from(*q).powi(2)).sum();
            (diff / norm.max(1e-24)).sqrt()
        })
        .fold(0.0, f64::max)
}

/// Lion on libtorch, and under FSDP on two processes (its state sharded with the parameters; the
/// consolidated checkpoint holds it whole); FSDP's steps are DDP's.
#[cfg(feature = "torch")]
#[test]
fn the_own_optimizer_runs_on_libtorch_and_shards_under_fsdp() {
    let tmp = tempfile::tempdir().unwrap();
    let lion = [
        "optimizer=lion",
        "optimizer.lr=0.002",
        "trainer.max_epochs=2",
    ];
    let tch = run(
        &tmp.path().join("tch"),
        &[&lion[..], &["backend=tch"]].concat(),
    );
    let acc = summary(&tch)["final_metrics"]["val/acc1"].as_f64().unwrap();
    assert!(acc > 0.4, "val/acc1 {acc} is not far above chance");
    let two = ["data.batch_size=16", "trainer.sync_batchnorm=false"];
    let fsdp = run(
        &tmp.path().join("fsdp"),
        &[&lion[..], &two[..], &["trainer=fsdp_sim"]].concat(),
    );
    let ddp = run(
        &tmp.path().join("ddp"),
        &[&lion[..], &two[..], &["trainer=ddp_sim"]].concat(),
    );
    assert_eq!(summary(&fsdp)["strategy"], "fsdp");
    let ckpt =
        trainyard::storage::checkpoint::load(&fsdp.join("checkpoints/last.safetensors")).unwrap();
    assert_eq!(
        ckpt.state["optimizer.stem.weight.exp_avg"].shape,
        ckpt.state["stem.weight"].shape
    );
    let worst = worst_relative_difference(&fsdp, &ddp);
    assert!(worst < 1e-3, "FSDP and DDP differ by {worst:e}");
    let slots = worst_slot_difference(&fsdp, &ddp);
    assert!(
        slots < 1e-3,
        "FSDP's and DDP's Lion momenta differ by {slots:e}"
    );
    // On libtorch the sharded rule runs on the device's flat slices (trainyard's zoo cnn: a registered
    // libtorch module keeps its own tensors and is not sharded).
    let tch = ["backend=tch", "model=cnn"];
    let fsdp = run(
        &tmp.path().join("fsdp-tch"),
        &[&lion[..], &two[..], &tch[..], &["trainer=fsdp_sim"]].concat(),
    );
    let ddp = run(
        &tmp.path().join("ddp-tch"),
        &[&lion[..], &two[..], &tch[..], &["trainer=ddp_sim"]].concat(),
    );
    assert_eq!(summary(&fsdp)["backend"], "tch");
    let worst = worst_relative_difference(&fsdp, &ddp);
    assert!(worst < 1e-3, "FSDP and DDP differ on libtorch by {worst:e}");
    let slots = worst_slot_difference(&fsdp, &ddp);
    assert!(
        slots < 1e-3,
        "libtorch: FSDP's and DDP's Lion momenta differ by {slots:e}"
    );
}

/// The largest relative difference between two runs' Lion momenta (`optimizer.<param>.exp_avg`).
#[cfg(feature = "torch")]
fn worst_slot_difference(a: &Path, b: &Path) -> f64 {
    let slots = |run: &Path| {
        let ckpt = trainyard::storage::checkpoint::load(&run.join("checkpoints/last.safetensors"))
            .unwrap();
        let mut out: Vec<(String, Vec<f32>)> = ckpt
            .state
            .into_iter()
            .filter(|(k, _)| k.ends_with(".exp_avg"))
            .map(|(k, t)| (k, t.data))
            .collect();
        out.sort_by(|x, y| x.0.cmp(&y.0));
        out
    };
    worst_of(&slots(a), &slots(b))
}

/// The house-price regression (this project's dataset, model and loss with its metrics) under FSDP: the
/// model is one FSDP unit, the loss and its metrics are computed by the sharded step, and it takes
/// DDP's steps.
#[cfg(feature = "torch")]
#[test]
fn the_house_price_regression_shards_under_fsdp() {
    let tmp = tempfile::tempdir().unwrap();
    let two = ["trainer.max_epochs=3", "data.batch_size=16"];
    let fsdp = houses(
        &tmp.path().join("fsdp"),
        &[&two[..], &["trainer=fsdp_sim"]].concat(),
    );
    let ddp = houses(
        &tmp.path().join("ddp"),
        &[&two[..], &["trainer=ddp_sim"]].concat(),
    );
    let s = summary(&fsdp);
    assert_eq!(s["strategy"], "fsdp", "{s}");
    let (f, d) = (&s["final_metrics"], &summary(&ddp)["final_metrics"]);
    for key in ["val/loss", "val/mae", "val/mape"] {
        let (x, y) = (f[key].as_f64().unwrap(), d[key].as_f64().unwrap());
        assert!(
            (x - y).abs() <= 1e-4 * y.abs().max(1.0),
            "{key}: fsdp {x}, ddp {y}"
        );
    }
    let worst = worst_relative_difference(&fsdp, &ddp);
    assert!(worst < 1e-4, "FSDP and DDP differ by {worst:e}");
}
