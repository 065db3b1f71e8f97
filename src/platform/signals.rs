//! The signals that stop a training run from outside: SIGTERM (a spot instance's termination notice,
//! `scancel`, a Kubernetes eviction, `docker stop`, the node launcher passing one on) and SIGUSR1 (SLURM's
//! `--signal=USR1@N` before the time limit). The handler only records the signal; the fit loop reads it at
//! the next optimizer step, every rank agrees, a resume checkpoint is written and the run stops as
//! `preempted` with [`EXIT_PREEMPTED`] (a SLURM batch job is requeued first, as Lightning's SLURM
//! auto-requeue does). A watchdog bounds the wait: a run that has not stopped `grace` seconds after the
//! signal exits with the same code, keeping the last complete checkpoint (checkpoints are written atomically).

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The exit status of a run stopped by a signal at a resume checkpoint (BSD's `EX_TEMPFAIL`: try again).
/// Rerunning the same command with `ckpt_path=auto` continues it.
pub const EXIT_PREEMPTED: u8 = 75;

static ARMED: AtomicBool = AtomicBool::new(false);
/// The grace in milliseconds; the latest `arm_preemption` sets it (a worker arms at start-up, before its
/// config is read, and again with `trainer.preemption_grace_s`).
static GRACE_MS: AtomicU64 = AtomicU64::new(25_000);
/// The signal that asked the run to stop; 0 when none came.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    // Async-signal-safe: one atomic store.
    RECEIVED.store(signal, Ordering::SeqCst);
}

/// Catch SIGTERM and SIGUSR1 from now on (their default action would kill the process), and start the
/// watchdog that ends the process `grace` after one arrives if the run has not stopped by then.
/// Idempotent.
pub fn arm_preemption(grace: Duration) -> std::io::Result<()> {
    GRACE_MS.store(grace.as_millis() as u64, Ordering::SeqCst);
    if ARMED.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    for signal in [libc::SIGTERM, libc::SIGUSR1] {
        // SAFETY: installing a handler that only stores to an atomic; SA_RESTART keeps blocking calls going.
        let installed = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut()) == 0
        };
        if !installed {
            ARMED.store(false, Ordering::SeqCst);
            return Err(std::io::Error::last_os_error());
        }
    }
    std::thread::Builder::new()
        .name("preemption-watchdog".into())
        .spawn(watchdog)?;
    Ok(())
}

/// Waits for a signal, says what happens next, and ends the process when the grace runs out.
fn watchdog() {
    while RECEIVED.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    let since = Instant::now();
    let grace = Duration::from_millis(GRACE_MS.load(Ordering::SeqCst));
    tracing::warn!(
        "{} received: finishing the current step and writing a resume checkpoint (grace {:.0} s)",
        signal_name(RECEIVED.load(Ordering::SeqCst)),
        grace.as_secs_f64()
    );
    std::thread::sleep(grace.saturating_sub(since.elapsed()));
    eprintln!(
        "error: the run did not reach a step boundary within trainer.preemption_grace_s={:.0}; \
         exiting without a new checkpoint (the last complete one is kept; ckpt_path=auto resumes it)",
        grace.as_secs_f64()
    );
    std::process::exit(EXIT_PREEMPTED.into());
}

/// Whether the handler is installed: only then do ranks spend a collective per step agreeing on it.
pub fn preemption_armed() -> bool {
    ARMED.load(Ordering::SeqCst)
}

/// Whether a stopping signal arrived.
pub fn preemption_requested() -> bool {
    RECEIVED.load(Ordering::SeqCst) != 0
}

/// The signal that arrived (`SIGTERM`, `SIGUSR1`), if one did.
pub fn received_signal() -> Option<&'static str> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(signal_name(s)),
    }
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGTERM => "SIGTERM",
        libc::SIGUSR1 => "SIGUSR1",
        _ => "a stop signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_signal_sets_the_flag_instead_of_killing() {
        arm_preemption(Duration::from_secs(3600)).unwrap();
        assert!(preemption_armed());
        for (signal, name) in [(libc::SIGUSR1, "SIGUSR1"), (libc::SIGTERM, "SIGTERM")] {
            // SAFETY: signalling this process, whose handler only sets a flag.
            unsafe { libc::raise(signal) };
            assert!(preemption_requested());
            assert_eq!(received_signal(), Some(name));
            RECEIVED.store(0, Ordering::SeqCst);
        }
    }
}
