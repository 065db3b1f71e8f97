//! Chaos: a deterministic run interrupted again and again at seeded random moments — a worker killed
//! (-9), SIGTERM to the launcher, every process killed in the middle of a checkpoint write, every process
//! killed during validation — and continued each time (by the launcher's `trainer.max_restarts`, or by
//! the same command again with `ckpt_path=auto`) ends with the weights, the optimizer state and the
//! per-step losses of a run never interrupted: bitwise on Candle, within 1e-6 across two DDP processes.

mod common;
use common::{logged_step, real_project, worst_relative_difference, SMALL_CNN, TRAIN};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Momentum SGD (so the optimizer has state to restore), constant rate, 1024 images in batches of 32,
/// three epochs, a row of metrics per step reaching the disk at once.
const RUN: &[&str] = &[
    "optimizer=sgd",
    "optimizer.momentum=0.9",
    "scheduler=constant",
    "data.train_size=1024",
    "data.batch_size=32",
    "trainer.max_epochs=3",
    "trainer.log_every_n_steps=1",
    "logger.csv.flush_every_n_steps=1",
    "trainer.deterministic=true",
];

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// SIGKILL to one training process: the launcher restarts them all.
    KillWorker,
    /// SIGTERM to the launcher: every rank checkpoints and the run exits 75; the command is run again.
    TermLauncher,
    /// SIGKILL to every process while a checkpoint is being written; the command is run again.
    KillInCheckpointWrite,
    /// SIGKILL to every process right after an epoch's last step (during its validation).
    KillInValidation,
}

/// xorshift64*: the moments and kinds of the faults, the same for a seed on every machine.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

