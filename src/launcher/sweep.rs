//! Hydra's BasicSweeper: expand the sweep into jobs (leftmost override slowest), write `multirun.yaml` and
//! the plan (`sweep.json`, or resume the one already in the sweep's directory), hand the jobs to the
//! launcher (basic: one after another in this process; joblib/submitit_local: processes on this machine;
//! submitit_slurm: a SLURM array), and end with a table and the sweep's logbook section.

use super::job::{run_job, SweepSlot};
use super::local::{joblib_n_jobs, JobCommand, LocalLauncher, SweepJob};
use super::place::place_job;
use super::sweep_job::JobResult;
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
use std::path::{Path, PathBuf};
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

/// What every sweeper hands its jobs to: the chosen launcher, with how to start and compose a job.
pub struct JobLauncher<'a> {
    pub setup: &'a Setup,
    ctx: &'a ResolveContext,
    command: JobCommand,
    launcher_name: String,
    launcher: Node,
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

/// How far the sweep got: its record (saved as each job starts and ends), failures, and whether it
/// stopped early.
pub struct Tally {
    sweep_dir: PathBuf,
    pub record: records::SweepRecord,
    fail_fast: bool,
    failed: usize,
    stopped_because: Option<String>,
}

impl Tally {
    pub fn new(sweep_dir: &Path, record: records::SweepRecord, fail_fast: bool) -> Tally {
        Tally {
            sweep_dir: sweep_dir.to_path_buf(),
            record,
            fail_fast,
            failed: 0,
            stopped_because: None,
        }
    }

    pub fn save(&self) -> Result<(), ConfigError> {
        self.record.write(&self.sweep_dir).map_err(|e| {
            ConfigError::Io(format!(
                "could not write {}: {e}",
                self.sweep_dir.join(records::SweepRecord::FILE).display()
            ))
        })
    }

    /// Job `job` is about to run (or was submitted as `launch_id`).
    pub fn start(&mut self, job: &SweepJob) {
        self.record
            .set_job(job.num, records::JobState::Running, None);
    }

    /// Remember the launcher's id for job `num` (a resumed sweep looks for it).
    pub fn launched(&mut self, num: usize, launch_id: &str) {
        if let Some(j) = self.record.jobs.iter_mut().find(|j| j.num == num) {
            j.launch_id = Some(launch_id.to_string());
        }
    }

    /// A job ended; false when the sweep must stop (`--fail-fast`).
    pub fn done(&mut self, result: JobResult) -> Result<bool, ConfigError> {
        let num = result.num;
        self.record.set_job(num, result.state, result.error.clone());
        if let Some(j) = self.record.jobs.iter_mut().find(|j| j.num == num) {
            j.output_dir = result.output_dir.clone();
            j.main_metric = result.main_metric;
        }
        self.save()?;
        if result.state == records::JobState::Completed {
            return Ok(true);
        }
        if result.state == records::JobState::Preempted {
            let why = format!(
                "job #{num} was stopped by {} at a resume checkpoint; rerun with hydra.sweep.dir={} to \
                 continue the sweep",
                crate::platform::signals::received_signal().unwrap_or("a stop signal"),
                records::display(&self.sweep_dir)
            );
            eprintln!("{why}");
            self.stopped_because = Some(why);
            return Ok(false);
        }
        self.failed += 1;
        eprintln!(
            "Error in job #{num}: {}",
            result.error.as_deref().unwrap_or("failed")
        );
        if self.fail_fast {
            eprintln!("--fail-fast: stopping after the first failed job");
            self.stopped_because = Some(format!("--fail-fast: job #{num} failed"));
            return Ok(false);
        }
        Ok(true)
    }

    /// Did `--fail-fast` stop the sweep?
    pub fn stopped(&self) -> bool {
        self.stopped_because.is_some()
    }

    /// Stop the sweep for `why` (recorded in `sweep.json`).
    pub fn stop(&mut self, why: String) {
        self.stopped_because = Some(why);
    }

    /// End the sweep: its record, the table of every job (earlier attempts' included), the logbook.
    pub fn finish(mut self, total: usize) -> Result<ExitCode, ConfigError> {
        self.record.end(self.stopped_because.take());
        self.save()?;
        println!("| job | overrides | status | main metric |");
        println!("|---|---|---|---|");
        let mut failed = 0;
        for j in &self.record.jobs {
            let status = match j.state {
                records::JobState::Completed => "ok",
                records::JobState::Pruned => "pruned",
                records::JobState::Failed => "FAILED",
                records::JobState::Preempted => "preempted",
                records::JobState::Planned => "not run",
                _ => "unfinished",
            };
            if !j.state.is_done() {
                failed += 1;
            }
            let metric = j
                .main_metric
                .map(|m| format!("val/acc1 {m:.4}"))
                .unwrap_or_else(|| "-".into());
            println!(
                "| {} | {} | {status} | {metric} |",
                j.num,
                j.overrides.join(" ")
            );
        }
        println!("{failed} of {total} jobs failed");
        match crate::logbook::write_sweep_section(&self.sweep_dir) {
            Ok(w) => println!("Logbook section: {}", records::display(&w.markdown)),
            Err(e) => eprintln!("warning: could not write the sweep's logbook section: {e:#}"),
        }
        let preempted = self
            .record
            .jobs
            .iter()
            .any(|j| j.state == records::JobState::Preempted);
        Ok(if preempted {
            ExitCode::from(crate::platform::signals::EXIT_PREEMPTED)
        } else if failed > 0 {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        })
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
