//! Stop signals: SIGTERM to a training run (a spot notice, `docker stop`, `kill`) or to the node launcher
//! of a distributed one stops every rank at the same step with a resume checkpoint, records the run as
//! `preempted`, exits with status 75, and the same command with `ckpt_path=auto` continues it to the
//! weights of a run that was never stopped. A damaged checkpoint is passed over for the one before it.

mod common;
use common::{real_project, summary, weights, worst_relative_difference, SMALL_CNN, TRAIN};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Constant-rate SGD over 1024 images in batches of 32 (32 steps an epoch), a row of metrics per step:
/// long enough to be stopped in the middle of an epoch.
const LONG: &[&str] = &[
    "optimizer=sgd",
    "scheduler=constant",
    "data.train_size=1024",
    "data.batch_size=32",
    "trainer.max_epochs=2",
    "trainer.log_every_n_steps=1",
    "logger.csv.flush_every_n_steps=1",
    "trainer.deterministic=true",
];

fn command(root: &Path, dir: &str, strategy: &[&str], extra: &[&str]) -> Command {
    let mut cmd = Command::new(TRAIN);
    cmd.args(SMALL_CNN)
        .args(LONG)
        .args(strategy)
        .args(extra)
        .arg(format!("hydra.run.dir={dir}"))
        .current_dir(root)
        .env_remove("TRAIN_CONFIG_PATH")
        .env("RAYON_NUM_THREADS", "1")
        .env("OMP_NUM_THREADS", "1");
    cmd
}

fn finished(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Start the run, wait until it has logged `rows` training steps, send SIGTERM to the process started
/// (the run itself, or the node launcher of a distributed one) and wait for it.
fn stopped_by_sigterm(mut cmd: Command, run: &Path, rows: usize) -> std::process::Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let metrics = run.join("metrics.csv");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let logged = std::fs::read_to_string(&metrics)
            .map(|t| t.lines().count().saturating_sub(1))
            .unwrap_or(0);
        if logged >= rows {
            break;
        }
        assert!(Instant::now() < deadline, "the run never started training");
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: signalling the child this test started and has not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait_with_output().unwrap()
}

fn text(out: &std::process::Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The preempted run's record, summary and checkpoint, then the resumed run: it starts from that
/// checkpoint (not from scratch: its first logged step is past the stop) and ends with the weights of
/// the run never stopped.
fn stop_and_resume(strategy: &[&str], tolerance: f64) {
    let p = real_project();
    let root = p.path();
    let clean = root.join("clean/run");
    finished(&mut command(root, "clean/run", strategy, &[]));

    let first = root.join("runs/first");
    let out = stopped_by_sigterm(
        command(root, "runs/first", strategy, &["ckpt_path=auto"]),
        &first,
        5,
    );
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(first.join("run.json")).unwrap()).unwrap();
    assert_eq!(record["state"], "preempted", "{record}");
    let s = summary(&first);
    let status = s["status"].as_str().unwrap_or_default();
    assert!(status.starts_with("preempted by SIGTERM"), "{s}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ckpt_path=auto"),
        "{}",
        text(&out)
    );
    let stopped_at = s["global_step"].as_u64().unwrap();
    assert!(
        (1..64).contains(&stopped_at),
        "stopped at step {stopped_at}: {s}"
    );
    // Every rank stopped at that one step (rank 1 says so in its own log).
    if strategy.iter().any(|a| a.contains("ddp")) {
        let log = std::fs::read_to_string(first.join("train.rank1.log")).unwrap_or_default();
        assert!(
            log.contains("preempted by SIGTERM") && log.contains(&format!("step {stopped_at}:")),
            "rank 1 did not stop at step {stopped_at}:\n{log}"
        );
    }

    let second = root.join("runs/second");
    finished(&mut command(
        root,
        "runs/second",
        strategy,
        &["ckpt_path=auto"],
    ));
    let s = summary(&second);
    assert_eq!(s["status"], "completed", "{s}");
    let from = s["resumed_from"].as_str().unwrap_or_default();
    assert!(
        from.starts_with(first.to_str().unwrap()),
        "resumed from '{from}'"
    );
    let first_step = common::first_logged_step(&second);
    assert!(
        first_step > stopped_at,
        "the resumed run began again at step {first_step}"
    );
    let diff = worst_relative_difference(&weights(&second), &weights(&clean));
    assert!(
        diff <= tolerance,
        "resumed and uninterrupted runs differ by {diff:e}"
    );
}

#[test]
fn sigterm_stops_a_run_at_a_checkpoint_that_auto_resumes_exactly() {
    stop_and_resume(&[], 0.0);
}

/// SIGTERM to the node launcher only (as `docker stop` sends it): passed on to both workers, which stop
/// at the same step.
#[cfg(feature = "torch")]
#[test]
fn sigterm_to_the_node_launcher_stops_every_rank_at_one_checkpoint() {
    stop_and_resume(&["trainer=ddp_sim"], 1e-6);
}

