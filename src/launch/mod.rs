//! Launchers, Hydra's second plugin interface: a launcher runs a batch of jobs a sweeper chose and
//! reports each one's start and end, and knows nothing of how they were chosen. `basic` runs them one
//! after another in this process (Hydra's BasicLauncher), `local` in processes of their own on this
//! machine (hydra-joblib-launcher, submitit's local launcher), `slurm_array` as SLURM array jobs
//! (submitit_slurm; `slurm` writes, submits and watches the scripts). A new launcher is its file, a
//! `Launcher` impl and one line in `LAUNCHERS`, which config validation, dispatch and `--help` read.

pub mod basic;
pub mod local;
pub mod slurm;
pub mod slurm_array;

use crate::config::errors::{did_you_mean, ConfigError};
use crate::config::grammar::Override;
use crate::config::hydra::parse_overrides;
use crate::config::interpolate::ResolveContext;
use crate::config::tree::Node;
use crate::job::in_sweep::JobResult;
use crate::project::Setup;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// One job of a sweep as a launcher sees it: its number and its own overrides.
#[derive(Debug, Clone)]
pub struct SweepJob {
    pub num: usize,
    pub overrides: Vec<String>,
    /// The launcher's id for an earlier attempt (a resumed sweep), which may still be queued or running.
    pub previous_launch_id: Option<String>,
}

/// How to start one job as a process: this program, the config flags the sweep was started with, the
/// sweep's Hydra overrides, then the job's.
#[derive(Debug, Clone)]
pub struct JobCommand {
    pub exe: PathBuf,
    pub config_flags: Vec<OsString>,
    pub hydra_overrides: Vec<String>,
    pub sweep_dir: PathBuf,
    /// The sweep's launch time: every job resolves `${now:...}` with it, as in-process jobs do.
    pub now: String,
    pub cwd: PathBuf,
}

impl JobCommand {
    pub fn args(&self, job: &SweepJob) -> Vec<OsString> {
        let mut args = self.config_flags.clone();
        args.extend([
            "--sweep-job".into(),
            job.num.to_string().into(),
            "--sweep-dir".into(),
            self.sweep_dir.clone().into_os_string(),
            "--".into(),
        ]);
        args.extend(self.hydra_overrides.iter().map(OsString::from));
        args.extend(job.overrides.iter().map(OsString::from));
        args
    }
}

/// What every launcher runs a batch with: the project, the sweep's resolve context (its launch time),
/// and how a job is started as a process (which also names the sweep's directory and Hydra overrides).
pub struct LaunchContext<'a> {
    pub setup: &'a Setup,
    pub ctx: &'a ResolveContext,
    pub command: JobCommand,
}

impl LaunchContext<'_> {
    pub fn sweep_dir(&self) -> &Path {
        &self.command.sweep_dir
    }

    /// A job's overrides parsed: the sweep's Hydra overrides first, then its own.
    pub fn job_overrides(&self, job: &[String]) -> Result<Vec<Override>, ConfigError> {
        let texts: Vec<String> = self
            .command
            .hydra_overrides
            .iter()
            .chain(job)
            .cloned()
            .collect();
        parse_overrides(&texts)
    }
}

/// Where a launcher reports: each job's start, the id a cluster gave it, and its end. The sweeper's
/// record of the sweep implements it.
pub trait Progress {
    /// Job `job` is about to run (or be submitted).
    fn started(&mut self, job: &SweepJob);
    /// The launcher's id for job `num` (a resumed sweep looks for it).
    fn submitted(&mut self, num: usize, launch_id: &str);
    /// A job ended; false when the sweep must stop (`--fail-fast`), and the launcher stops the rest.
    fn ended(&mut self, result: JobResult) -> Result<bool, ConfigError>;
    /// Write the record now (before a long wait), so a killed sweep can be resumed from it.
    fn save(&self) -> Result<(), ConfigError>;
}

/// Runs a batch of jobs and reports each through `Progress`.
pub trait Launcher {
    fn launch(
        &self,
        cx: &LaunchContext,
        batch: &[SweepJob],
        progress: &mut dyn Progress,
    ) -> Result<(), ConfigError>;
}

/// One launcher: its `hydra/launcher` option name and how it is built from the resolved
/// `hydra.launcher` node (its settings are checked there, before any job runs).
pub struct LauncherEntry {
    pub name: &'static str,
    pub about: &'static str,
    pub build: BuildLauncher,
}

/// A launcher from its resolved `hydra.launcher` settings and the sweep's directory.
pub type BuildLauncher =
    fn(settings: &Node, sweep_dir: &Path) -> Result<Box<dyn Launcher>, ConfigError>;

/// Every launcher this program runs.
pub const LAUNCHERS: &[LauncherEntry] = &[
    LauncherEntry {
        name: "basic",
        about: "one job after another in this process",
        build: |_, _| Ok(Box::new(basic::BasicLauncher)),
    },
    LauncherEntry {
        name: "joblib",
        about: "n_jobs processes at once on this machine",
        build: |settings, sweep_dir| {
            Ok(Box::new(local::LocalLauncher::joblib(settings, sweep_dir)?))
        },
    },
    LauncherEntry {
        name: "submitit_local",
        about: "every job at once in processes on this machine",
        build: |settings, sweep_dir| {
            Ok(Box::new(local::LocalLauncher::submitit(
                settings, sweep_dir,
            )))
        },
    },
    LauncherEntry {
        name: "submitit_slurm",
        about: "SLURM array jobs, one per allocation shape",
        build: |settings, _| Ok(Box::new(slurm_array::SlurmArrayLauncher::read(settings)?)),
    },
];

/// The names `hydra/launcher=` may take here.
pub fn names() -> Vec<&'static str> {
    LAUNCHERS.iter().map(|l| l.name).collect()
}

/// The launcher `hydra/launcher=NAME` picks, or an error listing what runs here.
pub fn launcher_named(name: &str) -> Result<&'static LauncherEntry, ConfigError> {
    if let Some(entry) = LAUNCHERS.iter().find(|l| l.name == name) {
        return Ok(entry);
    }
    let hint = did_you_mean(name, names())
        .map(|s| format!(" Did you mean '{s}'?"))
        .unwrap_or_default();
    Err(ConfigError::composition(format!(
        "hydra/launcher={name}: trainyard cannot run the {name} launcher.{hint} It runs a sweep's jobs with: \
         {}. Pick one with `override hydra/launcher: NAME` or hydra/launcher=NAME.",
        LAUNCHERS
            .iter()
            .map(|l| format!("{} ({})", l.name, l.about))
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::hydra::builtin::BUILTIN;

    /// The launchers that run here and the `hydra/launcher` options the config engine ships are one list:
    /// each registered name composes, and each shipped option runs.
    #[test]
    fn registered_launchers_are_the_shipped_options() {
        let shipped: Vec<&str> = BUILTIN
            .iter()
            .filter_map(|c| c.config_path.strip_prefix("hydra/launcher/"))
            .collect();
        let mut registered = names();
        let mut shipped_sorted = shipped.clone();
        registered.sort_unstable();
        shipped_sorted.sort_unstable();
        assert_eq!(registered, shipped_sorted);
    }

    #[test]
    fn an_unknown_launcher_is_refused_with_the_list() {
        let err = launcher_named("joblb").err().unwrap().to_string();
        assert!(err.contains("Did you mean 'joblib'"), "{err}");
        assert!(err.contains("submitit_slurm ("), "{err}");
    }
}
