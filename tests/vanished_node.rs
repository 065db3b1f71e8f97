//! A node that vanishes from a two-node run (its launcher and its worker killed at once, as when its
//! machine is lost): the other node's launcher restarts its worker (`trainer.max_restarts`), which waits
//! at the rendezvous for the missing node up to `trainer.rendezvous_timeout_s`. If the node does not come
//! back, the run stops with a message naming it (and is not restarted again); if the same command is
//! started on it again within the timeout, the group forms again, every rank resumes from the newest
//! checkpoint, and the run ends as if never interrupted. Two "nodes" on this machine (NODE_RANK 0 and 1,
//! MASTER_ADDR 127.0.0.1), one worker each, over Gloo.
#![cfg(feature = "torch")]

mod common;
use common::{logged_step, real_project, SMALL_CNN, TRAIN};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Momentum SGD (optimizer state to restore), a constant rate, a checkpoint every epoch, 1024 images in
/// batches of 16 per rank (32 steps an epoch), a metrics row per step on disk at once.
const RUN: &[&str] = &[
    "backend=tch",
    "trainer.accelerator=cpu",
    "trainer.precision=32-true",
    "trainer.num_nodes=2",
    "trainer.devices=1",
    "trainer.sync_batchnorm=false",
    "trainer.process_group_backend=gloo",
    "trainer.collective_timeout_s=30",
    "trainer.max_restarts=2",
    "optimizer=sgd",
    "optimizer.momentum=0.9",
    "scheduler=constant",
    "data.train_size=1024",
    "data.batch_size=16",
    "data.num_workers=0",
    "trainer.max_epochs=3",
    "trainer.log_every_n_steps=1",
    "logger.csv.flush_every_n_steps=1",
    "trainer.deterministic=true",
];

/// DDP (every rank starts from rank 0's state) unless `STRATEGY` says otherwise.
const DDP: &[&str] = &["trainer=ddp"];

/// FSDP with one consolidated checkpoint that every rank reads itself: a node started afresh must know
/// the group is resuming.
const FSDP: &[&str] = &["trainer=fsdp", "trainer.fsdp.sharding_strategy=FULL_SHARD"];

fn node(
    root: &Path,
    strategy: &[&str],
    dir: &str,
    port: u16,
    rank: usize,
    timeout_s: u64,
) -> Child {
    Command::new(TRAIN)
        .args(SMALL_CNN)
        .args(strategy)
        .args(RUN)
        .arg(format!("trainer.rendezvous_timeout_s={timeout_s}"))
        .arg(format!("hydra.run.dir={dir}"))
        .current_dir(root)
        .env_remove("TRAIN_CONFIG_PATH")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("NODE_RANK", rank.to_string())
        .env("RAYON_NUM_THREADS", "1")
        .env("OMP_NUM_THREADS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The node launcher's status and its stderr (its workers' too).
fn finish(mut child: Child) -> (std::process::ExitStatus, String) {
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        std::io::Read::read_to_string(&mut pipe, &mut stderr).unwrap();
    }
    (child.wait().unwrap(), stderr)
}

/// A machine lost: the launcher and everything it started, killed at once.
fn vanish(launcher: &mut Child) {
    let mut pids = common::child_pids(launcher.id());
    pids.push(launcher.id());
    for pid in pids {
        // SAFETY: signalling a process this test started (or its child).
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    let _ = launcher.wait();
}

/// Start both nodes and kill node 1 once the run is past its first epoch's checkpoint; node 0 goes on.
fn start_then_lose_node_1(root: &Path, strategy: &[&str], port: u16, timeout_s: u64) -> Child {
    let n0 = node(root, strategy, "runs/two", port, 0, timeout_s);
    let mut n1 = node(root, strategy, "runs/two", port, 1, timeout_s);
    let run = root.join("runs/two");
    let deadline = Instant::now() + Duration::from_secs(240);
    while logged_step(&run) < 40 {
        assert!(Instant::now() < deadline, "the run did not get going");
        std::thread::sleep(Duration::from_millis(20));
    }
    vanish(&mut n1);
    n0
}

#[test]
fn the_others_wait_for_a_vanished_node_then_name_it() {
    let p = real_project();
    let port = common::free_port();
    let timeout_s = 6;
    let n0 = start_then_lose_node_1(p.path(), DDP, port, timeout_s);
    let lost_at = Instant::now();
    let (status, stderr) = finish(n0);
    let waited = lost_at.elapsed();
    assert_eq!(
        status.code(),
        Some(69),
        "node 0 must stop with EX_UNAVAILABLE: {stderr}"
    );
    for want in [
        "node 1 (rank 1) did not come to the rendezvous",
        "trainer.rendezvous_timeout_s=6s",
        "NODE_RANK=1",
        "not restarted",
    ] {
        assert!(stderr.contains(want), "missing {want:?} in:\n{stderr}");
    }
    assert!(
        waited >= Duration::from_secs(timeout_s),
        "node 0 stopped after {waited:?}, before the {timeout_s}s it should wait"
    );
    // One wait, not one per restart left (max_restarts=2).
    assert!(
        waited < Duration::from_secs(2 * timeout_s + 15),
        "{waited:?}"
    );
    let restarts = std::fs::read_to_string(p.path().join("runs/two/restarts.json")).unwrap();
    assert!(restarts.contains("\"node\": 0"), "{restarts}");
}

#[rstest::rstest]
#[case::ddp(DDP)]
#[case::fsdp(FSDP)]
fn a_node_that_comes_back_in_time_rejoins_and_the_run_ends_as_if_never_interrupted(
    #[case] strategy: &[&str],
) {
    let p = real_project();
    let root = p.path();
    // The same run, never interrupted.
    let port = common::free_port();
    let clean = [
        node(root, strategy, "runs/clean", port, 0, 120),
        node(root, strategy, "runs/clean", port, 1, 120),
    ];
    for n in clean {
        let (status, stderr) = finish(n);
        assert!(status.success(), "{stderr}");
    }
    let port = common::free_port();
    let n0 = start_then_lose_node_1(root, strategy, port, 120);
    // The machine comes back while node 0's restarted worker waits at the rendezvous, and the same
    // command is started on it (no restart of its own: only the group can tell it to resume).
    let restarts = root.join("runs/two/restarts.json");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !restarts.is_file() {
        assert!(
            Instant::now() < deadline,
            "node 0 did not restart its worker"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_secs(2));
    let n1 = node(root, strategy, "runs/two", port, 1, 120);
    let (s0, e0) = finish(n0);
    let (s1, e1) = finish(n1);
    assert!(s0.success(), "node 0: {e0}");
    assert!(s1.success(), "node 1: {e1}");
    // The node started afresh resumed with the others (it was told the group is restarting).
    let log1 = std::fs::read_to_string(root.join("runs/two/train.rank1.log")).unwrap_or_default();
    assert!(
        log1.contains("Resumed from"),
        "rank 1 did not resume:\n{log1}\n{e1}"
    );
    let run = root.join("runs/two");
    let restarts: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(run.join("restarts.json")).unwrap()).unwrap();
    assert_eq!(restarts.len(), 1, "one restart, node 0's: {restarts:?}");
    assert_eq!(restarts[0]["node"], 0, "{restarts:?}");
    assert!(
        restarts[0]["resumed_at_step"].as_u64().is_some(),
        "{restarts:?}"
    );
    common::assert_same_end(&run, &root.join("runs/clean"));
}
