//! A rank that stalls rather than dies (SIGSTOP: its process alive, its connections open, no part in any
//! collective). The other rank's collective times out after `trainer.collective_timeout_s` and it exits
//! with code 76; the node launcher names the rank still running as the one that stalled, stops it
//! (SIGTERM, then SIGKILL: a stopped process does not handle SIGTERM), and exits 1 — or, with
//! `trainer.max_restarts`, starts every worker again from the newest checkpoint, and the run ends with
//! the weights of a run never interrupted. Two processes on this machine over Gloo.
#![cfg(feature = "torch")]

mod common;
use common::{real_project, worst_relative_difference, SMALL_CNN, TRAIN};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TIMEOUT_S: u64 = 8;

/// Momentum SGD at a constant rate (state a wrong resume would show), a checkpoint every epoch, 32 steps
/// an epoch per rank, deterministic kernels.
fn args(dir: &str, extra: &[&str]) -> Vec<String> {
    let run: &[&str] = &[
        "backend=tch",
        "trainer=ddp_sim",
        "optimizer=sgd",
        "optimizer.momentum=0.9",
        "scheduler=constant",
        "data.train_size=1024",
        "data.batch_size=16",
        "data.num_workers=0",
        "trainer.max_epochs=3",
        "trainer.deterministic=true",
        "trainer.log_every_n_steps=1",
    ];
    let timeout = format!("trainer.collective_timeout_s={TIMEOUT_S}");
    let dir = format!("hydra.run.dir={dir}");
    SMALL_CNN
        .iter()
        .chain(run)
        .chain(extra)
        .map(|s| s.to_string())
        .chain([timeout, dir])
        .collect()
}

fn launch(root: &Path, args: &[String]) -> Child {
    Command::new(TRAIN)
        .args(args)
        .current_dir(root)
        .env_remove("TRAIN_CONFIG_PATH")
        .env("OMP_NUM_THREADS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The launcher's workers: (pid, RANK).
fn workers_of(pid: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let ppid: u32 = after.split(' ').nth(1).unwrap().parse().unwrap();
        if ppid == pid {
            let environ = std::fs::read(format!("/proc/{child}/environ")).unwrap_or_default();
            let rank = String::from_utf8_lossy(&environ)
                .split('\0')
                .find_map(|kv| kv.strip_prefix("RANK=").map(str::to_string))
                .unwrap_or_default();
            out.push((child, rank));
        }
    }
    out
}

/// Wait for the first epoch's checkpoint and a few steps of the second, then stop rank 1 (SIGSTOP);
/// returns its pid and when it was stopped.
fn stall_rank_1_in_epoch_2(launcher: &mut Child, run: &Path) -> (u32, Instant) {
    let start = Instant::now();
    while !run.join("checkpoints/last.safetensors").exists() {
        assert!(start.elapsed() < Duration::from_secs(240), "no checkpoint");
        assert!(
            launcher.try_wait().unwrap().is_none(),
            "the run ended early"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let workers = workers_of(launcher.id());
    let (victim, _) = workers
        .iter()
        .find(|(_, r)| r == "1")
        .unwrap_or_else(|| panic!("no rank 1 among {workers:?}"))
        .clone();
    // SAFETY: signalling a process this test started (a child of the launcher).
    unsafe { libc::kill(victim as i32, libc::SIGSTOP) };
    (victim, Instant::now())
}

fn finish(mut launcher: Child) -> (std::process::ExitStatus, String) {
    let status = launcher.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(launcher.stderr.as_mut().unwrap(), &mut err).unwrap();
    (status, err)
}

fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z "))
}

#[test]
fn a_stalled_rank_is_named_and_every_process_ends_within_the_collective_timeout() {
    let p = real_project();
    let mut launcher = launch(p.path(), &args("runs/stalled", &[]));
    let run = p.path().join("runs/stalled");
    let (victim, stopped_at) = stall_rank_1_in_epoch_2(&mut launcher, &run);
    let (status, err) = finish(launcher);
    let took = stopped_at.elapsed();
    // The timeout, then the launcher's 5 s between SIGTERM and SIGKILL, and a margin for two cores.
    assert!(
        took < Duration::from_secs(TIMEOUT_S + 5 + 15),
        "the run took {took:?} to end"
    );
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("worker rank 1 (pid {victim}) stalled"))
            && err.contains("stopped by a signal")
            && err.contains("trainer.collective_timeout_s"),
        "{err}"
    );
    assert!(gone(victim), "the stalled worker {victim} is still there");
    // Rank 0's own error (its stderr is the launcher's) is the timeout's.
    assert!(
        err.contains("Timed out waiting")
            && err.contains("a collective waited trainer.collective_timeout_s for another rank"),
        "{err}"
    );
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(record["state"], "failed", "{record}");
}

#[test]
fn with_max_restarts_a_stalled_rank_is_replaced_and_the_run_ends_as_if_never_interrupted() {
    let p = real_project();
    let root = p.path();
    let (status, err) = finish(launch(root, &args("runs/clean", &[])));
    assert!(status.success(), "{err}");
    let mut launcher = launch(root, &args("runs/two", &["trainer.max_restarts=1"]));
    let run = root.join("runs/two");
    let (victim, _) = stall_rank_1_in_epoch_2(&mut launcher, &run);
    let (status, err) = finish(launcher);
    assert!(status.success(), "{err}");
    assert!(gone(victim));
    let restarts: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(run.join("restarts.json")).unwrap()).unwrap();
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    assert!(
        restarts[0]["cause"].as_str().unwrap().contains("rank 1")
            && restarts[0]["cause"].as_str().unwrap().contains("stalled"),
        "{restarts:?}"
    );
    assert_eq!(
        common::logged_steps(&run),
        common::logged_steps(&root.join("runs/clean")),
        "metrics.csv repeats or loses steps"
    );
    let full = |dir: &str| {
        trainyard::storage::checkpoint::load(&root.join(dir).join("checkpoints/last.safetensors"))
            .unwrap()
            .state
    };
    let diff = worst_relative_difference(&full("runs/two"), &full("runs/clean"));
    assert!(
        diff <= 1e-6,
        "weights and optimizer state differ by {diff:e}"
    );
}
