//! Training end to end on the default (Candle, CPU) build, in throwaway projects with generated data.

mod common;
use common::{real_project, summary, train};
use std::path::{Path, PathBuf};
use trainyard::storage::checkpoint;

fn only_run(root: &Path, task: &str) -> PathBuf {
    let mut runs: Vec<PathBuf> = std::fs::read_dir(root.join("logs").join(task).join("runs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    runs.sort();
    runs.pop().unwrap()
}

/// The README's quick start: a small CNN on generated images learns far above chance (10 classes: 10%).
#[test]
fn quickstart_learns() {
    let p = real_project();
    let out = train(p.path(), &["experiment=quickstart"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    let run = only_run(p.path(), "quickstart");
    let s = summary(&run);
    let acc = s["final_metrics"]["val/acc1"].as_f64().unwrap();
    assert!(acc > 0.5, "val/acc1 {acc} is not far above chance:\n{text}");
    assert_eq!(s["epochs_completed"], 2);
    assert!(run.join("metrics.csv").is_file());
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(
        log.contains("epoch 2/2") && log.contains("val/acc1"),
        "{log}"
    );
    assert!(run.join("checkpoints/last.safetensors").is_file());
    let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    assert!(csv.starts_with("epoch,step,lr,train/loss"), "{csv}");
    // The default callbacks record device stats (the logbook's memory and GPU columns).
    assert!(s["device_stats"]["samples"].as_u64().unwrap() >= 1, "{s}");
    assert!(csv
        .lines()
        .next()
        .unwrap()
        .contains("device/rss_bytes_mean"));
}

const SMALL: &[&str] = &[
    "experiment=quickstart",
    "data.train_size=256",
    "data.val_size=128",
    "data.batch_size=32",
    "model.channels=[8,16]",
    "data.num_workers=0",
];

/// Train a quickstart run that must succeed; returns its summary and removes `logs/` for the next run.
fn run_once(project: &Path, args: &[&str]) -> serde_json::Value {
    let out = train(project, args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = summary(&only_run(project, "quickstart"));
    std::fs::remove_dir_all(project.join("logs")).unwrap();
    s
}

/// Tiny CIFAR-10 binary files (the real format) under `<project>/data/cifar`, with learnable images.
fn write_tiny_cifar(project: &Path) -> String {
    let dir = project.join("data/cifar");
    write_cifar_files(&dir);
    format!("data.root={}", dir.display())
}

/// The six CIFAR-10 binary files, 16 generated images each, in `dir`.
fn write_cifar_files(dir: &Path) {
    use trainyard::data::{cifar, synthetic::Synthetic, Dataset, Split};
    std::fs::create_dir_all(dir).unwrap();
    let source = Synthetic::with_shape(96, 32, 3, 10, 11, Split::Train);
    let items = |range: std::ops::Range<usize>| -> Vec<(u32, Vec<u8>)> {
        range
            .map(|i| source.get(i).map(|img| (img.label, img.pixels)).unwrap())
            .collect()
    };
    for (k, name) in cifar::Cifar::files(cifar::Variant::Cifar10, Split::Train)
        .iter()
        .enumerate()
    {
        cifar::write_records(
            &dir.join(name),
            cifar::Variant::Cifar10,
            &items(k * 16..k * 16 + 16),
        )
        .unwrap();
    }
    cifar::write_records(
        &dir.join("test_batch.bin"),
        cifar::Variant::Cifar10,
        &items(80..96),
    )
    .unwrap();
}

/// Same config and seed → bit-identical results; an interrupted run resumed from its last checkpoint
/// ends with the same weights as an uninterrupted one. On generated data and on real CIFAR-10 files.
#[rstest::rstest]
#[case::synthetic(false)]
#[case::cifar10_binary(true)]
fn deterministic_and_resume_is_exact(#[case] cifar: bool) {
    let p = real_project();
    let cifar_args: Vec<String> = if cifar {
        vec![
            "data=cifar10".into(),
            write_tiny_cifar(p.path()),
            "data.num_workers=2".into(),
            "data.train_size=null".into(),
            "data.val_size=null".into(),
        ]
    } else {
        vec![]
    };
    let run_with = |extra: &[&str]| {
        let mut args: Vec<&str> = SMALL.to_vec();
        args.extend(cifar_args.iter().map(String::as_str));
        args.extend_from_slice(extra);
        let out = train(p.path(), &args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(std::time::Duration::from_millis(1100)); // distinct run directories
        only_run(p.path(), "quickstart")
    };
    let keep_all = [
        "trainer.max_epochs=3",
        "callbacks.model_checkpoint.save_top_k=-1",
        "callbacks.model_checkpoint.monitor=null",
    ];
    let full_a = run_with(&keep_all);
    let full_b = run_with(&keep_all);
    let weights =
        |run: &Path, name: &str| std::fs::read(run.join("checkpoints").join(name)).unwrap();
    let tensors = |bytes: Vec<u8>| {
        let t = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut out: Vec<(String, Vec<u8>)> = t
            .tensors()
            .into_iter()
            .map(|(k, v)| (k, v.data().to_vec()))
            .collect();
        out.sort();
        out
    };
    assert_eq!(
        tensors(weights(&full_a, "last.safetensors")),
        tensors(weights(&full_b, "last.safetensors"))
    );

    // Interrupted after the first epoch: resume from that epoch's checkpoint and run to the end.
    let epoch0 = full_a.join("checkpoints/epoch_000.safetensors");
    assert!(epoch0.is_file());
    let ckpt = format!("ckpt_path={}", epoch0.display());
    let resumed = run_with(&[keep_all[0], keep_all[1], keep_all[2], ckpt.as_str()]);
    assert_eq!(summary(&resumed)["epochs_completed"], 3);
    assert!(summary(&resumed)["resumed_from"].as_str().is_some());
    assert_eq!(
        tensors(weights(&full_a, "last.safetensors")),
        tensors(weights(&resumed, "last.safetensors"))
    );
    // Only the remaining steps ran (a restart from scratch would end with the same weights): the resumed
    // run logged exactly the uninterrupted run's rows after the checkpoint's step.
    let at = trainyard::storage::checkpoint::read_training_state(&epoch0)
        .unwrap()
        .unwrap()
        .global_step;
    let steps = |run: &Path| -> Vec<u64> {
        common::csv_rows(run)
            .iter()
            .filter_map(|row| {
                row.iter()
                    .find(|(k, _)| k == "step")
                    .map(|(_, v)| *v as u64)
            })
            .collect()
    };
    let after: Vec<u64> = steps(&full_a).into_iter().filter(|&s| s > at).collect();
    assert!(!after.is_empty());
    assert_eq!(steps(&resumed), after);
}

#[test]
fn fast_dev_run_and_limits() {
    let p = real_project();
    let mut args: Vec<&str> = SMALL.to_vec();
    args.push("debug=fdr");
    let out = train(p.path(), &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = summary(&only_run(p.path(), "quickstart"));
    assert_eq!(s["global_step"], 1);
    assert!(
        s["last_checkpoint"].is_null(),
        "fast_dev_run writes no checkpoints"
    );
    // The limits: 2 of the epoch's 8 training batches, 1 of its 4 validation batches, in each of 2 epochs.
    let limited = common::run_with(
        p.path(),
        "limited",
        SMALL,
        &[
            "trainer.max_epochs=2",
            "trainer.limit_train_batches=2",
            "trainer.limit_val_batches=1",
        ],
    );
    let s = summary(&limited);
    assert_eq!(s["global_step"], 4, "{s}");
    assert_eq!(s["epochs_completed"], 2, "{s}");
    let epoch_rows = common::csv_rows(&limited)
        .into_iter()
        .filter(|row| row.iter().any(|(k, _)| k == "val/loss"))
        .count();
    assert_eq!(epoch_rows, 2, "one validated epoch row per epoch");
}

/// A ViT (timm layout, our differentiable softmax/LayerNorm) trains end to end from the CLI.
#[test]
fn vit_trains_from_the_command_line() {
    let p = real_project();
    let args = [
        "experiment=quickstart",
        "model=vit_b32",
        "model.variant=tiny",
        "model.patch_size=8",
        "~model.channels",
        "data.train_size=64",
        "data.val_size=32",
        "data.batch_size=16",
        "data.num_workers=0",
        "trainer.max_epochs=1",
    ];
    let out = train(p.path(), &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trained = only_run(p.path(), "quickstart");
    let s = summary(&trained);
    assert_eq!(s["model"], "vit");
    assert_eq!(s["global_step"], 4);
    assert!(s["final_metrics"]["train/loss"]
        .as_f64()
        .unwrap()
        .is_finite());
    // It trained: the same run with a learning rate of nothing keeps the initial weights; ours moved.
    let initial = common::run_with(p.path(), "initial", &args, &["optimizer.lr=1e-30"]);
    let moved =
        common::worst_relative_difference(&common::weights(&trained), &common::weights(&initial));
    assert!(moved > 1e-3, "the ViT's weights moved only {moved:e}");
}

/// `val_check_interval` (fraction or batch count) validates inside the epoch: extra val rows in
/// metrics.csv at those steps; a count larger than the epoch is refused with the epoch's size.
#[rstest::rstest]
#[case("trainer.val_check_interval=0.5", &[4, 8])]
#[case("trainer.val_check_interval=3", &[3, 6, 8])]
#[case("trainer.val_check_interval=1.0", &[8])]
fn validation_within_an_epoch(#[case] option: &str, #[case] val_steps: &[u64]) {
    let p = real_project();
    let mut args: Vec<&str> = SMALL.to_vec();
    args.extend(["trainer.max_epochs=1", option]);
    let out = train(p.path(), &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let csv =
        std::fs::read_to_string(only_run(p.path(), "quickstart").join("metrics.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let (step, val) = (
        header.iter().position(|h| *h == "step").unwrap(),
        header.iter().position(|h| *h == "val/acc1").unwrap(),
    );
    let steps: Vec<u64> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| !f[val].is_empty())
        .map(|f| f[step].parse().unwrap())
        .collect();
    assert_eq!(steps, val_steps, "{csv}");
}

/// Validation inside the epoch drives the callbacks, as Lightning's `on_validation_end`: ModelCheckpoint
/// saves after each one (recording how many batches of the epoch were done), a run resumed from a
/// mid-epoch checkpoint skips exactly those batches and ends bit-identical to the uninterrupted run, and
/// EarlyStopping's patience counts validation checks, so it can stop a run mid-epoch.
#[test]
fn mid_epoch_validation_checkpoints_resume_and_early_stop() {
    let p = real_project();
    let run_with = |extra: &[&str]| {
        let mut args: Vec<&str> = SMALL.to_vec();
        args.extend(["trainer.val_check_interval=3", "trainer.max_epochs=2"]);
        args.extend_from_slice(extra);
        let out = train(p.path(), &args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let run = only_run(p.path(), "quickstart");
        let kept = p.path().join(format!("run{}", extra.len()));
        std::fs::rename(&run, &kept).unwrap();
        std::fs::remove_dir_all(p.path().join("logs")).unwrap();
        kept
    };
    let every_check = [
        "callbacks.model_checkpoint.save_top_k=-1",
        "callbacks.model_checkpoint.monitor=null",
        "callbacks.model_checkpoint.filename='step_{step:03d}'",
    ];
    let full = run_with(&every_check);
    let names: Vec<String> = {
        let mut v: Vec<String> = std::fs::read_dir(full.join("checkpoints"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        names,
        [
            "last.safetensors",
            "step_003.safetensors",
            "step_006.safetensors",
            "step_008.safetensors",
            "step_011.safetensors",
            "step_014.safetensors",
            "step_016.safetensors"
        ],
        "a checkpoint after every validation (steps 3, 6 and the epoch end at 8, per epoch)"
    );
    let mid = full.join("checkpoints/step_011.safetensors");
    let training = checkpoint::load(&mid).unwrap().training.unwrap();
    assert_eq!(
        (training.epoch, training.global_step, training.batches_done),
        (1, 11, 3)
    );
    let resume = format!("ckpt_path={}", mid.display());
    let resumed = run_with(&[
        every_check[0],
        every_check[1],
        every_check[2],
        resume.as_str(),
    ]);
    let tensors = |run: &Path| {
        checkpoint::load(&run.join("checkpoints/last.safetensors"))
            .unwrap()
            .state
    };
    assert_eq!(
        tensors(&resumed),
        tensors(&full),
        "resumed mid-epoch != uninterrupted"
    );
    assert_eq!(summary(&resumed)["global_step"], 16);

    // val/loss "improving" by rising 0.5 never happens: patience 1 ends the run at the second check.
    let stopped = run_with(&[
        "callbacks.early_stopping={monitor: val/loss, mode: max, patience: 1, min_delta: 0.5}",
    ]);
    let s = summary(&stopped);
    assert_eq!(s["global_step"], 6, "{s}");
    assert!(
        s["status"].as_str().unwrap().starts_with("early stopped"),
        "{s}"
    );
}

#[test]
fn val_check_interval_beyond_the_epoch_is_refused() {
    let p = real_project();
    let mut args: Vec<&str> = SMALL.to_vec();
    args.push("trainer.val_check_interval=9");
    let out = train(p.path(), &args);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("trainer.val_check_interval=9") && err.contains("8 training batches"),
        "{err}"
    );
}

/// Label smoothing changes the training loss as PyTorch defines it, and is range-checked.
#[test]
fn label_smoothing_changes_the_loss_and_is_range_checked() {
    let p = real_project();
    let mut plain: Vec<&str> = SMALL.to_vec();
    plain.extend(["trainer.max_epochs=1", "trainer.limit_train_batches=1"]);
    let mut smoothed = plain.clone();
    smoothed.push("model.label_smoothing=0.5");
    let losses: Vec<f64> = [plain, smoothed]
        .iter()
        .map(|args| {
            run_once(p.path(), args)["final_metrics"]["train/loss"]
                .as_f64()
                .unwrap()
        })
        .collect();
    // Same seed, weights and batch: only the loss differs (its formula is unit-tested in the engine).
    assert_ne!(losses[0], losses[1]);
    let mut bad: Vec<&str> = SMALL.to_vec();
    bad.push("model.label_smoothing=1.5");
    let out = train(p.path(), &bad);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("model.label_smoothing"),
        "{err}"
    );
}

/// `bf16-mixed` on the Candle CPU path: autocast's bf16 rounding really happens (the numbers differ from
/// 32-true from the first step), the precision is recorded, and the model still learns far above chance.
#[test]
fn bf16_mixed_trains_with_bf16_rounding() {
    let p = real_project();
    let run = |precision: &str| {
        let mut args: Vec<&str> = SMALL.to_vec();
        let precision = format!("trainer.precision={precision}");
        args.extend([
            "data.train_size=512",
            "trainer.max_epochs=5",
            "optimizer.lr=0.01",
            precision.as_str(),
        ]);
        run_once(p.path(), &args)
    };
    let full = run("32-true");
    let mixed = run("bf16-mixed");
    assert_eq!(mixed["precision"], "bf16-mixed");
    let metric = |s: &serde_json::Value, k: &str| s["final_metrics"][k].as_f64().unwrap();
    assert_ne!(metric(&full, "train/loss"), metric(&mixed, "train/loss"));
    let (acc_full, acc_mixed) = (metric(&full, "val/acc1"), metric(&mixed, "val/acc1"));
    assert!(acc_mixed > 0.8, "bf16-mixed val/acc1 {acc_mixed}");
    assert!(
        (acc_full - acc_mixed).abs() < 0.1,
        "bf16-mixed {acc_mixed} vs 32-true {acc_full}"
    );
}

/// What the build cannot do yet is refused by name before a run directory is made, never ignored.
#[rstest::rstest]
#[cfg_attr(not(feature = "torch"), case("trainer=fsdp_sim", "--features torch"))]
#[cfg_attr(not(feature = "torch"), case("trainer=ddp_sim", "--features torch"))]
#[case("trainer.precision=16-mixed", "trainer.precision=16-mixed")]
fn unimplemented_options_are_refused(#[case] option: &str, #[case] named: &str) {
    let p = real_project();
    let out = train(p.path(), &["experiment=quickstart", option]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not implemented") && err.contains(named),
        "{err}"
    );
    assert!(
        !p.path().join("logs").exists(),
        "no run directory for a refused run"
    );
}

/// LearningRateMonitor: metrics.csv rows carry `lr` values only while the callback is configured.
#[rstest::rstest]
#[case("callbacks.lr_monitor.logging_interval=epoch", true)]
#[case("callbacks.lr_monitor=null", false)]
fn lr_is_logged_only_with_the_monitor(#[case] option: &str, #[case] logged: bool) {
    let p = real_project();
    let mut args: Vec<&str> = SMALL.to_vec();
    args.extend([
        "trainer.max_epochs=1",
        "trainer.log_every_n_steps=2",
        option,
    ]);
    let out = train(p.path(), &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let csv =
        std::fs::read_to_string(only_run(p.path(), "quickstart").join("metrics.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    // Step rows (every 2 steps) carry lr only with logging_interval: step, which neither case sets.
    let lr_col = header.iter().position(|h| *h == "lr");
    let rows_with_lr = csv
        .lines()
        .skip(1)
        .filter(|l| lr_col.is_some_and(|c| !l.split(',').nth(c).unwrap_or("").is_empty()))
        .count();
    assert_eq!(rows_with_lr, usize::from(logged), "{csv}");
}

/// `cifar-10-binary.tar.gz` as published (one top directory `cifar-10-batches-bin/`), with tiny contents.
fn cifar_archive(scratch: &Path) -> Vec<u8> {
    let dir = scratch.join("cifar-10-batches-bin");
    write_cifar_files(&dir);
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    tar.append_dir_all("cifar-10-batches-bin", &dir).unwrap();
    tar.into_inner().unwrap().finish().unwrap()
}

/// A real HTTP server on loopback serving `files` by name; counts the requests it answered.
fn serve(
    files: Vec<(&'static str, Vec<u8>)>,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    let base = format!("http://{}", server.server_addr().to_ip().unwrap());
    let hits = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    std::thread::spawn(move || {
        for request in server.incoming_requests() {
            counter.fetch_add(1, Ordering::SeqCst);
            let name = request.url().trim_start_matches('/').to_string();
            let response = match files.iter().find(|(n, _)| *n == name) {
                Some((_, body)) => tiny_http::Response::from_data(body.clone()),
                None => tiny_http::Response::from_data(b"not found".to_vec()).with_status_code(404),
            };
            let _ = request.respond(response);
        }
    });
    (base, hits)
}

fn md5_hex(bytes: &[u8]) -> String {
    use md5::Digest;
    md5::Md5::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `data.download=true` fetches the archive from a (local) server, checks its MD5, installs it atomically and
/// trains on it; a second run finds the data and downloads nothing. A wrong checksum installs nothing.
#[test]
fn download_fetches_verifies_and_installs_cifar() {
    use std::sync::atomic::Ordering;
    let p = real_project();
    let scratch = tempfile::tempdir().unwrap();
    let archive = cifar_archive(scratch.path());
    let checksum = md5_hex(&archive);
    let (base, hits) = serve(vec![("cifar-10-binary.tar.gz", archive)]);
    let root = p.path().join("data/cifar-10-batches-bin");
    let root_arg = format!("data.root={}", root.display());
    let mirror = format!("data.mirror={base}");
    let run = |extra: &[&str]| {
        let mut args: Vec<&str> = SMALL.to_vec();
        args.extend([
            "data=cifar10",
            "data.num_workers=0",
            "data.train_size=null",
            "data.val_size=null",
            "trainer.max_epochs=1",
            "data.download=true",
            root_arg.as_str(),
            mirror.as_str(),
        ]);
        args.extend_from_slice(extra);
        train(p.path(), &args)
    };

    // The served archive is not the published one: its MD5 differs and nothing is installed.
    let out = run(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("c32a1d4ab5d03f1284b67883e8d87530")
            && err.contains(&checksum)
            && err.contains("data.checksums"),
        "{err}"
    );
    assert!(!root.exists(), "a failed download installs nothing");
    let leftovers: Vec<_> = std::fs::read_dir(root.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(leftovers.is_empty(), "partial files left: {leftovers:?}");
    assert_eq!(hits.load(Ordering::SeqCst), 1);

    // With the mirror's checksum declared it downloads, installs and trains.
    let declared = format!("+data.checksums={{cifar-10-binary.tar.gz: {checksum}}}");
    let out = run(&[&declared]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    for f in ["data_batch_1.bin", "data_batch_5.bin", "test_batch.bin"] {
        assert!(root.join(f).is_file(), "{f} not installed");
    }
    assert!(p.path().join("data/cifar-10-binary.tar.gz").is_file());
    let s = summary(&only_run(p.path(), "quickstart"));
    assert_eq!(s["epochs_completed"], 1);

    // Present data is not fetched again.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let out = run(&[&declared]);
    assert!(out.status.success());
    assert_eq!(hits.load(Ordering::SeqCst), 2, "downloaded again");
}

/// Without network access (nothing listens at the mirror) the error names the URL and how to proceed.
#[test]
fn download_failure_says_what_to_fetch() {
    let p = real_project();
    let port = common::free_port();
    let root = p.path().join("data/mnist");
    let mut args: Vec<String> = SMALL.iter().map(|s| s.to_string()).collect();
    args.extend([
        "data=mnist".into(),
        "data.train_size=null".into(),
        "data.val_size=null".into(),
        "data.download=true".into(),
        format!("data.root={}", root.display()),
        format!("data.mirror=http://127.0.0.1:{port}/mnist"),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = train(p.path(), &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!(
            "http://127.0.0.1:{port}/mnist/train-images-idx3-ubyte.gz"
        )) && err.contains("by hand"),
        "{err}"
    );
}

fn finder_run(project: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args: Vec<&str> = SMALL.to_vec();
    args.extend([
        "data.train_size=512",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
    ]);
    args.extend_from_slice(extra);
    run_once(project, &args)
}

/// The batch-size finder on the CPU with a memory budget: measure what each batch size needs, put the budget
/// between two of them, and check the finder stops exactly there — in power and binsearch modes — and that
/// the run trains with what it found.
#[test]
fn batch_size_finder_respects_the_memory_budget() {
    let p = real_project();
    // Probe: a budget nothing reaches, so every size up to max_val=256 is tried and measured.
    let probe = finder_run(
        p.path(),
        &[
            "+callbacks.batch_size_finder.max_memory=100000000000",
            "+callbacks.batch_size_finder.max_val=256",
            "+callbacks.batch_size_finder.init_val=16",
            "+callbacks.batch_size_finder.steps_per_trial=1",
        ],
    );
    let peak_of = |s: &serde_json::Value, b: u64| -> Option<u64> {
        s["batch_size_finder"]["trials"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["batch_size"] == b)
            .map(|t| t["peak_bytes"].as_u64().unwrap())
    };
    let (p64, p128) = (peak_of(&probe, 64).unwrap(), peak_of(&probe, 128).unwrap());
    assert!(
        p128 > p64 + p64 / 2,
        "memory should grow with the batch: {p64} vs {p128}"
    );
    let budget = (p64 + p128) / 2;
    let budget_arg = format!("+callbacks.batch_size_finder.max_memory={budget}");

    let power = finder_run(
        p.path(),
        &[
            &budget_arg,
            "+callbacks.batch_size_finder.init_val=16",
            "+callbacks.batch_size_finder.steps_per_trial=1",
        ],
    );
    let f = &power["batch_size_finder"];
    assert_eq!(f["found"], 64, "{f}");
    assert!(peak_of(&power, 64).unwrap() <= budget);
    assert!(peak_of(&power, 128).unwrap() > budget);
    assert_eq!(
        power["batch_size"], 64,
        "the run trains with the batch size found"
    );

    // Lightning 1.x's flag picks the mode; binsearch lands between 64 and 128 and keeps a 5% margin.
    let bin = finder_run(
        p.path(),
        &[
            "trainer.auto_scale_batch_size=binsearch",
            &budget_arg,
            "+callbacks.batch_size_finder.init_val=16",
            "+callbacks.batch_size_finder.steps_per_trial=1",
        ],
    );
    let f = &bin["batch_size_finder"];
    let largest = f["largest_fitting"].as_u64().unwrap();
    assert!((64..128).contains(&largest), "{f}");
    assert!(peak_of(&bin, largest).unwrap() <= budget);
    assert!(peak_of(&bin, largest + 1).unwrap() > budget, "{f}");
    assert_eq!(f["found"], (largest as f64 * 0.95).floor() as u64);

    // Without a budget on the CPU the finder says what to set.
    let mut args: Vec<&str> = SMALL.to_vec();
    args.push("trainer.auto_scale_batch_size=power");
    let out = train(p.path(), &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("callbacks.batch_size_finder.max_memory"),
        "{err}"
    );
}

/// DeviceStatsMonitor on the CPU: per-epoch CPU and memory columns in metrics.csv, the run's figures in
/// summary.json, and no GPU fields at all (absent, not zero).
#[test]
fn device_stats_on_the_cpu() {
    let p = real_project();
    let mut args: Vec<&str> = SMALL.to_vec();
    args.extend([
        "trainer.max_epochs=2",
        "data.train_size=512",
        "callbacks.device_stats.sample_every_ms=10",
    ]);
    let out = train(p.path(), &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = only_run(p.path(), "quickstart");
    let s = summary(&run);
    let d = &s["device_stats"];
    assert!(d["samples"].as_u64().unwrap() >= 2, "{d}");
    assert!(d["rss_bytes_max"].as_u64().unwrap() > 1 << 20, "{d}");
    assert!(d["cpu_percent_mean"].as_f64().unwrap() > 0.0, "{d}");
    assert!(d.get("gpu").is_none(), "{d}");
    let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let epoch_rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|r| !r[col("epoch_time_s")].is_empty())
        .collect();
    assert_eq!(epoch_rows.len(), 2);
    for r in &epoch_rows {
        let rss: f64 = r[col("device/rss_bytes_max")].parse().unwrap();
        assert!(rss > 1e6, "{r:?}");
        let rss_mean: f64 = r[col("device/rss_bytes_mean")].parse().unwrap();
        assert!(rss_mean > 1e6 && rss_mean <= rss, "{r:?}");
        for gpu in [
            "device/gpu_util_percent_mean",
            "device/gpu_util_percent_max",
            "device/gpu_memory_used_bytes_mean",
            "device/gpu_memory_used_bytes_max",
        ] {
            assert!(r[col(gpu)].is_empty(), "{gpu}: {r:?}");
        }
    }
}

/// The Timer: with `interval: step` (the default) it stops mid-epoch, one second into an epoch that would
/// take far longer; with `interval: epoch` only at an epoch's end. Either way the stopped epoch is logged,
/// summary.json says the timer stopped the run and records the training time it measured.
#[rstest::rstest]
#[case::step("step", &["data.train_size=40000", "trainer.max_epochs=1"])]
#[case::epoch("epoch", &["data.train_size=64", "trainer.max_epochs=1000"])]
fn timer_stops_the_run(#[case] interval: &str, #[case] size: &[&str]) {
    let p = real_project();
    let interval_arg = format!("+callbacks.timer.interval={interval}");
    let mut args: Vec<&str> = SMALL.to_vec();
    args.extend_from_slice(size);
    args.extend([
        "data.val_size=64",
        "+callbacks.timer.max_time=00:00:00:01",
        interval_arg.as_str(),
    ]);
    let s = run_once(p.path(), &args);
    let status = s["status"].as_str().unwrap();
    let fired_after: f64 = status
        .strip_prefix("stopped by the timer after ")
        .and_then(|rest| rest.split('s').next())
        .and_then(|secs| secs.parse().ok())
        .unwrap_or_else(|| panic!("{status}"));
    assert!(
        fired_after >= 1.0 && status.contains(&format!("checked every {interval}")),
        "{status}"
    );
    let timer = &s["timer"];
    assert_eq!(timer["stopped"], true, "{timer}");
    assert_eq!(timer["max_time_s"], 1.0);
    let elapsed = timer["elapsed_s"].as_f64().unwrap();
    assert!(
        (1.0..s["wall_time_s"].as_f64().unwrap() + 1e-9).contains(&elapsed),
        "{s}"
    );
    let steps = s["global_step"].as_u64().unwrap();
    let steps_per_epoch = match interval {
        "step" => 40000 / 32,
        _ => 64 / 32,
    };
    let epochs = s["epochs_completed"].as_u64().unwrap();
    match interval {
        // Cut short: far fewer steps than the one epoch has, and that epoch still ends (counted, validated).
        "step" => {
            assert!(steps > 0 && steps < steps_per_epoch / 2, "{steps} steps");
            assert_eq!(epochs, 1);
            assert!(s["final_metrics"]["val/acc1"].is_number(), "{s}");
        }
        // Whole epochs only, and far fewer than asked for.
        _ => {
            assert_eq!(steps, epochs * steps_per_epoch, "{s}");
            assert!((1..1000).contains(&epochs), "{epochs}");
        }
    }
}

/// `fit_after: false` only measures: the batch size found is recorded, nothing is trained. Under
/// `fast_dev_run` the finder is skipped (Lightning's rule), so the run needs no memory budget at all.
#[rstest::rstest]
#[case::measure_only(&["+callbacks.batch_size_finder.max_val=64", "+callbacks.batch_size_finder.fit_after=false"])]
#[case::skipped_by_fast_dev_run(&["trainer.auto_scale_batch_size=power", "trainer.fast_dev_run=true"])]
fn batch_size_finder_without_training_after_it(#[case] extra: &[&str]) {
    let p = real_project();
    let mut args: Vec<&str> = SMALL.to_vec();
    args.extend(["+callbacks.batch_size_finder.steps_per_trial=1"]);
    args.extend_from_slice(extra);
    let out = train(p.path(), &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = only_run(p.path(), "quickstart");
    let s = summary(&run);
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    if extra.contains(&"trainer.fast_dev_run=true") {
        assert!(s["batch_size_finder"].is_null(), "{s}");
        assert!(log.contains("batch size finder skipped"), "{log}");
        assert_eq!(
            (s["batch_size"].as_u64(), s["global_step"].as_u64()),
            (Some(32), Some(1))
        );
        return;
    }
    let f = &s["batch_size_finder"];
    assert_eq!(f["found"], 64, "{f}");
    assert_eq!(s["batch_size"], 64);
    assert_eq!(
        s["status"],
        "batch size found; not trained (fit_after=false)"
    );
    assert_eq!(
        (s["epochs_completed"].as_u64(), s["global_step"].as_u64()),
        (Some(0), Some(0))
    );
    assert!(s["final_metrics"].as_object().unwrap().is_empty(), "{s}");
    // No training rows in metrics.csv.
    let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap_or_default();
    assert!(csv.lines().count() <= 1, "{csv}");
}

/// ModelSummary prints parameters per layer (grouped to `max_depth` name parts) and their total, which is
/// the run's `num_parameters`.
#[rstest::rstest]
#[case(1)]
#[case(2)]
fn model_summary_prints_layers_and_total(#[case] depth: u64) {
    let p = real_project();
    let depth_arg = format!("callbacks.model_summary.max_depth={depth}");
    let mut args: Vec<&str> = SMALL.to_vec();
    args.extend([
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=1",
        &depth_arg,
    ]);
    let out = train(p.path(), &args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let s = summary(&only_run(p.path(), "quickstart"));
    let rows: Vec<(String, u64)> = stdout
        .lines()
        .skip_while(|l| !l.trim_end().ends_with("params"))
        .skip(1)
        .take_while(|l| !l.contains("total"))
        .filter_map(|l| {
            let mut words = l.split_whitespace().rev();
            let n = words.next()?.parse().ok()?;
            Some((words.next()?.to_string(), n))
        })
        .collect();
    assert!(rows.len() >= 2, "{stdout}");
    let parts = |name: &str| name.split('.').count() as u64;
    assert!(
        rows.iter().all(|(name, _)| parts(name) <= depth),
        "{rows:?}"
    );
    assert!(
        rows.iter().any(|(name, _)| parts(name) == depth),
        "{rows:?}"
    );
    let total_line = stdout
        .lines()
        .find(|l| l.contains("total"))
        .unwrap_or_else(|| panic!("{stdout}"));
    let total: u64 = total_line
        .split_whitespace()
        .last()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(total, rows.iter().map(|r| r.1).sum::<u64>(), "{stdout}");
    assert_eq!(total, s["num_parameters"].as_u64().unwrap(), "{stdout}");
}
