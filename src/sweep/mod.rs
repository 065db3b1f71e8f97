//! Sweepers, Hydra's first plugin interface: a sweeper decides a sweep's jobs, in batches, from what
//! finished, and hands each batch to the launcher (`crate::launch`). `basic` is Hydra's BasicSweeper (the
//! grid, leftmost override slowest), `optuna` the search (hydra-optuna-sweeper). `tally` is the sweep's
//! record (`sweep.json`, saved as each job starts and ends), `resume` continues an earlier sweep in the
//! same directory. A new sweeper is its file, a `Sweeper` impl and one line in `SWEEPERS`, which config
//! validation, dispatch and `--help` read.

pub mod basic;
pub mod optuna;
pub mod resume;
pub mod tally;

use crate::config::compose::{Composed, RunMode};
use crate::config::errors::{did_you_mean, ConfigError};
use crate::config::grammar::Override;
use crate::config::hydra::runtime::is_hydra_override;
use crate::config::hydra::{compose_with_hydra, split_hydra, HydraSettings};
use crate::config::interpolate::{resolve_path, ResolveContext};
use crate::config::sweep;
use crate::config::tree::Node;
use crate::config::yaml;
use crate::job::place::{master_key, place_job, sweep_dir};
use crate::launch::{JobCommand, LaunchContext, Launcher};
use crate::project::Setup;
use crate::storage::records;
use std::path::PathBuf;
use std::process::ExitCode;

/// What a sweeper is built from: the sweep's master config (composed as a multirun) split into the job
/// config and the `hydra` node, and the command line's overrides.
pub struct SweepInput<'a> {
    pub setup: &'a Setup,
    pub overrides: &'a [Override],
    pub job_cfg: &'a Node,
    pub hydra: &'a Node,
    pub ctx: &'a ResolveContext,
}

impl SweepInput<'_> {
    /// The command line's overrides of the job config (not `hydra.*`).
    pub fn job_args(&self) -> Vec<Override> {
        self.overrides
            .iter()
            .filter(|o| !is_hydra_override(o))
            .cloned()
            .collect()
    }
}

/// A sweep being run: the launcher and what it runs jobs with, and the sweep's own settings.
pub struct SweepRun<'a> {
    pub launcher: &'a dyn Launcher,
    pub cx: &'a LaunchContext<'a>,
    pub task_name: &'a str,
    /// Stop at the first failed job.
    pub fail_fast: bool,
}

impl SweepRun<'_> {
    pub fn sweep_dir(&self) -> &std::path::Path {
        self.cx.sweep_dir()
    }
}

/// Decides a sweep's jobs and runs them through the launcher, recording each in the sweep's record.
pub trait Sweeper {
    /// Every job's overrides when they are known before any job runs (a grid); `None` for a search,
    /// which chooses them from earlier results.
    fn planned_jobs(&self) -> Option<&[Vec<String>]>;
    fn sweep(&self, run: &SweepRun) -> Result<ExitCode, ConfigError>;
}

/// One sweeper: its `hydra/sweeper` option name and how it is built (its settings are checked there,
/// before anything is written).
pub struct SweeperEntry {
    pub name: &'static str,
    pub about: &'static str,
    pub build: fn(&SweepInput) -> Result<Box<dyn Sweeper>, ConfigError>,
}

/// Every sweeper this program runs.
pub const SWEEPERS: &[SweeperEntry] = &[
    SweeperEntry {
        name: "basic",
        about: "the grid of `a=1,2 b=x,y` and hydra.sweeper.params",
        build: |input| Ok(Box::new(basic::BasicSweeper::build(input)?)),
    },
    SweeperEntry {
        name: "optuna",
        about: "a search: TPE, random, grid, CMA-ES or NSGA-II trials with pruning",
        build: |input| Ok(Box::new(optuna::OptunaSweeper::build(input)?)),
    },
];

/// The names `hydra/sweeper=` may take here.
pub fn names() -> Vec<&'static str> {
    SWEEPERS.iter().map(|s| s.name).collect()
}

