//! Reading run directories back: what ran (`.hydra/resolved.yaml`, `.hydra/overrides.yaml`), how it ended
//! (`summary.json`, `run.json`), and its curves (`metrics.csv`). Runs that crashed or are still running are
//! read too and marked as such; a directory that cannot be read is an error naming it, not a silent gap.
//! A sweep's plan (`sweep.json`) adds the jobs that have no run directory: failed before it was made, or
//! never started because the sweep stopped or was killed.

use crate::storage::records::{JobState, PlannedJob, RunState, SweepRecord, SweepState};
use crate::trainer::{RunStatus, Summary};
use anyhow::Context;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// How a run ended, or that it has not.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// `summary.json` written: how the run ended.
    Finished(RunStatus),
    /// The job reported an error.
    Failed(String),
    /// `run.json` says running and its process is alive on this machine.
    Running,
    /// `run.json` says running but the process is gone (killed, out of memory, machine rebooted).
    Crashed(String),
    /// Neither record says how it ended (older run, or running on another machine).
    Unknown(String),
    /// A sweep job that never ran (the sweep stopped, was killed, or has not reached it yet).
    NotStarted(String),
}

impl Status {
    pub fn is_finished(&self) -> bool {
        matches!(self, Status::Finished(_))
    }

    pub fn label(&self) -> String {
        match self {
            Status::Finished(s) => s.to_string(),
            Status::Failed(e) => format!("FAILED: {}", e.lines().next().unwrap_or("")),
            Status::Running => "running".into(),
            Status::Crashed(why) => format!("CRASHED ({why})"),
            Status::Unknown(why) => format!("unknown ({why})"),
            Status::NotStarted(why) => format!("not started ({why})"),
        }
    }
}

/// One point of a run's curves, at a (fractional) epoch.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CurvePoint {
    pub epoch: f64,
    pub train_loss: Option<f64>,
    pub val_loss: Option<f64>,
    pub val_acc1: Option<f64>,
    pub val_acc5: Option<f64>,
}

/// Everything the logbook needs about one job's directory.
#[derive(Debug, Clone)]
pub struct Run {
    pub dir: PathBuf,
    /// The multirun directory and job number when the run belongs to a sweep.
    pub sweep: Option<(PathBuf, usize)>,
    /// `.hydra/resolved.yaml` as JSON.
    pub config: Value,
    pub overrides: Vec<String>,
    pub summary: Option<Summary>,
    pub status: Status,
    pub curve: Vec<CurvePoint>,
    /// Epochs with a row in metrics.csv (progress of unfinished runs).
    pub epochs_logged: u64,
    pub tensorboard_dir: Option<PathBuf>,
    /// Known only from its sweep's plan: `dir` was never made.
    pub planned_only: bool,
    /// The launcher's restarts of the run's processes (`trainer.max_restarts`), from `run.json`.
    pub restarts: Vec<crate::storage::records::Restart>,
}

impl Run {
    /// A final metric of the run (`val/acc1`, `train/loss`, ...), from its summary.
    pub fn final_metric(&self, name: &str) -> Option<f64> {
        let metrics = &self.summary.as_ref()?.final_metrics;
        // lightning-hydra-template's names (`accuracy_names: acc`): its `val/acc` is top-1.
        let alias = name.replace("acc1", "acc");
        metrics
            .get(name)
            .or_else(|| metrics.get(&alias).filter(|_| name.contains("acc1")))
            .copied()
    }

    /// The metric the run is judged by (its summary's `lead`: the optimized or monitored one), else its
    /// top-1, else its validation loss.
    pub fn lead(&self) -> Option<crate::storage::records::LeadMetric> {
        if let Some(lead) = self.summary.as_ref().and_then(|s| s.lead.clone()) {
            return Some(lead);
        }
        let of = |name: &str, higher_is_better| {
            Some(crate::storage::records::LeadMetric {
                name: name.into(),
                higher_is_better,
                value: self.final_metric(name)?,
            })
        };
        of("val/acc1", true).or_else(|| of("val/loss", false))
    }

