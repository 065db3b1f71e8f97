//! A disk that fills or refuses writes mid-run: one clear error naming the file and exit status 1, every
//! checkpoint written before intact and loadable, no temporary files left behind, and `run.json` saying
//! `failed` with the reason (written over its own reserved bytes when the disk has no room for a copy).
//! The disks are real: small or read-only tmpfs mounts in a mount namespace of their own (`unshare`, as
//! root; elsewhere the tests say SKIPPED, and fail under CI's TRAINYARD_REQUIRE=netns).

mod common;

use common::TRAIN;
use std::path::Path;
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

fn run_json(run: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap()
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
    let record = run_json(&kept);
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
    assert_eq!(run_json(&kept)["state"], "failed");
    assert_eq!(leftovers(&kept), Vec::<String>::new());
}