/// The sweeper `hydra/sweeper=NAME` picks, or an error listing what runs here.
pub fn sweeper_named(name: &str) -> Result<&'static SweeperEntry, ConfigError> {
    if let Some(entry) = SWEEPERS.iter().find(|s| s.name == name) {
        return Ok(entry);
    }
    let hint = did_you_mean(name, names())
        .map(|s| format!(" Did you mean '{s}'?"))
        .unwrap_or_default();
    Err(ConfigError::composition(format!(
        "hydra/sweeper={name}: the {name} sweeper is not supported.{hint} trainyard runs: {}. Pick one \
         with `override hydra/sweeper: NAME` or hydra/sweeper=NAME.",
        SWEEPERS
            .iter()
            .map(|s| format!("{} ({})", s.name, s.about))
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

/// The sweep as the command line asks for it: the master config, its Hydra settings, and the sweeper
/// built from them.
struct SweepStart {
    master: Composed,
    settings: HydraSettings,
    sweeper: Box<dyn Sweeper>,
}

impl SweepStart {
    fn compose(
        setup: &Setup,
        overrides: &[Override],
        ctx: &ResolveContext,
    ) -> Result<SweepStart, ConfigError> {
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
        let (job_cfg, hydra) = split_hydra(master.config.clone());
        let settings = HydraSettings::read(&hydra)?;
        let entry = sweeper_named(&settings.sweeper)?;
        crate::launch::launcher_named(&settings.launcher)?;
        let sweeper = (entry.build)(&SweepInput {
            setup,
            overrides,
            job_cfg: &job_cfg,
            hydra: &hydra,
            ctx,
        })?;
        Ok(SweepStart {
            master,
            settings,
            sweeper,
        })
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
    let start = SweepStart::compose(setup, overrides, ctx)?;
    let Some(jobs) = start.sweeper.planned_jobs() else {
        return Err(ConfigError::composition(format!(
            "--cfg with hydra/sweeper={}: a search chooses its trials' values as it runs, so there are \
             no jobs to print yet; print one job's config without -m",
            start.settings.sweeper
        )));
    };
    let hydra_overrides = hydra_overrides(overrides);
    let mut out = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        let texts: Vec<String> = hydra_overrides.iter().chain(job).cloned().collect();
        let parsed = crate::config::hydra::parse_overrides(&texts)?;
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

/// The sweep's Hydra overrides, composed first into every job (Hydra's `load_sweep_config`).
fn hydra_overrides(overrides: &[Override]) -> Vec<String> {
    overrides
        .iter()
        .filter(|o| is_hydra_override(o))
        .map(|o| o.input.clone())
        .collect()
}

/// Run a sweep: build its sweeper and launcher from the master config, make the sweep's directory and
/// `multirun.yaml`, and let the sweeper run its jobs through the launcher (`fail_fast`: stop at the first
/// failed job).
pub fn run_sweep(
    fail_fast: bool,
    setup: &Setup,
    overrides: &[Override],
    ctx: &ResolveContext,
) -> Result<ExitCode, ConfigError> {
    let start = SweepStart::compose(setup, overrides, ctx)?;
    let (job_cfg, hydra) = split_hydra(start.master.config.clone());
    let task_name = match job_cfg.get("task_name") {
        Some(_) => resolve_path(&job_cfg, "task_name", ctx)?
            .value
            .display_python(),
        None => setup.config_name.clone(),
    };
    let named = overrides
        .iter()
        .any(|o| o.key.key_or_group == "hydra.sweep.dir");
    let sweep_dir = resume::fresh_unless_named(sweep_dir(setup, &job_cfg, &hydra, ctx)?, named);
    let launcher_settings = master_key(&job_cfg, &hydra, "launcher", ctx)?;
    let launcher = (crate::launch::launcher_named(&start.settings.launcher)?.build)(
        &launcher_settings,
        &sweep_dir,
    )?;
    std::fs::create_dir_all(&sweep_dir)
        .map_err(|e| ConfigError::Io(format!("could not create {}: {e}", sweep_dir.display())))?;
    records::write_atomic(
        &sweep_dir.join("multirun.yaml"),
        yaml::to_yaml(&job_cfg).as_bytes(),
    )
    .map_err(|e| ConfigError::Io(e.to_string()))?;
    let cx = LaunchContext {
        setup,
        ctx,
        command: job_command(setup, overrides, sweep_dir, ctx)?,
    };
    start.sweeper.sweep(&SweepRun {
        launcher: launcher.as_ref(),
        cx: &cx,
        task_name: &task_name,
        fail_fast,
    })
}

/// How a job of this sweep starts as a process of its own.
fn job_command(
    setup: &Setup,
    overrides: &[Override],
    sweep_dir: PathBuf,
    ctx: &ResolveContext,
) -> Result<JobCommand, ConfigError> {
    Ok(JobCommand {
        exe: std::env::current_exe()
            .map_err(|e| ConfigError::Io(format!("cannot find this program to start jobs: {e}")))?,
        config_flags: setup.source.flags(),
        hydra_overrides: hydra_overrides(overrides),
        sweep_dir,
        now: ctx.now.to_rfc3339(),
        cwd: std::env::current_dir()
            .map_err(|e| ConfigError::Io(format!("no current directory: {e}")))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::hydra::builtin::BUILTIN;

    /// The sweepers that run here and the `hydra/sweeper` options the config engine ships are one list.
    #[test]
    fn registered_sweepers_are_the_shipped_options() {
        let mut shipped: Vec<&str> = BUILTIN
            .iter()
            .filter_map(|c| c.config_path.strip_prefix("hydra/sweeper/"))
            .filter(|option| !option.contains('/'))
            .collect();
        let mut registered = names();
        registered.sort_unstable();
        shipped.sort_unstable();
        assert_eq!(registered, shipped);
    }

    #[test]
    fn an_unknown_sweeper_is_refused_with_the_list() {
        let err = sweeper_named("optuan").err().unwrap().to_string();
        assert!(err.contains("Did you mean 'optuna'"), "{err}");
        assert!(err.contains("basic ("), "{err}");
    }
}
