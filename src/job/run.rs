//! One job, from its composed config to its records: place it, resolve and type its config, write
//! `.hydra/`, then train in this process, as one rank of a distributed run, or start this node's workers.

use super::logs::{with_rank_log, with_run_log, LogSetup};
use super::node::launch_node;
use super::outcome::{preempted_message, report, JobOutcome};
use super::place::place_job;
use crate::comm::Distributed;
use crate::config::compose::Composed;
use crate::config::errors::ConfigError;
use crate::config::hydra::{split_hydra, HydraSettings};
use crate::config::interpolate::{resolve_all, resolve_hydra_key, ResolveContext};
use crate::config::tree::{Node, Value};
use crate::config::yaml;
use crate::plan::{Machine, RunPlan};
use crate::project::Setup;
use crate::storage::records::{self, JobInfo};
use crate::trainer::Job;
use std::path::{Path, PathBuf};

/// A job's place in a sweep: the sweep's directory and the job's number.
#[derive(Clone, Copy)]
pub struct SweepSlot<'a> {
    pub dir: &'a Path,
    pub num: usize,
    /// The job runs in a process of its own (a parallel or SLURM launcher), not inside the sweep's: it
    /// may start workers of its own.
    pub own_process: bool,
}

/// Run one composed job: resolve, type and plan it, then start this node's workers, or join the run's
/// process group, or train here; rank 0 (or the only process) writes the job's records.
pub fn run_job(
    setup: &Setup,
    composed: Composed,
    overrides: &[String],
    slot: Option<SweepSlot>,
    ctx: &ResolveContext,
) -> Result<JobOutcome, ConfigError> {
    let num = slot.map_or(0, |s| s.num);
    let sweep_dir = slot.map(|s| s.dir);
    let (job_cfg, hydra) = split_hydra(composed.config);
    let settings = HydraSettings::read(&hydra)?;
    // `hydra.job.env_set` holds for the job: its config reads it (`${oc.env:...}`), its workers inherit it.
    let mut ctx = ctx.clone();
    for (k, v) in &settings.env_set {
        ctx.env.insert(k.clone(), v.clone());
    }
    let _env = JobEnv::set(&settings.env_set);
    let ctx = &ctx;
    let mut place = place_job(setup, &job_cfg, hydra.clone(), num, sweep_dir, ctx)?;
    let mut resolved = resolve_all(&job_cfg, &place.ctx)?;
    let mut experiment = crate::schema::extract(&resolved)?;
    let plan = RunPlan::new(&experiment, &Machine::probe(&experiment), &|k| {
        std::env::var(k).ok()
    })
    .map_err(run_error)?;
    let mut group = None;
    // Restarts are the launcher's: a sweep's job (the sweep records its failure and resumes it) and a
    // worker of an external launcher (torchrun's own --max-restarts, SLURM's requeue) are not restarted here.
    let external = plan.cluster.is_some() && !plan.launches_workers();
    let ours = std::env::var_os(crate::comm::NOW_ENV).is_some();
    if experiment.trainer.max_restarts > 0 && (slot.is_some() || (external && !ours)) {
        tracing::warn!(
            "trainer.max_restarts={} is not applied to {}: {}",
            experiment.trainer.max_restarts,
            if slot.is_some() {
                "a sweep's job"
            } else {
                "a worker another launcher started"
            },
            if slot.is_some() {
                "a failed job is marked failed and rerunning the sweep with hydra.sweep.dir=... continues it"
            } else {
                "use that launcher's restarts (torchrun --max-restarts, SLURM's requeue)"
            }
        );
    }
    // `max_restarts` on one process: this process supervises the training in a child.
    if plan.cluster.is_none()
        && experiment.trainer.max_restarts > 0
        && slot.is_none()
        && !super::supervisor::is_supervised()
    {
        let watch = super::node::NodeWatch {
            grace: std::time::Duration::from_secs(experiment.trainer.preemption_grace_s),
            max_restarts: experiment.trainer.max_restarts,
            resume_files: crate::trainer::own_checkpoints(&experiment, &place.output_dir),
        };
        return super::supervisor::supervise(&place.output_dir, &place.ctx, watch);
    }
    if let Some(cluster) = &plan.cluster {
        if plan.launches_workers() {
            if slot.is_some_and(|s| !s.own_process) {
                plan.check_sweepable().map_err(run_error)?;
            }
            let watch = super::node::NodeWatch {
                grace: std::time::Duration::from_secs(experiment.trainer.preemption_grace_s),
                max_restarts: experiment.trainer.max_restarts,
                resume_files: crate::trainer::own_checkpoints(&experiment, &place.output_dir),
            };
            return launch_node(cluster.clone(), &place.output_dir, &place.ctx, watch);
        }
        let now = place.ctx.now.to_rfc3339();
        let (joined, agreed) = crate::comm::join(cluster, &plan.join, &now).map_err(join_error)?;
        if agreed != now {
            // Another node launched this run: use rank 0's launch time, so every rank has one run directory.
            let mut agreed_ctx = ctx.clone();
            agreed_ctx.now = parse_now(&agreed).ok_or_else(|| {
                ConfigError::Run(format!("rank 0 sent a bad launch time '{agreed}'"))
            })?;
            place = place_job(setup, &job_cfg, hydra, num, sweep_dir, &agreed_ctx)?;
            resolved = resolve_all(&job_cfg, &place.ctx)?;
            experiment = crate::schema::extract(&resolved)?;
        }
        group = Some(joined);
    }
    let output_dir = place.output_dir.clone();
    let mut logging = log_setup(&settings, &job_cfg, &place.ctx, &output_dir)?;
    logging.hide_warnings = experiment.extras.ignore_warnings;
    let _cwd = settings
        .chdir
        .then(|| WorkingDir::enter(&output_dir))
        .transpose()?;
    let config_yaml = yaml::to_yaml(&resolved);
    let job_config_yaml = yaml::to_yaml(&job_cfg);
    // A trial of a search with a pruner reports each validation to the study.
    let judge = match slot.as_ref() {
        Some(s) => super::trial_judge::TrialJudge::for_job(s.dir, s.num)?,
        None => None,
    };
    // The run's own logbook section (`<run dir>/logbook.md` and its plots), for loggers that keep it.
    let run_report = |dir: &Path| -> anyhow::Result<Vec<PathBuf>> {
        let written = crate::logbook::write_logbook(&[dir.to_path_buf()], &dir.join("logbook.md"))?;
        Ok(std::iter::once(written.markdown)
            .chain(written.svgs)
            .collect())
    };
    let job = Job {
        exp: &experiment,
        plan: &plan,
        output_dir: &output_dir,
        config_yaml: &config_yaml,
        job_config: &job_config_yaml,
        // A sweep's job directory is its own (numbered): a checkpoint in it is from an earlier attempt.
        // ... or a worker the node launcher restarted after a failure (`trainer.max_restarts`).
        // ... or any rank of the group was (a node started afresh to rejoin a restarting run too).
        resume_own: sweep_dir.is_some()
            || std::env::var_os(super::node::RESTART_ENV).is_some()
            || group.as_ref().is_some_and(|g| g.restarting),
        judge: judge
            .as_ref()
            .map(|j| j as &dyn crate::trainer::ValidationJudge),
        sweep_name: sweep_dir
            .and_then(|d| d.file_name())
            .map(|n| n.to_string_lossy().into_owned()),
        report: Some(&run_report),
    };
    if group.as_ref().is_none_or(|g| g.rank == 0) {
        super::extras::apply(&experiment, &config_yaml, &output_dir)?;
    }
    // SIGTERM or SIGUSR1 stops the run at a resume checkpoint instead of killing it.
    let grace = std::time::Duration::from_secs(experiment.trainer.preemption_grace_s);
    if let Err(e) = crate::platform::signals::arm_preemption(grace) {
        tracing::warn!("could not catch SIGTERM/SIGUSR1 (a stop signal will kill the run): {e}");
    }
    if let Some(rank) = group.as_ref().map(|g| g.rank).filter(|&r| r > 0) {
        // Ranks other than 0 train and log to their own file; rank 0 writes the run's records.
        std::fs::create_dir_all(&output_dir).map_err(|e| {
            ConfigError::Io(format!("could not create {}: {e}", output_dir.display()))
        })?;
        let summary = with_rank_log(&output_dir, rank, &logging, || {
            crate::trainer::fit(&job, group)
        })?
        .map_err(|e| training_error(format!("rank {rank}: {e:#}")))?;
        return Ok(JobOutcome {
            output_dir,
            message: String::new(),
            main_metric: None,
            rank,
            preempted: matches!(summary.status, crate::trainer::RunStatus::Preempted(_)),
        });
    }
    let info = JobInfo {
        output_dir: output_dir.clone(),
        overrides: overrides.to_vec(),
        hydra: place.hydra,
    };
    records::write_job_records(&info, &job_cfg, &resolved).map_err(|e| {
        ConfigError::Io(format!(
            "could not write run records in {}: {e}",
            output_dir.display()
        ))
    })?;
    // extras.print_config printed it already.
    if sweep_dir.is_none() && !experiment.extras.print_config {
        print!("{config_yaml}");
    }
    train_and_record(&job, group, &logging)
}

