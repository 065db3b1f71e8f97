//! Hydra's BasicLauncher: the batch's jobs one after another in this process, each composed from its
//! overrides and run as a job of the sweep.

use super::{LaunchContext, Launcher, Progress, SweepJob};
use crate::config::compose::RunMode;
use crate::config::errors::ConfigError;
use crate::config::hydra::compose_with_hydra;
use crate::job::in_sweep::JobResult;
use crate::job::run::{run_job, SweepSlot};
use crate::storage::records::JobState;

pub struct BasicLauncher;

impl Launcher for BasicLauncher {
    fn launch(
        &self,
        cx: &LaunchContext,
        batch: &[SweepJob],
        progress: &mut dyn Progress,
    ) -> Result<(), ConfigError> {
        let setup = cx.setup;
        for job in batch {
            eprintln!("#{} : {}", job.num, job.overrides.join(" "));
            progress.started(job);
            progress.save()?;
            let slot = SweepSlot {
                dir: cx.sweep_dir(),
                num: job.num,
                own_process: false,
            };
            let outcome = cx
                .job_overrides(&job.overrides)
                .and_then(|parsed| {
                    compose_with_hydra(&setup.repo, &setup.config_name, &parsed, RunMode::Run)
                })
                .and_then(|composed| run_job(setup, composed, &job.overrides, Some(slot), cx.ctx));
            let result = match outcome {
                // A stop signal: the job is at a resume checkpoint; the sweep stops with it and a rerun in
                // the same sweep directory continues the job from there.
                Ok(o) if o.preempted => JobResult {
                    num: job.num,
                    state: JobState::Preempted,
                    output_dir: Some(o.output_dir),
                    main_metric: None,
                    error: Some(o.message),
                },
                Ok(o) => JobResult {
                    num: job.num,
                    state: JobState::Completed,
                    output_dir: Some(o.output_dir),
                    main_metric: o.main_metric,
                    error: None,
                },
                Err(e) => JobResult::failed(job.num, e.to_string()),
            };
            if !progress.ended(result)? {
                break;
            }
        }
        Ok(())
    }
}