    /// The best value of metric `name` the run reached: its `_best` where it keeps one (a validation
    /// metric), else its final value.
    pub fn best_of(&self, name: &str) -> Option<f64> {
        match name.ends_with("_best") {
            true => self.final_metric(name),
            false => self
                .final_metric(&format!("{name}_best"))
                .or_else(|| self.final_metric(name)),
        }
    }

    /// A value from the resolved config by dotted path.
    pub fn config_at(&self, path: &str) -> Option<&Value> {
        at(&self.config, path)
    }

    pub fn config_str(&self, path: &str) -> Option<String> {
        self.config_at(path).map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }

    /// The architecture it trained: the run's summary says it (a `_target_` such as
    /// `torchvision.models.resnet50` is translated after the config was saved), else the config.
    pub fn model_name(&self) -> Option<String> {
        self.summary
            .as_ref()
            .map(|s| s.model.clone())
            .filter(|m| !m.is_empty())
            .or_else(|| self.config_str("model.name"))
    }

    /// The experiment this run belongs to (its `task_name`).
    pub fn task(&self) -> String {
        self.config_str("task_name")
            .unwrap_or_else(|| "unnamed".to_string())
    }

    /// A short name: the run directory, or `<sweep dir>#<job>`.
    pub fn label(&self) -> String {
        let name = |p: &Path| {
            p.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        match &self.sweep {
            Some((dir, num)) => format!("{}#{num}", name(dir)),
            None => name(&self.dir),
        }
    }
}

fn at<'a>(mut v: &'a Value, path: &str) -> Option<&'a Value> {
    for key in path.split('.') {
        v = v.get(key)?;
    }
    (!v.is_null()).then_some(v)
}

/// All runs under `paths` (each a run directory, or a directory searched recursively), sorted by directory.
pub fn discover(paths: &[PathBuf]) -> anyhow::Result<Vec<Run>> {
    let mut dirs = Vec::new();
    for p in paths {
        anyhow::ensure!(
            p.is_dir(),
            "{}: no such directory (give run directories or a logs directory)",
            p.display()
        );
        find_run_dirs(p, &mut dirs)?;
    }
    dirs.sort();
    dirs.dedup();
    // Sweeps found while searching: their planned jobs without a run directory are listed too.
    let (run_dirs, sweeps): (Vec<PathBuf>, Vec<PathBuf>) =
        dirs.into_iter().partition(|d| d.join(".hydra").is_dir());
    let mut runs: Vec<Run> = run_dirs
        .iter()
        .map(|d| read_run(d))
        .collect::<anyhow::Result<_>>()?;
    for sweep_dir in sweeps {
        let Some(record) = SweepRecord::read(&sweep_dir)? else {
            continue;
        };
        let sweep_alive = crate::storage::records::process_alive(&record.host, record.pid);
        for job in &record.jobs {
            let known = runs
                .iter()
                .any(|r| r.sweep.as_ref() == Some(&(sweep_dir.clone(), job.num)));
            if !known {
                runs.push(planned_run(&sweep_dir, &record, job, sweep_alive));
            }
        }
    }
    runs.sort_by_key(sort_key);
    Ok(runs)
}

/// Runs in directory order; a sweep's jobs by number (so job 10 follows job 9, planned ones in place).
fn sort_key(r: &Run) -> (PathBuf, usize) {
    match &r.sweep {
        Some((dir, num)) => (dir.clone(), *num),
        None => (r.dir.clone(), 0),
    }
}

/// A job of a sweep's plan that has no run directory, with the status its record gives it.
fn planned_run(
    sweep_dir: &Path,
    record: &SweepRecord,
    job: &PlannedJob,
    sweep_alive: Option<bool>,
) -> Run {
    Run {
        dir: sweep_dir.join(job.num.to_string()),
        sweep: Some((sweep_dir.to_path_buf(), job.num)),
        config: serde_json::json!({ "task_name": record.task_name }),
        overrides: job.overrides.clone(),
        summary: None,
        status: planned_status(record, job, sweep_alive),
        curve: Vec::new(),
        epochs_logged: 0,
        tensorboard_dir: None,
        planned_only: true,
        restarts: Vec::new(),
    }
}

