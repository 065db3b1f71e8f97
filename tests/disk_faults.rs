//! A disk that fills or refuses writes mid-run: one clear error naming the file and exit status 1, every
//! checkpoint written before intact and loadable, no temporary files left behind, and `run.json` saying
//! `failed` with the reason (written over its own reserved bytes when the disk has no room for a copy).
//! The disks are real: small or read-only tmpfs mounts in a mount namespace of their own (`unshare`, as
//! root; elsewhere the tests say SKIPPED, and fail under CI's TRAINYARD_REQUIRE=netns). A disk that
//! answers EIO is a fault-injecting writer: `tests/common/eio.c`, built here with the C compiler and
//! preloaded into `train` (no root needed).

mod common;

use common::TRAIN;
use rstest::rstest;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Whether this process may mount in a namespace of its own.
fn can_mount() -> bool {
    Command::new("unshare")
        .args(["--mount", "true"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `mounts` (shell commands) then `train args` in `cwd` inside a fresh mount namespace; what the run left
/// under `run/` is copied to `cwd/kept/` before the namespace (and its mounts) go. The train command's
/// exit status is printed last on stdout as `rc=N`.
fn run_on(cwd: &Path, mounts: &str, args: &str) -> Output {
    let script = format!(
        "set -u; {mounts} && '{TRAIN}' {args}; rc=$?; cp -a run kept 2>/dev/null; echo rc=$rc"
    );
    Command::new("unshare")
        .args(["--mount", "sh", "-c", &script])
        .current_dir(cwd)
        .env_remove("TRAIN_CONFIG_PATH")
        .output()
        .unwrap()
}

fn exit_status(out: &Output) -> i32 {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().rev().find(|l| l.starts_with("rc=")).unwrap();
    line[3..].parse().unwrap()
}

/// Every file under `dir` whose name says it is a temporary copy.
fn leftovers(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(leftovers(&path));
        } else if path.to_string_lossy().contains(".tmp-") {
            found.push(path.display().to_string());
        }
    }
    found
}

const QUICK: &str =
    "experiment=quickstart data.train_size=256 data.val_size=64 data.batch_size=64 \
                     trainer.max_epochs=6 callbacks.model_checkpoint.save_top_k=-1 \
                     callbacks.model_checkpoint.monitor=null hydra.run.dir=run";

#[test]
fn a_full_disk_fails_cleanly_and_keeps_what_was_saved() {
    if !can_mount() {
        common::skip("netns", "this process cannot mount (not root)");
        return;
    }
    let p = tempfile::tempdir().unwrap();
    // Room for the run's records and two or three checkpoints (~300 KB each with Adam's moments).
    let out = run_on(
        p.path(),
        "mkdir run && mount -t tmpfs -o size=900k tmpfs run",
        QUICK,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(exit_status(&out), 1, "{stderr}");
    assert!(
        stderr.contains("No space left on device") && stderr.contains("run/checkpoints/"),
        "the error names the file and the cause: {stderr}"
    );
    let kept = p.path().join("kept");
    assert_eq!(leftovers(&kept), Vec::<String>::new(), "{stderr}");
    let record = common::run_json(&kept);
    assert_eq!(record["state"], "failed", "{record}");
    assert!(
        record["error"]
            .as_str()
            .unwrap()
            .contains("No space left on device"),
        "{record}"
    );
    let saved: Vec<_> = std::fs::read_dir(kept.join("checkpoints"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        !saved.is_empty(),
        "a checkpoint fitted before the disk filled"
    );
    for ckpt in &saved {
        trainyard::storage::checkpoint::load(ckpt)
            .unwrap_or_else(|e| panic!("{} does not load: {e:#}", ckpt.display()));
    }
}

#[test]
fn a_read_only_checkpoint_folder_is_named() {
    if !can_mount() {
        common::skip("netns", "this process cannot mount (not root)");
        return;
    }
    let p = tempfile::tempdir().unwrap();
    let args = format!("{QUICK} callbacks.model_checkpoint.dirpath=ro");
    let out = run_on(p.path(), "mkdir ro && mount -t tmpfs -o ro tmpfs ro", &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(exit_status(&out), 1, "{stderr}");
    assert!(
        stderr.contains("Read-only file system") && stderr.contains("ro/"),
        "{stderr}"
    );
    let kept = p.path().join("kept");
    assert_eq!(common::run_json(&kept)["state"], "failed");
    assert_eq!(leftovers(&kept), Vec::<String>::new());
}

/// `tests/common/eio.c` built as a preloadable library in `dir`.
fn eio_library(dir: &Path) -> PathBuf {
    let lib = dir.join("eio.so");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/common/eio.c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(&source)
        .arg("-ldl")
        .output()
        .unwrap_or_else(|e| panic!("{cc}: {e} (the EIO test builds its writer with a C compiler)"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lib
}

/// EIO from the disk while a run writes each kind of file, after `after` writes to it went through:
/// exit status 1 and one error naming the file and the cause; every checkpoint written before loads;
/// no temporary copy left; run.json says `failed` with the reason (when run.json itself fails, the
/// error says so, and the record cannot: there is nothing left to write it with).
#[rstest]
#[case::a_checkpoint("epoch_002", 0, "run/checkpoints/epoch_002")]
#[case::metrics_csv("metrics.csv", 2, "run/metrics.csv")]
#[case::tensorboard_events("events.out.tfevents", 2, "events.out.tfevents")]
// The started record's write and sync go through; the ended record's write fails.
#[case::the_run_record("run.json", 2, "run/run.json")]
fn an_io_error_fails_cleanly_and_keeps_what_was_saved(
    #[case] file: &str,
    #[case] after: u32,
    #[case] named: &str,
) {
    let p = tempfile::tempdir().unwrap();
    let lib = eio_library(p.path());
    let args: Vec<&str> = QUICK.split_whitespace().collect();
    let out = Command::new(TRAIN)
        .args(&args)
        .arg("logger=many")
        .current_dir(p.path())
        .env_remove("TRAIN_CONFIG_PATH")
        .env("LD_PRELOAD", &lib)
        .env("TRAINYARD_EIO_PATH", file)
        .env("TRAINYARD_EIO_AFTER", after.to_string())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("Input/output error") && stderr.contains(named),
        "the error names {named} and the cause: {stderr}"
    );
    let run = p.path().join("run");
    assert_eq!(leftovers(&run), Vec::<String>::new(), "{stderr}");
    if file != "run.json" {
        let record = common::run_json(&run);
        assert_eq!(record["state"], "failed", "{record}");
        assert!(
            record["error"]
                .as_str()
                .unwrap()
                .contains("Input/output error"),
            "{record}"
        );
    }
    let saved: Vec<_> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    if file == "epoch_002" {
        assert!(saved.len() >= 2, "epochs 0 and 1 were saved: {saved:?}");
    }
    for ckpt in &saved {
        trainyard::storage::checkpoint::load(ckpt)
            .unwrap_or_else(|e| panic!("{} does not load: {e:#}", ckpt.display()));
    }
}