/// The job's logging from its `hydra/job_logging` option: the style, the file its file handler names
/// (relative names are relative to the run directory), the root level (or DEBUG with `hydra.verbose`).
fn log_setup(
    settings: &HydraSettings,
    job_cfg: &Node,
    ctx: &ResolveContext,
    output_dir: &Path,
) -> Result<LogSetup, ConfigError> {
    let lookup = |key: &str| match resolve_hydra_key(job_cfg, key, ctx) {
        Ok(node) => Ok(Some(node)),
        Err(ConfigError::Interpolation(m)) if m.contains("not found") => Ok(None),
        Err(e) => Err(e),
    };
    let file = match lookup("job_logging.handlers.file.filename")? {
        Some(Node {
            value: Value::Str(name),
            ..
        }) => Some(output_dir.join(name)),
        _ => None,
    };
    let level = match lookup("job_logging.root.level")?.map(|n| n.value) {
        _ if settings.verbose => tracing::Level::DEBUG,
        Some(Value::Str(l)) => match l.to_ascii_uppercase().as_str() {
            "DEBUG" | "NOTSET" => tracing::Level::DEBUG,
            "WARNING" | "WARN" => tracing::Level::WARN,
            "ERROR" | "CRITICAL" | "FATAL" => tracing::Level::ERROR,
            _ => tracing::Level::INFO,
        },
        _ => tracing::Level::INFO,
    };
    Ok(LogSetup {
        style: settings.job_logging.clone(),
        file,
        level,
        hide_warnings: false,
    })
}

