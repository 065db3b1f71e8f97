//! The warning a cluster sends before it stops a job (SLURM's `--signal=USR1@N` before the time limit or on
//! preemption). The handler only sets a flag; the fit loop reads it at the next optimizer step, every rank
//! agrees, a checkpoint is written and the run stops so the launcher can requeue it (Lightning's
//! SLURM auto-requeue).

use std::sync::atomic::{AtomicBool, Ordering};

static ARMED: AtomicBool = AtomicBool::new(false);
static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_usr1(_: libc::c_int) {
    // Async-signal-safe: one atomic store.
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Catch SIGUSR1 from now on (its default action would kill the process). Idempotent.
pub fn arm_preemption() -> std::io::Result<()> {
    if ARMED.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    // SAFETY: installing a handler that only stores to an atomic; SA_RESTART keeps blocking calls going.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_usr1 as *const () as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()) != 0 {
            ARMED.store(false, Ordering::SeqCst);
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether the handler is installed: only then do ranks spend a collective per step agreeing on it.
pub fn preemption_armed() -> bool {
    ARMED.load(Ordering::SeqCst)
}

/// Whether the warning signal arrived.
pub fn preemption_requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigusr1_sets_the_flag_instead_of_killing() {
        arm_preemption().unwrap();
        assert!(preemption_armed());
        // SAFETY: signalling this process, whose handler only sets a flag.
        unsafe { libc::raise(libc::SIGUSR1) };
        assert!(preemption_requested());
        REQUESTED.store(false, Ordering::SeqCst);
    }
}
