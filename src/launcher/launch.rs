//! Running a batch of a sweep's jobs with the chosen launcher — Hydra's basic launcher (one after another in
//! this process), joblib or submitit_local (processes on this machine), submitit_slurm (a SLURM array) —
//! for whichever sweeper chose them.

use super::job::{run_job, SweepSlot};
use super::local::{joblib_n_jobs, JobCommand, LocalLauncher, SweepJob};
use super::sweep_job::JobResult;
use super::tally::Tally;
use crate::config::compose::RunMode;
use crate::config::errors::ConfigError;
use crate::config::grammar::Override;
use crate::config::hydra::{compose_with_hydra, parse_overrides, split_hydra};
use crate::config::interpolate::ResolveContext;
use crate::config::tree::{Node, Value};
use crate::project::Setup;
use crate::storage::records;
use std::path::{Path, PathBuf};

/// What every sweeper hands its jobs to: the chosen launcher, with how to start and compose a job.
pub struct JobLauncher<'a> {
    pub setup: &'a Setup,
    pub(super) ctx: &'a ResolveContext,
    pub(super) command: JobCommand,
    pub(super) launcher_name: String,
    pub(super) launcher: Node,
    pub sweep_dir: PathBuf,
}

impl JobLauncher<'_> {
    /// A job's overrides parsed: the sweep's Hydra overrides first, then its own.
    fn job_overrides(&self, job: &[String]) -> Result<Vec<Override>, ConfigError> {
        let texts: Vec<String> = self
            .command
            .hydra_overrides
            .iter()
            .chain(job)
            .cloned()
            .collect();
        parse_overrides(&texts)
    }

    /// Run `todo` with the launcher, recording each job's end in `tally` (which may stop the rest).
    pub fn run(&self, todo: &[SweepJob], tally: &mut Tally) -> Result<(), ConfigError> {
        let (setup, ctx, sweep_dir) = (self.setup, self.ctx, &self.sweep_dir);
        match self.launcher_name.as_str() {
            "joblib" | "submitit_local" => {
                let local = local_launcher(&self.launcher_name, &self.launcher, sweep_dir)?;
                for job in todo {
                    tally.start(job);
                }
                tally.save()?;
                local.launch(&self.command, todo, &mut |result| tally.done(result))?;
            }
            "submitit_slurm" => {
                let shapes = |job: &SweepJob| {
                    job_shape(
                        setup,
                        &self.job_overrides(&job.overrides)?,
                        job.num,
                        sweep_dir,
                        ctx,
                    )
                };
                super::slurm_sweep::run(&self.launcher, &self.command, todo, &shapes, tally)?;
            }
            _ => {
                for job in todo {
                    eprintln!("#{} : {}", job.num, job.overrides.join(" "));
                    tally.start(job);
                    tally.save()?;
                    let slot = SweepSlot {
                        dir: sweep_dir,
                        num: job.num,
                        own_process: false,
                    };
                    let outcome = self
                        .job_overrides(&job.overrides)
                        .and_then(|parsed| {
                            compose_with_hydra(
                                &setup.repo,
                                &setup.config_name,
                                &parsed,
                                RunMode::Run,
                            )
                        })
                        .and_then(|composed| {
                            run_job(setup, composed, &job.overrides, Some(slot), ctx)
                        });
                    let result = match outcome {
                        // A stop signal: the job is at a resume checkpoint; the sweep stops with it and a
                        // rerun in the same sweep directory continues the job from there.
                        Ok(o) if o.preempted => JobResult {
                            num: job.num,
                            state: records::JobState::Preempted,
                            output_dir: Some(o.output_dir),
                            main_metric: None,
                            error: Some(o.message),
                        },
                        Ok(o) => JobResult {
                            num: job.num,
                            state: records::JobState::Completed,
                            output_dir: Some(o.output_dir),
                            main_metric: o.main_metric,
                            error: None,
                        },
                        Err(e) => JobResult::failed(job.num, e.to_string()),
                    };
                    if !tally.done(result)? {
                        break;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The joblib launcher (`n_jobs`, `timeout` in seconds) or submitit's local one (every job at once,
/// `timeout_min`), from the resolved `hydra.launcher` node.
fn local_launcher(name: &str, node: &Node, sweep_dir: &Path) -> Result<LocalLauncher, ConfigError> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let number = |k: &str| match node.get(k).map(|n| &n.value) {
        Some(Value::Int(i)) => Some(*i as f64),
        Some(Value::Float(f)) => Some(*f),
        _ => None,
    };
    Ok(match name {
        "joblib" => LocalLauncher {
            n_jobs: joblib_n_jobs(number("n_jobs").unwrap_or(-1.0) as i64, cores)?,
            timeout: number("timeout").map(std::time::Duration::from_secs_f64),
            log_dir: sweep_dir.join(".jobs"),
        },
        _ => LocalLauncher {
            n_jobs: usize::MAX,
            timeout: number("timeout_min").map(|m| std::time::Duration::from_secs_f64(m * 60.0)),
            log_dir: match node.get("submitit_folder").and_then(Node::as_str) {
                Some(f) => super::local::folder_of(f).to_path_buf(),
                None => sweep_dir.join(".submitit"),
            },
        },
    })
}

/// The allocation a job needs: (nodes, tasks per node), from its typed config: `trainer.num_nodes`, and
/// one task per device for DDP/FSDP (SLURM then starts every rank).
fn job_shape(
    setup: &Setup,
    overrides: &[Override],
    num: usize,
    sweep_dir: &Path,
    ctx: &ResolveContext,
) -> Result<(usize, usize), ConfigError> {
    let composed = compose_with_hydra(&setup.repo, &setup.config_name, overrides, RunMode::Run)?;
    let (job_cfg, hydra) = split_hydra(composed.config);
    let place = super::place::place_job(setup, &job_cfg, hydra, num, Some(sweep_dir), ctx)?;
    let resolved = crate::config::interpolate::resolve_all(&job_cfg, &place.ctx)?;
    let exp = crate::schema::extract(&resolved)?;
    let t = &exp.trainer;
    let tasks = match (t.strategy, t.devices) {
        (
            crate::schema::Strategy::Ddp | crate::schema::Strategy::Fsdp,
            crate::schema::Devices::Count(n),
        ) => n.max(1),
        _ => 1,
    };
    Ok((t.num_nodes.max(1), tasks))
}