/// How far a planned job without a run directory got, from its sweep's record and whether the sweep's
/// process is alive (`None`: it ran on another machine).
fn planned_status(record: &SweepRecord, job: &PlannedJob, sweep_alive: Option<bool>) -> Status {
    let sweep_over = record.state != SweepState::Running;
    let gone = format!("sweep process {} is gone", record.pid);
    match job.state {
        JobState::Failed => Status::Failed(format!(
            "before its run directory was made: {}",
            job.error.as_deref().unwrap_or("no error recorded")
        )),
        JobState::Completed => {
            Status::Unknown("completed, but its run directory is missing".into())
        }
        JobState::Running if sweep_over || sweep_alive == Some(false) => {
            Status::Crashed(format!("{gone} and the job never made its run directory"))
        }
        JobState::Running if sweep_alive.is_none() => Status::Unknown(format!(
            "starting on {} (process {})",
            record.host, record.pid
        )),
        JobState::Running => Status::Running,
        _ if sweep_over => Status::NotStarted(match &record.stopped_because {
            Some(why) => format!("sweep stopped: {why}"),
            None => "sweep ended without it".into(),
        }),
        _ if sweep_alive == Some(false) => Status::NotStarted(gone),
        _ if sweep_alive.is_none() => Status::NotStarted(format!(
            "sweep on {} (process {}) has not reached it, or was killed",
            record.host, record.pid
        )),
        _ => Status::NotStarted("waiting: the sweep is still running".into()),
    }
}

/// Run directories (holding `.hydra/`) and sweep directories (holding `multirun.yaml`) under `dir`;
/// checkpoints and TensorBoard folders are not searched.
fn find_run_dirs(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    if dir.join(".hydra").is_dir() {
        out.push(dir.to_path_buf());
        return Ok(());
    }
    if dir.join("multirun.yaml").is_file() {
        out.push(dir.to_path_buf());
    }
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if path.is_dir() && !hidden {
            find_run_dirs(&path, out)?;
        }
    }
    Ok(())
}

/// Read one run directory.
fn read_run(dir: &Path) -> anyhow::Result<Run> {
    let resolved = dir.join(".hydra").join("resolved.yaml");
    let text = std::fs::read_to_string(&resolved)
        .with_context(|| format!("{}: cannot read", resolved.display()))?;
    let config = crate::config::yaml::parse(&text, &resolved.display().to_string())?
        .map(|n| n.to_json())
        .unwrap_or(Value::Null);
    let overrides_path = dir.join(".hydra").join("overrides.yaml");
    let overrides = match std::fs::read_to_string(&overrides_path) {
        Ok(text) => crate::config::yaml::parse(&text, &overrides_path.display().to_string())?
            .map(|n| n.to_json())
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        Err(_) => Vec::new(),
    };
    let summary = Summary::read(dir)?;
    let status = status_of(dir, summary.as_ref());
    let (curve, epochs_logged) = read_curve(&dir.join("metrics.csv"))?;
    let sweep = sweep_of(dir);
    Ok(Run {
        dir: dir.to_path_buf(),
        sweep,
        config,
        overrides,
        summary,
        status,
        curve,
        epochs_logged,
        tensorboard_dir: find_tensorboard(dir),
        planned_only: false,
        restarts: RunState::read(dir).map(|s| s.restarts).unwrap_or_default(),
    })
}

