//! Hydra's BasicSweeper: expand the sweep into jobs (leftmost override slowest), write `multirun.yaml` and
//! the plan (`sweep.json`, or resume the one already in the sweep's directory), hand the jobs to the
//! launcher (basic: one after another in this process; joblib/submitit_local: processes on this machine;
//! submitit_slurm: a SLURM array), and end with a table and the sweep's logbook section.

use super::launch::JobLauncher;
use super::local::{JobCommand, SweepJob};
use super::place::place_job;
use super::tally::Tally;
use crate::config::compose::RunMode;
use crate::config::errors::ConfigError;
use crate::config::grammar::Override;
use crate::config::hydra::runtime::is_hydra_override;
use crate::config::hydra::{compose_with_hydra, parse_overrides, split_hydra, HydraSettings};
use crate::config::interpolate::{resolve_path, ResolveContext};
use crate::config::sweep;
use crate::config::tree::{Node, Value};
use crate::config::yaml;
use crate::project::Setup;
use crate::storage::records;

use std::process::ExitCode;

/// What every sweep starts from: the master config (composed as a multirun), the jobs the basic sweeper
/// expands (none for a search, which chooses them as it runs), and how each job is composed.
struct SweepStart {
    master: crate::config::compose::Composed,
    /// The command line's overrides of the job config (a search's settings read them).
    job_args: Vec<Override>,
    optuna: bool,
    jobs: Vec<Vec<String>>,
    /// The sweep's Hydra overrides, composed first into every job (Hydra's `load_sweep_config`).
    hydra_overrides: Vec<String>,
}

impl SweepStart {
    fn compose(setup: &Setup, overrides: &[Override]) -> Result<SweepStart, ConfigError> {
        let master = compose_with_hydra(
            &setup.repo,
            &setup.config_name,
            overrides,
            RunMode::Multirun,
        )?;
        sweep::refuse_sweeps_over_hydra(overrides)?;
        for warning in master.defaults.dropped_warnings(&setup.repo) {
            eprintln!("{warning}");
        }
        let params: Vec<String> = match master.config.get("hydra.sweeper.params").map(|n| &n.value)
        {
            Some(Value::Map(m)) => m
                .iter()
                .map(|(k, v)| format!("{k}={}", sweep::param_override_text(v)))
                .collect(),
            _ => Vec::new(),
        };
        let job_args: Vec<Override> = overrides
            .iter()
            .filter(|o| !is_hydra_override(o))
            .cloned()
            .collect();
        let optuna = master
            .config
            .get("hydra.runtime.choices")
            .and_then(|c| c.as_map())
            .and_then(|m| m.get("hydra/sweeper"))
            .and_then(Node::as_str)
            == Some("optuna");
        // A search chooses its jobs as it runs; the basic sweeper expands them all now.
        let jobs = match optuna {
            true => Vec::new(),
            false => sweep::expand(&setup.repo, &params, overrides)?,
        };
        let hydra_overrides: Vec<String> = overrides
            .iter()
            .filter(|o| is_hydra_override(o))
            .map(|o| o.input.clone())
            .collect();
        Ok(SweepStart {
            master,
            job_args,
            optuna,
            jobs,
            hydra_overrides,
        })
    }

    /// A job's overrides, the sweep's Hydra overrides first.
    fn job_overrides(&self, job: &[String]) -> Result<Vec<Override>, ConfigError> {
        let texts: Vec<String> = self.hydra_overrides.iter().chain(job).cloned().collect();
        parse_overrides(&texts)
    }
}

/// `--cfg ... -m`: every job's config as it would run, and (`resolve`) the context it resolves in — its
/// number and its directory in the sweep. The caller prints them.
pub fn cfg_jobs(
    setup: &Setup,
    overrides: &[Override],
    ctx: &ResolveContext,
    resolve: bool,
) -> Result<Vec<(Node, ResolveContext)>, ConfigError> {
    let start = SweepStart::compose(setup, overrides)?;
    if start.optuna {
        return Err(ConfigError::composition(
            "--cfg with hydra/sweeper=optuna: a search chooses its trials' values as it runs, so there \
             are no jobs to print yet; print one job's config without -m",
        ));
    }
    let mut out = Vec::new();
    for (i, job) in start.jobs.iter().enumerate() {
        let parsed = start.job_overrides(job)?;
        let composed = compose_with_hydra(&setup.repo, &setup.config_name, &parsed, RunMode::Run)?;
        let job_ctx = match resolve {
            true => {
                let (job_cfg, hydra) = split_hydra(composed.config.clone());
                let sweep_dir = setup.project_root.join("logs").join("<sweep>");
                place_job(setup, &job_cfg, hydra, i, Some(&sweep_dir), ctx)?.ctx
            }
            false => ctx.clone(),
        };
        out.push((composed.config, job_ctx));
    }
    Ok(out)
}