/// `hydra.job.env_set` for the length of one job (Hydra's `env_override`): the previous values come back
/// when the job ends, so a sweep's next job starts from the launching environment.
struct JobEnv(Vec<(String, Option<std::ffi::OsString>)>);

impl JobEnv {
    fn set(vars: &std::collections::BTreeMap<String, String>) -> JobEnv {
        let previous = vars
            .iter()
            .map(|(k, v)| {
                let old = std::env::var_os(k);
                // Set before any worker thread or process of this job exists.
                std::env::set_var(k, v);
                (k.clone(), old)
            })
            .collect();
        JobEnv(previous)
    }
}

impl Drop for JobEnv {
    fn drop(&mut self) {
        for (k, old) in &self.0 {
            match old {
                Some(v) => std::env::set_var(k, v),
                None => std::env::remove_var(k),
            }
        }
    }
}

/// `hydra.job.chdir=true`: the job runs in its output directory; the previous directory comes back when
/// the job ends (a sweep's next job starts where the sweep started).
struct WorkingDir(PathBuf);

impl WorkingDir {
    fn enter(dir: &Path) -> Result<WorkingDir, ConfigError> {
        let previous = std::env::current_dir()
            .map_err(|e| ConfigError::Io(format!("no current directory: {e}")))?;
        std::fs::create_dir_all(dir)
            .and_then(|_| std::env::set_current_dir(dir))
            .map_err(|e| {
                ConfigError::Io(format!(
                    "hydra.job.chdir: could not enter {}: {e}",
                    dir.display()
                ))
            })?;
        Ok(WorkingDir(previous))
    }
}

impl Drop for WorkingDir {
    fn drop(&mut self) {
        let _ = std::env::set_current_dir(&self.0);
    }
}

fn run_error(e: anyhow::Error) -> ConfigError {
    ConfigError::Run(format!("{e:#}"))
}

/// Training failed: a timed-out collective is said as such (its own exit code, which the node launcher
/// reads to name the rank that stalled).
fn training_error(message: String) -> ConfigError {
    match crate::comm::is_collective_timeout(&message) {
        true => ConfigError::CollectiveTimeout(format!(
            "{message}\n    (a collective waited trainer.collective_timeout_s for another rank, which took \
             no part: it stalled, or is stuck outside the collective; the node launcher names it)"
        )),
        false => ConfigError::Run(message),
    }
}