/// The sweep a run directory belongs to (the nearest ancestor holding `multirun.yaml`) and its job
/// number: the directory's name, or `hydra.job.num` of `.hydra/hydra.yaml` when `hydra.sweep.subdir`
/// named the directory otherwise.
fn sweep_of(dir: &Path) -> Option<(PathBuf, usize)> {
    let sweep_dir = dir
        .ancestors()
        .skip(1)
        .take(4)
        .find(|a| a.join("multirun.yaml").is_file())?;
    let num = match dir.file_name()?.to_str()?.parse() {
        Ok(n) => n,
        Err(_) => {
            let path = dir.join(".hydra").join("hydra.yaml");
            let text = std::fs::read_to_string(&path).ok()?;
            let doc = crate::config::yaml::parse(&text, &path.display().to_string())
                .ok()??
                .to_json();
            at(&doc, "hydra.job.num")?.as_u64()? as usize
        }
    };
    Some((sweep_dir.to_path_buf(), num))
}

fn status_of(dir: &Path, summary: Option<&Summary>) -> Status {
    let state = RunState::read(dir);
    if let Some(s) = summary {
        return Status::Finished(s.status.clone());
    }
    match state {
        Some(st) if st.state == JobState::Failed => Status::Failed(st.error.unwrap_or_default()),
        Some(st) if st.state == JobState::Running => {
            match crate::storage::records::process_alive(&st.host, st.pid) {
                None => Status::Unknown(format!("running on {} as process {}", st.host, st.pid)),
                Some(true) => Status::Running,
                Some(false) => {
                    Status::Crashed(format!("process {} is gone, no summary.json", st.pid))
                }
            }
        }
        Some(st) => Status::Unknown(format!("run.json state {:?}", st.state)),
        None => Status::Unknown("no summary.json or run.json".into()),
    }
}

/// `metrics.csv` as curve points at fractional epochs (step / steps per epoch, the latter from the first
/// epoch-end row), plus the number of epoch-end rows.
fn read_curve(path: &Path) -> anyhow::Result<(Vec<CurvePoint>, u64)> {
    let Ok(text) = std::fs::read(path) else {
        return Ok((Vec::new(), 0));
    };
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(text.as_slice());
    let header = reader
        .headers()
        .with_context(|| format!("{}: unreadable header", path.display()))?
        .clone();
    let col = |name: &str| header.iter().position(|h| h == name);
    let (step_c, epoch_c, time_c) = (col("step"), col("epoch"), col("epoch_time_s"));
    let (tl, vl, va, va5) = (
        col("train/loss"),
        col("val/loss"),
        col("val/acc1").or_else(|| col("val/acc")),
        col("val/acc5"),
    );
    let mut rows: Vec<(u64, bool, CurvePoint)> = Vec::new();
    for record in reader.records() {
        let cells = record.with_context(|| format!("{}: not CSV", path.display()))?;
        let line = cells.position().map_or(0, |p| p.line());
        let num = |c: Option<usize>| -> Option<f64> {
            c.and_then(|i| cells.get(i))
                .filter(|s| !s.is_empty())
                .and_then(|s| s.parse().ok())
        };
        let step = num(step_c)
            .with_context(|| format!("{}:{line}: no step number in this row", path.display()))?
            as u64;
        let epoch_end = num(time_c).is_some();
        let point = CurvePoint {
            epoch: num(epoch_c).unwrap_or(0.0),
            train_loss: num(tl),
            val_loss: num(vl),
            val_acc1: num(va),
            val_acc5: num(va5),
        };
        rows.push((step, epoch_end, point));
    }
    let epochs = rows.iter().filter(|r| r.1).count() as u64;
    let steps_per_epoch = rows
        .iter()
        .find(|r| r.1)
        .map(|r| (r.0 as f64 / (r.2.epoch + 1.0)).max(1.0));
    let points = rows
        .into_iter()
        .map(|(step, _, mut p)| {
            p.epoch = match steps_per_epoch {
                Some(s) => step as f64 / s,
                None => step as f64,
            };
            p
        })
        .collect();
    Ok((points, epochs))
}