fn command(root: &Path, dir: &str, strategy: &[&str], extra: &[&str]) -> Command {
    let mut cmd = Command::new(TRAIN);
    cmd.args(SMALL_CNN)
        .args(RUN)
        .args(strategy)
        .args(extra)
        .arg(format!("hydra.run.dir={dir}"))
        .current_dir(root)
        .env_remove("TRAIN_CONFIG_PATH")
        .env("RAYON_NUM_THREADS", "1")
        .env("OMP_NUM_THREADS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

/// Every process below `pid`, children first.
fn descendants(pid: u32) -> Vec<u32> {
    let mut out = common::child_pids(pid);
    let mut i = 0;
    while i < out.len() {
        let below = common::child_pids(out[i]);
        out.extend(below);
        i += 1;
    }
    out
}

fn kill(pid: u32, signal: i32) {
    // SAFETY: signalling a process of this test's run.
    unsafe { libc::kill(pid as i32, signal) };
}

/// Wait for the run to end: its status and what it wrote to stderr (read to the end first, as
/// `wait_with_output` does, so a full pipe cannot stall it).
fn finish(child: &mut Child) -> (std::process::ExitStatus, String) {
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        std::io::Read::read_to_string(&mut pipe, &mut stderr).unwrap();
    }
    (child.wait().unwrap(), stderr)
}

/// Wait until `ready` or the run ends; false when it ended first.
fn wait_for(child: &mut Child, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if ready() {
            return true;
        }
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        assert!(Instant::now() < deadline, "the run stalled");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Wait until the run started after `since` is training (its `run.json` rewritten: the signal handlers
/// are in place and the workers running), so a fault lands on this attempt, not on its start-up; false
/// when it ended first.
fn started_training(child: &mut Child, run: &Path, since: std::time::SystemTime) -> bool {
    wait_for(child, || {
        std::fs::metadata(run.join("run.json"))
            .and_then(|m| m.modified())
            .is_ok_and(|t| t > since)
    })
}

/// A checkpoint being written: `write_atomic`'s temporary file in the checkpoint folder.
fn writing_checkpoint(run: &Path) -> bool {
    std::fs::read_dir(run.join("checkpoints"))
        .map(|entries| {
            entries.flatten().any(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with('.') && name.contains(".tmp-")
            })
        })
        .unwrap_or(false)
}

/// (step, train/loss) of every training row of `metrics.csv`.
fn loss_curve(run: &Path) -> Vec<(u64, f64)> {
    common::csv_rows(run)
        .iter()
        .filter_map(|row| {
            let step = row.iter().find(|(k, _)| k == "step")?.1 as u64;
            let loss = row.iter().find(|(k, _)| k == "train/loss")?.1;
            Some((step, loss))
        })
        .collect()
}

/// Every tensor of a run's last checkpoint, the optimizer's included.
fn full_state(run: &Path) -> trainyard::tensor::StateDict {
    trainyard::storage::checkpoint::load(&run.join("checkpoints/last.safetensors"))
        .unwrap()
        .state
}

fn chaos(strategy: &[&str], ranks: usize, seed: u64, faults: usize, tolerance: f64) {
    let epoch_steps = 32 / ranks as u64;
    let total = 3 * epoch_steps;
    let p = real_project();
    let root = p.path();
    let clean = root.join("clean/run");
    let out = command(root, "clean/run", strategy, &[]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let run: PathBuf = root.join("runs/chaos");
    let mut rng = Rng(seed);
    let kinds = [
        Fault::KillWorker,
        Fault::TermLauncher,
        Fault::KillInCheckpointWrite,
        Fault::KillInValidation,
    ];
    let mut injected: Vec<(Fault, u64)> = Vec::new();
    let mut attempts = 0;
    let extra = ["trainer.max_restarts=10", "ckpt_path=auto"];
    let mut child = command(root, "runs/chaos", strategy, &extra)
        .spawn()
        .unwrap();
    let mut completed = false;
    let mut started = started_training(&mut child, &run, std::time::SystemTime::UNIX_EPOCH);
    while started && injected.len() < faults {
        let fault = kinds[rng.below(kinds.len() as u64) as usize];
        let at = (logged_step(&run) + 2 + rng.below(epoch_steps)).min(total - 2);
        let reached = match fault {
            Fault::KillInCheckpointWrite => wait_for(&mut child, || writing_checkpoint(&run)),
            Fault::KillInValidation => wait_for(&mut child, || {
                let step = logged_step(&run);
                step >= at && step.is_multiple_of(epoch_steps)
            }),
            _ => wait_for(&mut child, || logged_step(&run) >= at),
        };
        if !reached {
            break;
        }
        let step = logged_step(&run);
        match fault {
            Fault::KillWorker => {
                let workers = descendants(child.id());
                let victim = workers[rng.below(workers.len() as u64) as usize];
                kill(victim, libc::SIGKILL);
                injected.push((fault, step));
                continue;
            }
            Fault::TermLauncher => kill(child.id(), libc::SIGTERM),
            Fault::KillInCheckpointWrite | Fault::KillInValidation => {
                // A machine gone: every process at once, the workers before their launcher can react.
                for pid in descendants(child.id()) {
                    kill(pid, libc::SIGKILL);
                }
                kill(child.id(), libc::SIGKILL);
            }
        }
        injected.push((fault, step));
        let (status, stderr) = finish(&mut child);
        if fault == Fault::TermLauncher {
            // A signal during the last epoch's last step or validation: the run completes (exit 0).
            let code = status.code();
            assert!(
                code == Some(75) || code == Some(0),
                "{fault:?} at step {step}: {status:?}: {stderr}"
            );
            if code == Some(0) {
                completed = true;
                break;
            }
        }
        attempts += 1;
        let spawned = std::time::SystemTime::now();
        child = command(root, "runs/chaos", strategy, &extra)
            .spawn()
            .unwrap();
        started = started_training(&mut child, &run, spawned);
    }
    if !completed {
        let (status, stderr) = finish(&mut child);
        assert!(status.success(), "after {injected:?}: {stderr}");
    }
    println!(
        "faults injected (kind, step): {injected:?}; the command was run {} times",
        attempts + 1
    );
    assert!(
        injected.len() >= faults.min(3),
        "only {injected:?} happened before the run ended"
    );
    let theirs = loss_curve(&clean);
    let ours = loss_curve(&run);
    assert_eq!(ours.len(), theirs.len(), "{injected:?}: rows differ");
    for ((s1, l1), (s2, l2)) in ours.iter().zip(&theirs) {
        assert_eq!(s1, s2, "{injected:?}: steps differ");
        assert!(
            (l1 - l2).abs() <= tolerance * l2.abs(),
            "{injected:?}: step {s1}: loss {l1} against {l2}"
        );
    }
    let diff = worst_relative_difference(&full_state(&run), &full_state(&clean));
    assert!(
        diff <= tolerance,
        "{injected:?}: weights and optimizer state differ by {diff:e}"
    );
}

#[test]
fn a_run_interrupted_at_random_moments_ends_as_if_never_interrupted() {
    chaos(&[], 1, 0x5eed_0001, 4, 0.0);
}

#[cfg(feature = "torch")]
#[test]
fn a_two_rank_run_interrupted_at_random_moments_ends_as_if_never_interrupted() {
    chaos(&["trainer=ddp_sim"], 2, 0x5eed_0002, 4, 1e-6);
}

/// `bench/chaos.sh`: the same with new seeds, over and over for `TRAINYARD_CHAOS_MINUTES` (60 by
/// default), on one process and (with `--features torch`) two; reports the faults survived and how many
/// runs ended equal to their uninterrupted twin.
#[test]
#[ignore = "long: run by bench/chaos.sh"]
fn chaos_for_a_while() {
    let minutes: u64 = std::env::var("TRAINYARD_CHAOS_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(60);
    let until = Instant::now() + Duration::from_secs(60 * minutes);
    let (mut runs, mut equal, mut seed) = (0, 0, 1u64);
    while Instant::now() < until {
        let setups: &[(&[&str], usize, f64)] = &[
            (&[], 1, 0.0),
            #[cfg(feature = "torch")]
            (&["trainer=ddp_sim"], 2, 1e-6),
        ];
        for (strategy, ranks, tolerance) in setups {
            seed += 1;
            runs += 1;
            let ok = std::panic::catch_unwind(|| chaos(strategy, *ranks, seed, 5, *tolerance));
            if ok.is_ok() {
                equal += 1;
            }
            println!(
                "chaos: seed {seed} {strategy:?}: {}",
                if ok.is_ok() {
                    "equal"
                } else {
                    "DIFFERENT OR FAILED"
                }
            );
        }
    }
    println!("chaos: {runs} runs with 5 faults each in {minutes} min: {equal} ended equal to the uninterrupted run");
    assert_eq!(equal, runs);
}

/// libtorch's engine (`backend=tch`): the same faults, within 1e-6.
#[cfg(feature = "torch")]
#[test]
fn a_tch_run_interrupted_at_random_moments_ends_as_if_never_interrupted() {
    chaos(&["backend=tch"], 1, 0x5eed_0003, 4, 1e-6);
}
