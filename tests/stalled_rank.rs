//! A rank that stalls rather than dies (SIGSTOP: its process alive, its connections open, no part in any
//! collective). The other rank's collective times out after `trainer.collective_timeout_s` and it exits
//! with code 76; the node launcher names the rank still running as the one that stalled, stops it
//! (SIGTERM, then SIGKILL: a stopped process does not handle SIGTERM), and exits 1 — or, with
//! `trainer.max_restarts`, starts every worker again from the newest checkpoint, and the run ends with
//! the weights of a run never interrupted. Two processes on this machine over Gloo; and two "nodes" (network
//! namespaces) whose link starts dropping every packet.
#![cfg(feature = "torch")]

mod common;
use common::netns::TwoNodes;
use common::{real_project, SMALL_CNN, TRAIN};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TIMEOUT_S: u64 = 8;

/// DDP over two processes of this node.
const ONE_NODE: &[&str] = &["trainer=ddp_sim"];

/// One process on each of two nodes.
const TWO_NODES: &[&str] = &[
    "trainer=ddp",
    "trainer.accelerator=cpu",
    "trainer.num_nodes=2",
    "trainer.devices=1",
    "trainer.sync_batchnorm=false",
    "trainer.process_group_backend=gloo",
    "trainer.rendezvous_timeout_s=60",
];

/// `strategy` with momentum SGD at a constant rate (state a wrong resume would show), a checkpoint every
/// epoch, 32 steps an epoch per rank, deterministic kernels.
fn args(dir: &str, strategy: &[&str], extra: &[&str]) -> Vec<String> {
    let run: &[&str] = &[
        "backend=tch",
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
        .chain(strategy)
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

/// Wait for the first epoch's checkpoint and a few steps of the second.
fn into_epoch_2(launcher: &mut Child, run: &Path) {
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
}

/// In epoch 2, stop rank 1 (SIGSTOP); returns its pid and when it was stopped.
fn stall_rank_1_in_epoch_2(launcher: &mut Child, run: &Path) -> (u32, Instant) {
    into_epoch_2(launcher, run);
    let workers = common::workers_of(launcher.id());
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
    let mut launcher = launch(p.path(), &args("runs/stalled", ONE_NODE, &[]));
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
    let (status, err) = finish(launch(root, &args("runs/clean", ONE_NODE, &[])));
    assert!(status.success(), "{err}");
    let mut launcher = launch(
        root,
        &args("runs/two", ONE_NODE, &["trainer.max_restarts=1"]),
    );
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
    common::assert_same_end(&run, &root.join("runs/clean"));
}

/// A link between two nodes that drops every packet (nothing arrives, nothing errs): both ranks'
/// collectives time out after `trainer.collective_timeout_s`, and each node's launcher says a rank of the
/// other node stalled or the network drops packets; with `trainer.max_restarts`, once the link heals, the
/// group forms again and the run ends with the uninterrupted weights.
#[test]
fn a_link_that_drops_every_packet_times_out_and_the_run_resumes_once_it_heals() {
    let test = "a_link_that_drops_every_packet_times_out_and_the_run_resumes_once_it_heals";
    let Some(nodes) = TwoNodes::create(test, 8) else {
        return;
    };
    let p = real_project();
    let root = p.path();
    let node = |n: usize, dir: &str, port: u16, extra: &[&str]| -> Child {
        nodes
            .command(n, TRAIN)
            .args(args(dir, TWO_NODES, extra))
            .current_dir(root)
            .env_remove("TRAIN_CONFIG_PATH")
            .env("OMP_NUM_THREADS", "1")
            .env("MASTER_ADDR", &nodes.addr[0])
            .env("MASTER_PORT", port.to_string())
            .env("NODE_RANK", n.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let both = |dir: &str, port: u16, extra: &[&str]| {
        [node(0, dir, port, extra), node(1, dir, port, extra)]
    };

    let [n0, n1] = both("runs/clean", 29541, &[]);
    for (status, err) in [finish(n0), finish(n1)] {
        assert!(status.success(), "{err}");
    }

    // Without restarts: both nodes stop soon, each naming the other's rank.
    let [mut n0, n1] = both("runs/cut", 29542, &[]);
    into_epoch_2(&mut n0, &root.join("runs/cut"));
    nodes.drop_packets(true);
    let cut_at = Instant::now();
    let ends = [finish(n0), finish(n1)];
    let took = cut_at.elapsed();
    nodes.drop_packets(false);
    assert!(
        took < Duration::from_secs(TIMEOUT_S + 5 + 20),
        "the nodes took {took:?} to stop"
    );
    for (n, (status, err)) in ends.iter().enumerate() {
        assert_eq!(status.code(), Some(1), "node {n}: {err}");
        let said = format!(
            "a collective waited trainer.collective_timeout_s for a rank of another node (ranks {})",
            1 - n
        );
        assert!(err.contains(&said), "node {n}: {err}");
    }

    // With a restart: the link heals once node 0 restarted its worker, and the group forms again.
    let [mut n0, n1] = both("runs/two", 29543, &["trainer.max_restarts=1"]);
    let run = root.join("runs/two");
    into_epoch_2(&mut n0, &run);
    nodes.drop_packets(true);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !run.join("restarts.json").is_file() {
        assert!(
            Instant::now() < deadline,
            "node 0 did not restart its worker"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    nodes.drop_packets(false);
    for (n, (status, err)) in [finish(n0), finish(n1)].iter().enumerate() {
        assert!(status.success(), "node {n}: {err}");
    }
    common::assert_same_end(&run, &root.join("runs/clean"));
}
