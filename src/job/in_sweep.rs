//! A sweep's job in a process of its own, started by the parallel or the SLURM launcher as
//! `train --sweep-job N --sweep-dir DIR -- <overrides>`: compose the job, run it in its numbered directory,
//! and leave its result where the launching `train` reads it (`DIR/.jobs/N.json`). Only the process that
//! reports the job writes the result (rank 0, not a worker of a node launcher).

use super::run::{run_job, SweepSlot};
use crate::config::compose::RunMode;
use crate::config::errors::ConfigError;
use crate::config::hydra::runtime::is_hydra_override;
use crate::config::hydra::{compose_with_hydra, parse_overrides};
use crate::config::interpolate::ResolveContext;
use crate::project::Setup;
use crate::storage::records::{write_atomic, JobState};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// How a sweep's job ended, as its process reports it to the launcher.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct JobResult {
    pub num: usize,
    pub state: JobState,
    #[serde(default)]
    pub output_dir: Option<PathBuf>,
    #[serde(default)]
    pub main_metric: Option<crate::storage::records::LeadMetric>,
    #[serde(default)]
    pub error: Option<String>,
}

impl JobResult {
    /// Where job `num` of the sweep in `sweep_dir` leaves its result.
    pub fn path(sweep_dir: &Path, num: usize) -> PathBuf {
        sweep_dir.join(".jobs").join(format!("{num}.json"))
    }

    pub fn failed(num: usize, error: String) -> JobResult {
        JobResult {
            num,
            state: JobState::Failed,
            output_dir: None,
            main_metric: None,
            error: Some(error),
        }
    }

    pub fn write(&self, sweep_dir: &Path) -> std::io::Result<()> {
        let path = Self::path(sweep_dir, self.num);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        write_atomic(&path, text.as_bytes())
    }

    /// The result job `num` left, if it ended.
    pub fn read(sweep_dir: &Path, num: usize) -> Option<JobResult> {
        let text = std::fs::read_to_string(Self::path(sweep_dir, num)).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Forget an earlier attempt's result before the job runs again.
    pub fn clear(sweep_dir: &Path, num: usize) {
        let _ = std::fs::remove_file(Self::path(sweep_dir, num));
    }
}

/// Is this process one that reports its job: not a worker started by our node launcher (whose launcher
/// reports), and rank 0 of a job SLURM started several tasks of.
fn reports_job() -> bool {
    let env = |k: &str| std::env::var(k).ok();
    let node_worker = env(crate::comm::NOW_ENV).is_some() && env("RANK").is_some();
    !node_worker && matches!(env("SLURM_PROCID").as_deref(), None | Some("0"))
}

/// `train --sweep-job N --sweep-dir DIR -- <sweep's hydra overrides> <job's overrides>`.
pub fn run_sweep_job(
    setup: &Setup,
    num: usize,
    sweep_dir: &Path,
    overrides: &[String],
    ctx: &ResolveContext,
) -> Result<ExitCode, ConfigError> {
    let parsed = parse_overrides(overrides)?;
    let job_overrides: Vec<String> = parsed
        .iter()
        .filter(|o| !is_hydra_override(o))
        .map(|o| o.input.clone())
        .collect();
    let slot = SweepSlot {
        dir: sweep_dir,
        num,
        own_process: true,
    };
    let outcome = compose_with_hydra(&setup.repo, &setup.config_name, &parsed, RunMode::Run)
        .and_then(|composed| run_job(setup, composed, &job_overrides, Some(slot), ctx));
    let result = match &outcome {
        Ok(o) if o.preempted => {
            println!("{}", o.message);
            // Requeued: the job's next attempt reports it; otherwise the sweep sees it stopped.
            return Ok(super::outcome::preempted_exit_code());
        }
        Ok(o) if o.rank > 0 => return Ok(ExitCode::SUCCESS),
        Ok(o) => JobResult {
            num,
            state: JobState::Completed,
            output_dir: Some(o.output_dir.clone()),
            main_metric: o.main_metric.clone(),
            error: None,
        },
        Err(e) => JobResult::failed(num, e.to_string()),
    };
    if reports_job() {
        result.write(sweep_dir).map_err(|e| {
            ConfigError::Io(format!(
                "could not write {}: {e}",
                JobResult::path(sweep_dir, num).display()
            ))
        })?;
    }
    match outcome {
        Ok(o) => {
            if !o.message.is_empty() {
                println!("{}", o.message);
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Err(e),
    }
}