/// Run a sweep: the basic sweeper's jobs, or a search's trials, through the configured launcher
/// (`fail_fast`: stop at the first failed job).
pub fn run_sweep(
    fail_fast: bool,
    setup: &Setup,
    overrides: &[Override],
    ctx: &ResolveContext,
) -> Result<ExitCode, ConfigError> {
    let SweepStart {
        master,
        job_args,
        jobs,
        hydra_overrides,
        ..
    } = SweepStart::compose(setup, overrides)?;
    let (job_cfg, hydra) = split_hydra(master.config.clone());
    let settings = HydraSettings::read(&hydra)?;
    check_sweeper(&settings)?;
    let task_name = match job_cfg.get("task_name") {
        Some(_) => resolve_path(&job_cfg, "task_name", ctx)?
            .value
            .display_python(),
        None => setup.config_name.clone(),
    };
    // A search's settings and metric are checked before anything is written.
    let search = match settings.sweeper == "optuna" {
        true => {
            let sweeper = super::place::master_key(&job_cfg, &hydra, "sweeper", ctx)?;
            let metric = super::search_sweep::optimized_metric(&job_cfg, ctx)?;
            let search = crate::config::hydra::optuna::OptunaSettings::read(&sweeper, &job_args)?;
            Some((search, metric))
        }
        false => None,
    };
    let named = overrides
        .iter()
        .any(|o| o.key.key_or_group == "hydra.sweep.dir");
    let sweep_dir = super::resume::fresh_unless_named(
        super::place::sweep_dir(setup, &job_cfg, &hydra, ctx)?,
        named,
    );
    std::fs::create_dir_all(&sweep_dir)
        .map_err(|e| ConfigError::Io(format!("could not create {}: {e}", sweep_dir.display())))?;
    let launcher = super::place::master_key(&job_cfg, &hydra, "launcher", ctx)?;
    records::write_atomic(
        &sweep_dir.join("multirun.yaml"),
        yaml::to_yaml(&job_cfg).as_bytes(),
    )
    .map_err(|e| ConfigError::Io(e.to_string()))?;
    let launch = JobLauncher {
        setup,
        ctx,
        command: JobCommand {
            exe: std::env::current_exe().map_err(|e| {
                ConfigError::Io(format!("cannot find this program to start jobs: {e}"))
            })?,
            config_flags: setup.source.flags(),
            hydra_overrides: hydra_overrides.clone(),
            sweep_dir: sweep_dir.clone(),
            now: ctx.now.to_rfc3339(),
            cwd: std::env::current_dir()
                .map_err(|e| ConfigError::Io(format!("no current directory: {e}")))?,
        },
        launcher_name: settings.launcher.clone(),
        launcher,
        sweep_dir: sweep_dir.clone(),
    };
    if let Some((search, metric)) = search {
        let record = super::resume::reopen(&sweep_dir, &task_name)?;
        let tally = Tally::new(&sweep_dir, record, fail_fast);
        tally.save()?;
        return super::search_sweep::run(&launch, &search, &metric, &task_name, tally);
    }
    // The plan, before any job runs: the logbook lists every job from it, started or not. An earlier
    // record of the same sweep in this directory is resumed.
    let (record, resumed) = super::resume::plan_or_resume(&sweep_dir, &task_name, &jobs)?;
    let mut tally = Tally::new(&sweep_dir, record, fail_fast);
    tally.save()?;
    let todo: Vec<SweepJob> = tally
        .record
        .jobs
        .iter()
        .filter(|j| !j.state.is_done())
        .map(|j| SweepJob {
            num: j.num,
            overrides: j.overrides.clone(),
            previous_launch_id: j.launch_id.clone(),
        })
        .collect();
    if resumed {
        eprintln!(
            "Resuming the sweep in {}: {} of {} jobs completed earlier; running {}",
            records::display(&sweep_dir),
            jobs.len() - todo.len(),
            jobs.len(),
            todo.iter()
                .map(|j| format!("#{}", j.num))
                .collect::<Vec<_>>()
                .join(", ")
        );
    } else {
        eprintln!(
            "Launching {} jobs into {}",
            jobs.len(),
            records::display(&sweep_dir)
        );
    }
    launch.run(&todo, &mut tally)?;
    tally.finish(jobs.len())
}

/// Hydra's basic sweeper and the optuna sweeper run here; another choice is refused before any job runs.
fn check_sweeper(settings: &HydraSettings) -> Result<(), ConfigError> {
    if settings.sweeper != "basic" && settings.sweeper != "optuna" {
        return Err(ConfigError::composition(format!(
            "hydra/sweeper={}: trainyard runs Hydra's basic sweeper (grid sweeps over `a=1,2 b=x,y` and \
             hydra.sweeper.params) and the optuna sweeper (hydra/sweeper=optuna); the {} sweeper is not \
             supported. Use `override hydra/sweeper: basic` or `optuna`.",
            settings.sweeper, settings.sweeper
        )));
    }
    if !matches!(
        settings.launcher.as_str(),
        "basic" | "joblib" | "submitit_local" | "submitit_slurm"
    ) {
        return Err(ConfigError::composition(format!(
            "hydra/launcher={}: trainyard runs a sweep's jobs with Hydra's basic launcher (one after \
             another), joblib (several at once on this machine), submitit_local or submitit_slurm; it \
             cannot run the {} launcher.",
            settings.launcher, settings.launcher
        )));
    }
    Ok(())
}