/// Joining the group failed: a node that did not come is said as such (its own exit code).
fn join_error(e: anyhow::Error) -> ConfigError {
    if let Some(missing) = e.downcast_ref::<crate::comm::NodeMissing>() {
        return ConfigError::NodeMissing(missing.0.clone());
    }
    run_error(e)
}

/// Train as the run's only process or its rank 0, recording in `run.json` that the job runs and how it
/// ended; the report for the console.
fn train_and_record(
    job: &Job,
    group: Option<Distributed>,
    logging: &LogSetup,
) -> Result<JobOutcome, ConfigError> {
    let output_dir = job.output_dir;
    let run_state = records::RunState::started(output_dir);
    let record_state = |state: &records::RunState| {
        state.write(output_dir).map_err(|e| {
            ConfigError::Io(format!(
                "could not write {}: {e}",
                output_dir.join("run.json").display()
            ))
        })
    };
    record_state(&run_state)?;
    let distributed = group.is_some();
    let summary = match group {
        Some(g) => with_rank_log(output_dir, 0, logging, || crate::trainer::fit(job, Some(g)))?,
        None => with_run_log(logging, || crate::trainer::fit(job, None))?,
    };
    let preempted =
        matches!(&summary, Ok(s) if matches!(s.status, crate::trainer::RunStatus::Preempted(_)));
    let ended = match (&summary, preempted) {
        (Ok(s), true) => run_state.preempted(s.stopped_because()),
        (Ok(s), false) => run_state.ended(Ok(s.stopped_because())),
        (Err(e), _) => run_state.ended(Err(format!("{e:#}"))),
    };
    record_state(&ended)?;
    if preempted {
        // SLURM's warning signal in a batch job: rank 0 asks SLURM to requeue the job (every rank stopped
        // at the same step). Any other stop waits for the same command with ckpt_path=auto.
        let message = match crate::platform::signals::received_signal() {
            Some("SIGUSR1") if super::requeue::in_slurm_batch_job() => {
                super::requeue::requeue_this_job().map_err(ConfigError::Run)?
            }
            signal => preempted_message(signal.unwrap_or("a stop signal"), output_dir),
        };
        return Ok(JobOutcome {
            message,
            main_metric: None,
            output_dir: output_dir.to_path_buf(),
            rank: 0,
            preempted: true,
        });
    }
    let summary = summary.map_err(|e| {
        training_error(format!(
            "{e:#}\n    (run directory: {})",
            records::display(output_dir)
        ))
    })?;
    // Under our node launcher, the launcher reports the run (once); rank 0 stays quiet.
    let launched_here = distributed && std::env::var_os(crate::comm::NOW_ENV).is_some();
    Ok(JobOutcome {
        message: match launched_here {
            true => String::new(),
            false => report(&summary, output_dir, None),
        },
        main_metric: summary.main_metric(),
        output_dir: output_dir.to_path_buf(),
        rank: 0,
        preempted: false,
    })
}

/// A launch time from the launcher or rank 0, in its own offset (not converted to this node's zone).
pub fn parse_now(text: &str) -> Option<chrono::DateTime<chrono::FixedOffset>> {
    chrono::DateTime::parse_from_rfc3339(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker on a node in another time zone resolves `${now:...}` at rank 0's wall-clock time, as rank
    /// 0 wrote it (so both nodes name the same run directory), not converted to its own zone.
    #[test]
    fn a_launch_time_keeps_the_offset_it_was_taken_in() {
        let mut ctx = ResolveContext::from_process();
        for sent in ["2026-11-23T10:05:00+09:00", "2026-11-23T10:05:00-05:00"] {
            ctx.now = parse_now(sent).unwrap();
            let root = crate::config::yaml::parse("dir: ${now:%Y-%m-%d_%H-%M}", "t.yaml")
                .unwrap()
                .unwrap();
            let out = crate::config::interpolate::resolve_all(&root, &ctx).unwrap();
            assert_eq!(
                out.get("dir").unwrap().to_json(),
                "2026-11-23_10-05",
                "{sent}"
            );
        }
        assert!(parse_now("yesterday").is_none());
    }
}
