//! The node launcher: without an external launcher, `trainer.devices=N` makes this process start N workers
//! (this same binary, same arguments, torchrun's environment variables), watch them, and on the first
//! failure stop the others and report which rank died, how, and the end of its log — or, with
//! `trainer.max_restarts=N` (torchrun's `--max-restarts`), start them all again from the run's latest
//! checkpoint, recording each restart in the run directory (`restarts.json`, copied into `run.json`).

use super::outcome::{report, JobOutcome};
use crate::comm::env::Cluster;
use crate::config::errors::ConfigError;
use crate::config::interpolate::ResolveContext;
use crate::trainer::Summary;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// What the node launcher needs.
pub struct NodeLaunch {
    pub exe: PathBuf,
    pub args: Vec<OsString>,
    pub cluster: Cluster,
    /// The launch time every worker resolves `${now:...}` with (one run directory for all ranks).
    pub now: String,
    /// Where the workers write (for the failed rank's log).
    pub run_dir: PathBuf,
    /// `trainer.preemption_grace_s`: how long workers have to checkpoint after a stop signal.
    pub grace: Duration,
    /// `trainer.max_restarts`.
    pub max_restarts: u32,
    /// The run's own checkpoints a restart resumes from (the newest), for the restart's record.
    pub resume_files: Vec<PathBuf>,
}

/// How the launcher watches its workers: the run's grace after a stop signal, its restarts and the
/// checkpoints they resume from.
pub struct NodeWatch {
    pub grace: Duration,
    pub max_restarts: u32,
    pub resume_files: Vec<PathBuf>,
}

pub use crate::comm::RESTART_ENV;

/// A worker that failed: which, and how.
pub(super) struct Failure {
    pub rank: usize,
    pub pid: u32,
    pub status: ExitStatus,
    /// This worker had not ended: it stalled, and a peer's collective timed out waiting for it (`status`
    /// is that peer's). What its process was doing (`/proc`'s state), when known.
    pub stalled: Option<String>,
}

impl Failure {
    /// How it failed; a timed-out collective with no worker of this node stalled points at the others.
    fn cause(&self, cluster: &Cluster) -> String {
        match &self.stalled {
            Some(state) => format!(
                "stalled ({state}): it took no part in a collective the other ranks waited \
                 trainer.collective_timeout_s for"
            ),
            None if self.status.code() == Some(crate::comm::EXIT_COLLECTIVE_TIMEOUT.into()) => {
                let mine = cluster.node_rank * cluster.local_world_size
                    ..(cluster.node_rank + 1) * cluster.local_world_size;
                let others: Vec<String> = (0..cluster.world_size)
                    .filter(|r| !mine.contains(r))
                    .map(|r| r.to_string())
                    .collect();
                format!(
                    "{}: a collective waited trainer.collective_timeout_s for a rank of another node \
                     (ranks {}), which stalled, or the network between the nodes drops its packets",
                    describe(self.status),
                    others.join(", ")
                )
            }
            None => describe(self.status),
        }
    }
}

/// A live process's state as `/proc/<pid>/stat` says it: "stopped by a signal" for SIGSTOP.
fn process_state(pid: u32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command name's closing parenthesis.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim().chars().next());
    match state {
        Some('T') | Some('t') => "its process is stopped by a signal".into(),
        Some('D') => "its process waits on the disk or a device".into(),
        Some('R') => "its process is running".into(),
        Some('S') => "its process is sleeping".into(),
        Some('Z') => "its process has ended".into(),
        _ => "its process state is unknown".into(),
    }
}

/// How this node's workers ended, when none failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NodeEnd {
    Completed,
    /// A stop signal (to the launcher, passed on, or to the workers): every worker stopped at a resume
    /// checkpoint.
    Preempted,
}

/// A free TCP port on this machine for the rendezvous (single node, MASTER_PORT not set).
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// The log file a rank writes in the run directory.
pub fn rank_log(run_dir: &Path, rank: usize) -> PathBuf {
    run_dir.join(format!("train.rank{rank}.log"))
}