/// The directory holding TensorBoard event files, if the run wrote any.
fn find_tensorboard(dir: &Path) -> Option<PathBuf> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).ok()?.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if entry
                .file_name()
                .to_string_lossy()
                .starts_with("events.out.tfevents")
            {
                return Some(d);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sweep of two jobs in `sweep_state`, job 1 in `job_state`.
    fn record(sweep_state: &str, job_state: &str) -> (SweepRecord, PlannedJob) {
        let mut rec = SweepRecord::plan("t", &[vec!["a=1".into()], vec!["a=2".into()]]);
        rec.pid = 4_000_000;
        let state: JobState = serde_json::from_value(serde_json::json!(job_state)).unwrap();
        rec.set_job(
            1,
            state,
            (state == JobState::Failed).then(|| "bad key".into()),
        );
        if sweep_state != "running" {
            rec.end((sweep_state == "stopped").then(|| "--fail-fast: job #0 failed".into()));
        }
        let job = rec.jobs[1].clone();
        (rec, job)
    }

    #[rstest::rstest]
    #[case(
        "running",
        "planned",
        Some(true),
        "not started (waiting: the sweep is still running)"
    )]
    #[case(
        "running",
        "planned",
        Some(false),
        "not started (sweep process 4000000 is gone)"
    )]
    #[case(
        "stopped",
        "planned",
        Some(false),
        "not started (sweep stopped: --fail-fast: job #0 failed)"
    )]
    #[case(
        "completed",
        "planned",
        Some(false),
        "not started (sweep ended without it)"
    )]
    #[case("running", "running", Some(true), "running")]
    #[case(
        "running",
        "running",
        Some(false),
        "CRASHED (sweep process 4000000 is gone and the job never made its run directory)"
    )]
    #[case(
        "running",
        "failed",
        Some(true),
        "FAILED: before its run directory was made: bad key"
    )]
    #[case(
        "completed",
        "failed",
        None,
        "FAILED: before its run directory was made: bad key"
    )]
    #[case("running", "planned", None, "not started (sweep on")]
    #[case(
        "completed",
        "completed",
        Some(false),
        "unknown (completed, but its run directory is missing)"
    )]
    fn planned_jobs_without_a_directory(
        #[case] sweep_state: &str,
        #[case] job_state: &str,
        #[case] alive: Option<bool>,
        #[case] label: &str,
    ) {
        let (rec, job) = record(sweep_state, job_state);
        let got = planned_status(&rec, &job, alive).label();
        assert!(got.starts_with(label), "{got}");
    }

    /// A sweep killed before its jobs made their directories still shows every planned job, in order,
    /// with its overrides; the sweep's job directories are matched by number.
    #[test]
    fn discover_lists_planned_jobs_of_a_dead_sweep() {
        let dir = tempfile::tempdir().unwrap();
        let sweep = dir.path().join("multiruns/s1");
        std::fs::create_dir_all(&sweep).unwrap();
        std::fs::write(sweep.join("multirun.yaml"), "task_name: t\n").unwrap();
        let jobs: Vec<Vec<String>> = (0..3).map(|i| vec![format!("seed={i}")]).collect();
        let mut rec = SweepRecord::plan("t", &jobs);
        // A process id that is certainly gone: a child that has exited and been reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        rec.pid = child.id();
        child.wait().unwrap();
        rec.set_job(0, JobState::Running, None);
        rec.write(&sweep).unwrap();
        let runs = discover(&[dir.path().to_path_buf()]).unwrap();
        let got: Vec<(String, String, bool)> = runs
            .iter()
            .map(|r| (r.label(), r.status.label(), r.planned_only))
            .collect();
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(
            got[0].0 == "s1#0" && got[0].1.starts_with("CRASHED"),
            "{got:?}"
        );
        for (i, (label, status, planned)) in got.iter().enumerate().skip(1) {
            assert_eq!(label, &format!("s1#{i}"));
            assert!(status.starts_with("not started (sweep process"), "{status}");
            assert!(planned);
        }
        assert_eq!(runs[2].overrides, vec!["seed=2".to_string()]);
        assert_eq!(runs[2].task(), "t");
    }
}