/// `ckpt_path=auto` with no earlier run of this config starts fresh; an earlier run of another config is
/// not resumed.
#[test]
fn auto_starts_fresh_without_an_earlier_run_of_the_same_config() {
    let p = real_project();
    let root = p.path();
    let other = root.join("runs/other");
    finished(&mut command(
        root,
        "runs/other",
        &[],
        &["trainer.max_epochs=1", "ckpt_path=auto"],
    ));
    assert!(other.join("checkpoints/last.safetensors").is_file());
    let fresh = root.join("runs/fresh");
    finished(&mut command(root, "runs/fresh", &[], &["ckpt_path=auto"]));
    let s = summary(&fresh);
    assert!(s["resumed_from"].is_null(), "{s}");
    assert_eq!(s["global_step"], 64, "{s}");
}

/// A checkpoint damaged after it was written (a byte flipped by a bad disk) is refused on load, and
/// `ckpt_path=auto` resumes from the one before it, with a warning.
#[test]
fn a_damaged_checkpoint_is_passed_over_for_the_one_before() {
    let p = real_project();
    let root = p.path();
    let older = root.join("runs/a");
    finished(&mut command(
        root,
        "runs/a",
        &[],
        &["trainer.max_epochs=1", "ckpt_path=auto"],
    ));
    // A later run of the same config (a copy, written after it) whose checkpoint a bad disk damaged.
    let newer = root.join("runs/b");
    common::copy_dir(&older, &newer);
    let damaged: PathBuf = newer.join("checkpoints/last.safetensors");
    let mut bytes = std::fs::read(&damaged).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&damaged, &bytes).unwrap();
    let err = trainyard::storage::checkpoint::load(&damaged)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("checksum"), "{err}");

    let out = finished(&mut command(
        root,
        "runs/c",
        &[],
        &["trainer.max_epochs=1", "ckpt_path=auto"],
    ));
    let s = summary(&root.join("runs/c"));
    let from = s["resumed_from"].as_str().unwrap_or_default();
    assert!(
        from.starts_with(older.to_str().unwrap()),
        "resumed from '{from}'"
    );
    let log = text(&out);
    assert!(
        log.contains("checksum") && log.contains("resuming from the checkpoint before it"),
        "{log}"
    );
}

/// `trainer.max_restarts=1`: a training process killed (-9) in its second epoch is started again from
/// the first epoch's checkpoint; the run ends as the uninterrupted one, its record names the restart,
/// and `metrics.csv` has every step once.
fn killed_and_restarted(strategy: &[&str], victim: usize, epoch_steps: u64, tolerance: f64) {
    let p = real_project();
    let root = p.path();
    let clean = root.join("clean/run");
    finished(&mut command(root, "clean/run", strategy, &[]));

    let run = root.join("runs/restarted");
    let mut cmd = command(
        root,
        "runs/restarted",
        strategy,
        &["trainer.max_restarts=1"],
    );
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while common::logged_step(&run) < epoch_steps + 4 {
        assert!(
            Instant::now() < deadline,
            "the run never reached its second epoch"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let workers = common::child_pids(child.id());
    assert!(workers.len() > victim, "workers {workers:?}");
    // SAFETY: killing a process of this test's run.
    unsafe { libc::kill(workers[victim] as i32, libc::SIGKILL) };
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));

    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(record["state"], "completed", "{record}");
    let restarts = record["restarts"].as_array().expect("restarts in run.json");
    assert_eq!(restarts.len(), 1, "{record}");
    assert_eq!(restarts[0]["rank"], victim, "{record}");
    assert!(
        restarts[0]["cause"].as_str().unwrap().contains("signal 9"),
        "{record}"
    );
    assert_eq!(restarts[0]["resumed_at_step"], epoch_steps, "{record}");
    let s = summary(&run);
    assert_eq!(s["global_step"], 2 * epoch_steps, "{s}");
    // The restarted process loaded the first epoch's state, not only its name.
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(
        log.contains(&format!("(epoch 1, step {epoch_steps})")),
        "{log}"
    );
    assert!(
        s["resumed_from"]
            .as_str()
            .is_some_and(|f| f.contains("runs/restarted")),
        "{s}"
    );
    // Each row once, as in the uninterrupted run: none repeated from before the restart, none lost.
    let steps = |run: &Path| -> Vec<(u64, bool)> {
        common::csv_rows(run)
            .iter()
            .filter_map(|row| {
                let step = row.iter().find(|(k, _)| k == "step")?.1 as u64;
                Some((step, row.iter().any(|(k, _)| k == "train/loss")))
            })
            .collect()
    };
    assert_eq!(steps(&run), steps(&clean));
    let diff = worst_relative_difference(&weights(&run), &weights(&clean));
    assert!(
        diff <= tolerance,
        "restarted and uninterrupted runs differ by {diff:e}"
    );
}

#[test]
fn a_killed_training_process_restarts_from_its_checkpoint() {
    killed_and_restarted(&[], 0, 32, 0.0);
}

#[cfg(feature = "torch")]
#[test]
fn a_killed_worker_restarts_every_rank_from_the_checkpoint() {
    // Two ranks: 16 steps an epoch.
    killed_and_restarted(&["trainer=ddp_sim"], 1, 16, 1e-6);
}
