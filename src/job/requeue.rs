//! SLURM's auto-requeue, as Lightning's SLURM environment does it: a job started by `sbatch` catches the
//! warning signal (`--signal=USR1@N`), the trainer stops at a checkpoint, and rank 0 puts the job back in
//! the queue with `scontrol requeue`; the requeued job resumes from that checkpoint in the same directory.
//! A launcher may cap the requeues (`hydra.launcher.max_num_timeout`) through `TRAINYARD_MAX_REQUEUES`.

use std::process::Command;

/// The cap on requeues a launcher passes to its jobs.
pub const MAX_REQUEUES_ENV: &str = "TRAINYARD_MAX_REQUEUES";

/// Whether this process is a task of a SLURM batch job (not an interactive allocation, where the user's
/// shell owns the job): only such a job is requeued when SLURM's warning signal stops it.
pub fn in_slurm_batch_job() -> bool {
    let env = |k: &str| std::env::var(k).ok();
    env("SLURM_JOB_ID").is_some()
        && !matches!(
            env("SLURM_JOB_NAME").as_deref(),
            Some("bash" | "interactive")
        )
}

/// The id `scontrol` knows this job by: `<array job>_<task>` for an array task, else the job id.
fn slurm_job_id(env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    match (env("SLURM_ARRAY_JOB_ID"), env("SLURM_ARRAY_TASK_ID")) {
        (Some(job), Some(task)) => Some(format!("{job}_{task}")),
        _ => env("SLURM_JOB_ID"),
    }
}

/// Put this job back in SLURM's queue, unless it was requeued as often as allowed. Ok says what was done.
pub fn requeue_this_job() -> Result<String, String> {
    let env = |k: &str| std::env::var(k).ok();
    let Some(id) = slurm_job_id(&env) else {
        return Err(
            "the job was stopped by SIGUSR1 outside a SLURM job: nothing requeues it; \
                    resume it with ckpt_path=<run dir>/checkpoints/hpc_ckpt.safetensors"
                .into(),
        );
    };
    let restarts: u32 = env("SLURM_RESTART_COUNT")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if let Some(max) = env(MAX_REQUEUES_ENV).and_then(|v| v.parse::<u32>().ok()) {
        if restarts >= max {
            return Err(format!(
                "SLURM job {id} was warned of its end again after {restarts} requeue(s): \
                 hydra.launcher.max_num_timeout={max} allows no more. Its checkpoint is kept; raise \
                 max_num_timeout or timeout_min and resume the sweep"
            ));
        }
    }
    let out = Command::new("scontrol")
        .args(["requeue", &id])
        .output()
        .map_err(|e| format!("could not run `scontrol requeue {id}`: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`scontrol requeue {id}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let message = format!(
        "SLURM job {id} requeued (restart {}): it resumes from its checkpoint",
        restarts + 1
    );
    tracing::warn!("{message}");
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::array_task(&[("SLURM_JOB_ID", "17"), ("SLURM_ARRAY_JOB_ID", "12"), ("SLURM_ARRAY_TASK_ID", "5")], Some("12_5"))]
    #[case::plain_job(&[("SLURM_JOB_ID", "17")], Some("17"))]
    #[case::no_slurm(&[], None)]
    fn the_id_scontrol_knows(#[case] vars: &[(&str, &str)], #[case] want: Option<&str>) {
        let env = |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        assert_eq!(slurm_job_id(&env).as_deref(), want);
    }
}
