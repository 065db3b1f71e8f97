//! `trainer.max_restarts` for a run of one process: this process starts the training as a child (this
//! same binary, same arguments, the same launch time so the same run directory), passes a stop signal on
//! to it, and when it fails starts it again from the run's newest checkpoint, recording each restart,
//! as the node launcher does for its workers.

use super::node::{
    describe, record_restart, resume_point, Failure, NodeWatch, StopRelay, RESTART_ENV,
};
use super::outcome::{report, JobOutcome};
use crate::config::errors::ConfigError;
use crate::config::interpolate::ResolveContext;
use crate::trainer::Summary;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Set in the supervised process: it trains instead of supervising again.
pub const SUPERVISED_ENV: &str = "TRAINYARD_SUPERVISED";

/// Whether this process is the one a supervisor started.
pub fn is_supervised() -> bool {
    std::env::var_os(SUPERVISED_ENV).is_some()
}

/// Run the training in a child process, restarting it after a failure while `max_restarts` allows.
pub fn supervise(
    output_dir: &Path,
    ctx: &ResolveContext,
    watch: NodeWatch,
) -> Result<JobOutcome, ConfigError> {
    let run_error = |e: anyhow::Error| ConfigError::Run(format!("{e:#}"));
    if let Err(e) = crate::platform::signals::arm_preemption(watch.grace + Duration::from_secs(10))
    {
        tracing::warn!("could not catch SIGTERM/SIGUSR1 in the supervisor: {e}");
    }
    let exe = std::env::current_exe()
        .map_err(|e| ConfigError::Io(format!("cannot find this program to start the run: {e}")))?;
    let started = Instant::now();
    let mut restarts = 0;
    loop {
        let mut cmd = Command::new(&exe);
        cmd.args(std::env::args_os().skip(1))
            .env(SUPERVISED_ENV, "1")
            .env(crate::comm::NOW_ENV, ctx.now.to_rfc3339());
        if restarts > 0 {
            cmd.env(RESTART_ENV, restarts.to_string());
        }
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| {
            ConfigError::Run(format!("could not start the run ({}): {e}", exe.display()))
        })?;
        let mut children = vec![(0usize, child)];
        let status = wait(&mut children, watch.grace).map_err(run_error)?;
        if status.success() {
            break;
        }
        // Stopped by a signal (passed on by this process, or its own): the run said so itself, or died
        // while stopping; either way it goes on from its last complete checkpoint.
        if status.code() == Some(crate::platform::signals::EXIT_PREEMPTED.into())
            || crate::platform::signals::preemption_requested()
        {
            return Ok(JobOutcome {
                message: String::new(),
                main_metric: None,
                output_dir: output_dir.to_path_buf(),
                rank: 0,
                preempted: true,
            });
        }
        let failure = Failure {
            rank: 0,
            pid: children[0].1.id(),
            status,
            stalled: None,
        };
        let cause = describe(status);
        if restarts >= watch.max_restarts {
            return Err(ConfigError::Run(format!(
                "the training process (pid {}) {cause} after {restarts} of trainer.max_restarts={} \
                 restart(s); run the same command with ckpt_path=auto to resume from its last checkpoint",
                failure.pid, watch.max_restarts
            )));
        }
        restarts += 1;
        let restart = record_restart(output_dir, 0, &watch.resume_files, &failure, &cause);
        tracing::warn!(
            "the training process (pid {}) {cause}; restarting it ({restarts} of trainer.max_restarts={}) \
             from {}",
            failure.pid,
            watch.max_restarts,
            resume_point(&restart)
        );
    }
    let summary = Summary::read(output_dir).map_err(run_error)?;
    // The run reported itself; after restarts the supervisor adds the whole time.
    let message = match (restarts, &summary) {
        (0, _) | (_, None) => String::new(),
        (_, Some(s)) => report(s, output_dir, Some((1, started.elapsed().as_secs_f64()))),
    };
    Ok(JobOutcome {
        main_metric: summary.as_ref().and_then(Summary::main_metric),
        message,
        output_dir: output_dir.to_path_buf(),
        rank: 0,
        preempted: false,
    })
}

/// Wait for the child, passing a stop signal on to it and stopping it when it outlasts the grace.
fn wait(
    children: &mut [(usize, Child)],
    grace: Duration,
) -> anyhow::Result<std::process::ExitStatus> {
    let mut relay = StopRelay::new(grace);
    loop {
        if let Some(status) = children[0].1.try_wait()? {
            return Ok(status);
        }
        if relay.outlasted(children) {
            // Stopped: ends as preempted.
            return Ok(children[0].1.wait()?);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