pub(super) fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(sig)) => format!(
            "was killed by signal {sig}{}",
            match sig {
                9 => " (SIGKILL: killed by hand or by the out-of-memory killer)",
                15 => " (SIGTERM)",
                11 => " (SIGSEGV)",
                6 => " (SIGABRT)",
                _ => "",
            }
        ),
        _ => "ended".into(),
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let Ok(text) = std::fs::read_to_string(path) else {
        return format!("      ({} could not be read)", path.display());
    };
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..]
        .iter()
        .map(|l| format!("      {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Stop every worker still running: SIGTERM, then SIGKILL after a grace period.
fn stop_all(children: &mut [(usize, Child)]) {
    for (_, child) in children.iter_mut() {
        if matches!(child.try_wait(), Ok(None)) {
            // SAFETY: signalling a child we started and have not reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for (_, child) in children.iter_mut() {
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

/// Start this node's workers and wait for them, restarting them all after a failure while
/// `max_restarts` allows. Ok when every worker succeeded or stopped at a resume checkpoint after a stop
/// signal.
fn run_node(launch: &NodeLaunch) -> anyhow::Result<NodeEnd> {
    let mut restarts = 0;
    loop {
        let mut children = start_workers(launch, restarts)?;
        let failure = match watch(launch, &mut children)? {
            Ok(end) => return Ok(end),
            Err(failure) => failure,
        };
        let others = children.len() - 1;
        stop_all(&mut children);
        let cause = failure.cause(&launch.cluster);
        let log = rank_log(&launch.run_dir, failure.rank);
        if failure.status.code() == Some(crate::comm::EXIT_NODE_MISSING.into()) {
            // Waiting again would not bring the node back: the worker said which one is gone.
            return Err(crate::comm::NodeMissing(format!(
                "worker rank {} stopped: a node did not come to the rendezvous (its message is above); \
                 not restarted{}",
                failure.rank,
                match restarts {
                    0 => String::new(),
                    n => format!(" (after {n} restart(s))"),
                }
            ))
            .into());
        }
        if crate::platform::signals::preemption_requested() {
            // Stopping anyway: the run ends at its last complete checkpoint, to be continued.
            tracing::warn!(
                "worker rank {} {cause} while the run was stopping; the last complete checkpoint is kept",
                failure.rank
            );
            return Ok(NodeEnd::Preempted);
        }
        if restarts < launch.max_restarts {
            restarts += 1;
            let restart = record_restart(
                &launch.run_dir,
                launch.cluster.node_rank,
                &launch.resume_files,
                &failure,
                &cause,
            );
            tracing::warn!(
                "worker rank {} (pid {}) {cause}; restarting all {} worker(s) of this node ({restarts} of \
                 trainer.max_restarts={}) from {}",
                failure.rank,
                failure.pid,
                others + 1,
                launch.max_restarts,
                resume_point(&restart)
            );
            continue;
        }
        let spent = match launch.max_restarts {
            0 => String::new(),
            n => format!(" after {restarts} of trainer.max_restarts={n} restart(s)"),
        };
        anyhow::bail!(
            "worker rank {} (pid {}) {cause}{spent}; stopped the other {others} worker(s) of this node.\n    \
             Last lines of {}:\n{}\n    \
             To resume from the last checkpoint: run the same command with ckpt_path=auto",
            failure.rank,
            failure.pid,
            log.display(),
            tail(&log, 8)
        );
    }
}

/// Start this node's workers (`restart`: how many times they were started before).
fn start_workers(launch: &NodeLaunch, restart: u32) -> anyhow::Result<Vec<(usize, Child)>> {
    let c = &launch.cluster;
    // A fresh port each round on one node: the last round's store may still hold the old one.
    let port = match c.master_port {
        Some(p) => p,
        None => free_port()?,
    };
    // As torchrun does, workers share the cores instead of each starting one thread per core (libtorch's
    // OpenMP pool, Candle's rayon pool); a value set by the user is kept.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (cores / c.local_world_size.max(1)).max(1).to_string();
    let mut children: Vec<(usize, Child)> = Vec::new();
    for local_rank in 0..c.local_world_size {
        let rank = c.node_rank * c.local_world_size + local_rank;
        let mut cmd = Command::new(&launch.exe);
        cmd.args(&launch.args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", local_rank.to_string())
            .env("WORLD_SIZE", c.world_size.to_string())
            .env("LOCAL_WORLD_SIZE", c.local_world_size.to_string())
            .env("GROUP_RANK", c.node_rank.to_string())
            .env("NODE_RANK", c.node_rank.to_string())
            .env("MASTER_ADDR", &c.master_addr)
            .env("MASTER_PORT", port.to_string())
            .env(crate::comm::NOW_ENV, &launch.now);
        if restart > 0 {
            cmd.env(RESTART_ENV, restart.to_string());
        }
        for pool in ["OMP_NUM_THREADS", "RAYON_NUM_THREADS"] {
            if std::env::var_os(pool).is_none() {
                cmd.env(pool, &threads);
            }
        }
        // Workers die with their launcher (killed, scancel'ed, timed out) instead of training on as orphans.
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        match cmd.spawn() {
            Ok(child) => children.push((rank, child)),
            Err(e) => {
                stop_all(&mut children);
                anyhow::bail!(
                    "could not start worker rank {rank} ({}): {e}",
                    launch.exe.display()
                );
            }
        }
    }
    tracing::info!(
        "started {} worker(s) on node {} of {} (ranks {}..{}), rendezvous at {}:{port}",
        children.len(),
        c.node_rank,
        c.num_nodes,
        c.node_rank * c.local_world_size,
        (c.node_rank + 1) * c.local_world_size - 1,
        c.master_addr
    );
    Ok(children)
}

/// Wait for the workers: how they ended, or the first that failed (the rank killed by a signal, when the
/// others failed only because their peer was gone).
fn watch(
    launch: &NodeLaunch,
    children: &mut [(usize, Child)],
) -> anyhow::Result<Result<NodeEnd, Failure>> {
    // A stop signal to the launcher (`docker stop`, a spot notice, `kill`) is passed on to every worker,
    // which checkpoint at the same step; past the grace, the launcher stops them.
    let mut relay = StopRelay::new(launch.grace);
    let mut preempted = false;
    loop {
        if relay.outlasted(children) {
            return Ok(Ok(NodeEnd::Preempted));
        }
        let mut running = 0;
        let mut failed = None;
        for (i, (_, child)) in children.iter_mut().enumerate() {
            match child.try_wait()? {
                None => running += 1,
                Some(status)
                    if status.code() == Some(crate::platform::signals::EXIT_PREEMPTED.into()) =>
                {
                    preempted = true;
                }
                Some(status) if !status.success() => {
                    failed = Some((i, status));
                    break;
                }
                Some(_) => {}
            }
        }
        if let Some((first, status)) = failed {
            // The others usually fail a moment later (their peer is gone): look again shortly and name the
            // rank that was killed by a signal, if one was, as the cause.
            std::thread::sleep(Duration::from_millis(300));
            // A worker that found a node missing at the rendezvous says more than its peers' errors.
            let missing = |s: &ExitStatus| s.code() == Some(crate::comm::EXIT_NODE_MISSING.into());
            let mut cause = (first, status);
            for (i, (_, child)) in children.iter_mut().enumerate() {
                use std::os::unix::process::ExitStatusExt;
                if let Ok(Some(s)) = child.try_wait() {
                    let signalled = s.signal().is_some() && cause.1.signal().is_none();
                    if (missing(&s) || signalled) && !missing(&cause.1) {
                        cause = (i, s);
                    }
                }
            }
            let (mut i, status) = cause;
            // A collective that timed out: the peer it waited for is the one still running.
            let mut stalled = None;
            if status.code() == Some(crate::comm::EXIT_COLLECTIVE_TIMEOUT.into()) {
                if let Some(j) = children
                    .iter_mut()
                    .position(|(_, c)| matches!(c.try_wait(), Ok(None)))
                {
                    i = j;
                    stalled = Some(process_state(children[j].1.id()));
                }
            }
            return Ok(Err(Failure {
                rank: children[i].0,
                pid: children[i].1.id(),
                status,
                stalled,
            }));
        }
        if running == 0 {
            return Ok(Ok(match preempted {
                true => NodeEnd::Preempted,
                false => NodeEnd::Completed,
            }));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A stop signal to a launcher (`docker stop`, a spot notice, `kill`) passed on to its children, which
/// checkpoint at the same step; past the grace (and a margin), the launcher stops them itself.
pub(super) struct StopRelay {
    grace: Duration,
    passed_on: Option<Instant>,
}

impl StopRelay {
    pub(super) fn new(grace: Duration) -> StopRelay {
        StopRelay {
            grace,
            passed_on: None,
        }
    }

    /// Called while waiting for the children: passes a stop signal on, once; true when they outlasted
    /// the grace and were stopped (the last complete checkpoint is kept).
    pub(super) fn outlasted(&mut self, children: &mut [(usize, Child)]) -> bool {
        use crate::platform::signals::{preemption_requested, received_signal};
        if self.passed_on.is_none() && preemption_requested() {
            for (_, child) in children.iter_mut() {
                if matches!(child.try_wait(), Ok(None)) {
                    // SAFETY: signalling a child we started and have not reaped.
                    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
                }
            }
            self.passed_on = Some(Instant::now());
        }
        let outlasted = self
            .passed_on
            .is_some_and(|t| t.elapsed() > self.grace + Duration::from_secs(5));
        if outlasted {
            stop_all(children);
            tracing::warn!(
                "the run did not stop within trainer.preemption_grace_s={} after {}; the last complete \
                 checkpoint is kept (run the same command with ckpt_path=auto)",
                self.grace.as_secs(),
                received_signal().unwrap_or("a stop signal")
            );
        }
        outlasted
    }
}

/// Record a restart in the run directory (node 0's launcher keeps the run's records) and return it:
/// the failure, and the newest of `resume_files` with its step, where training goes on from.
pub(super) fn record_restart(
    run_dir: &Path,
    node: usize,
    resume_files: &[PathBuf],
    failure: &Failure,
    cause: &str,
) -> crate::storage::records::Restart {
    let newest = crate::trainer::newest_first(resume_files.to_vec())
        .into_iter()
        .next();
    let step = newest
        .as_ref()
        .and_then(|f| {
            crate::storage::checkpoint::read_training_state(f)
                .ok()
                .flatten()
        })
        .map(|t| t.global_step);
    let restart = crate::storage::records::Restart {
        at: chrono::Local::now().to_rfc3339(),
        cause: format!("rank {} (pid {}) {cause}", failure.rank, failure.pid),
        rank: failure.rank,
        node,
        resumed_from: newest.map(|f| f.display().to_string()),
        resumed_at_step: step,
    };
    if node == 0 {
        if let Err(e) = crate::storage::records::Restart::append(run_dir, restart.clone()) {
            tracing::warn!("could not record the restart in {}: {e}", run_dir.display());
        }
    }
    restart
}

/// "checkpoints/last.safetensors (step 32)", or "the start".
pub(super) fn resume_point(restart: &crate::storage::records::Restart) -> String {
    restart
        .resumed_from
        .as_deref()
        .map_or("the start".to_string(), |f| {
            format!("{f} (step {})", restart.resumed_at_step.unwrap_or(0))
        })
}

/// The node launcher's side of a distributed job: start this node's workers, wait, and report.
pub fn launch_node(
    cluster: crate::comm::env::Cluster,
    output_dir: &Path,
    ctx: &ResolveContext,
    watch: NodeWatch,
) -> Result<JobOutcome, ConfigError> {
    let grace = watch.grace;
    // Caught, the launcher passes a stop signal on to its workers and waits for their checkpoint; its own
    // watchdog leaves them the grace and a margin.
    if let Err(e) = crate::platform::signals::arm_preemption(grace + Duration::from_secs(10)) {
        tracing::warn!("could not catch SIGTERM/SIGUSR1 in the node launcher: {e}");
    }
    let exe = std::env::current_exe()
        .map_err(|e| ConfigError::Io(format!("cannot find this program to start workers: {e}")))?;
    let node = cluster.node_rank;
    let launch = NodeLaunch {
        exe,
        args: std::env::args_os().skip(1).collect(),
        now: ctx.now.to_rfc3339(),
        run_dir: output_dir.to_path_buf(),
        cluster,
        grace,
        max_restarts: watch.max_restarts,
        resume_files: watch.resume_files,
    };
    let started = std::time::Instant::now();
    let end =
        run_node(&launch).map_err(|e| match e.downcast_ref::<crate::comm::NodeMissing>() {
            Some(missing) => ConfigError::NodeMissing(missing.0.clone()),
            None => ConfigError::Run(format!("{e:#}")),
        })?;
    if end == NodeEnd::Preempted {
        let signal = crate::platform::signals::received_signal().unwrap_or("a stop signal");
        return Ok(JobOutcome {
            message: super::outcome::preempted_message(signal, output_dir),
            main_metric: None,
            output_dir: output_dir.to_path_buf(),
            rank: 0,
            preempted: true,
        });
    }
    let summary = Summary::read(output_dir).map_err(|e| ConfigError::Run(format!("{e:#}")))?;
    let seconds = started.elapsed().as_secs_f64();
    let message = match &summary {
        Some(s) => report(s, output_dir, Some((s.devices * s.num_nodes.max(1), seconds))),
        // Other nodes: rank 0 (on node 0) writes the run's records.
        None => format!(
            "node {node}: all workers finished in {seconds:.1}s (rank 0 writes the run records on node 0)"
        ),
    };
    Ok(JobOutcome {
        main_metric: summary.as_ref().and_then(Summary::main_metric),
        message,
        output_dir: output_dir.to_path_buf(),
        rank: 0,
        preempted: false,
    })
}
