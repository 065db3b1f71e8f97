//! Reading run directories back: what ran (`.hydra/resolved.yaml`, `.hydra/overrides.yaml`), how it ended
//! (`summary.json`, `run.json`), and its curves (`metrics.csv`). Runs that crashed or are still running are
//! read too and marked as such; a directory that cannot be read is an error naming it, not a silent gap.

use crate::records::RunState;
use anyhow::Context;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// How a run ended, or that it has not.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// `summary.json` written; its status text (`completed`, `max_steps reached`, `early stopping ...`).
    Finished(String),
    /// The job reported an error.
    Failed(String),
    /// `run.json` says running and its process is alive on this machine.
    Running,
    /// `run.json` says running but the process is gone (killed, out of memory, machine rebooted).
    Crashed(String),
    /// Neither record says how it ended (older run, or running on another machine).
    Unknown(String),
}

impl Status {
    pub fn is_finished(&self) -> bool {
        matches!(self, Status::Finished(_))
    }

    pub fn label(&self) -> String {
        match self {
            Status::Finished(s) => s.clone(),
            Status::Failed(e) => format!("FAILED: {}", e.lines().next().unwrap_or("")),
            Status::Running => "running".into(),
            Status::Crashed(why) => format!("CRASHED ({why})"),
            Status::Unknown(why) => format!("unknown ({why})"),
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
    pub summary: Option<Value>,
    pub status: Status,
    pub curve: Vec<CurvePoint>,
    /// Epochs with a row in metrics.csv (progress of unfinished runs).
    pub epochs_logged: u64,
    pub tensorboard_dir: Option<PathBuf>,
}

impl Run {
    /// A value from the summary by dotted path.
    pub fn summary_at(&self, path: &str) -> Option<&Value> {
        at(self.summary.as_ref()?, path)
    }

    pub fn summary_f64(&self, path: &str) -> Option<f64> {
        self.summary_at(path).and_then(Value::as_f64)
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
    dirs.iter().map(|d| read_run(d)).collect()
}

/// A run directory is one holding `.hydra/`; checkpoints and TensorBoard folders are not searched.
fn find_run_dirs(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    if dir.join(".hydra").is_dir() {
        out.push(dir.to_path_buf());
        return Ok(());
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
pub fn read_run(dir: &Path) -> anyhow::Result<Run> {
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
    let summary_path = dir.join("summary.json");
    let summary: Option<Value> = match std::fs::read_to_string(&summary_path) {
        Ok(text) => Some(
            serde_json::from_str(&text)
                .with_context(|| format!("{}: not valid JSON", summary_path.display()))?,
        ),
        Err(_) => None,
    };
    let status = status_of(dir, summary.as_ref());
    let (curve, epochs_logged) = read_curve(&dir.join("metrics.csv"))?;
    let sweep = dir.parent().and_then(|parent| {
        let num = dir.file_name()?.to_str()?.parse().ok()?;
        parent
            .join("multirun.yaml")
            .is_file()
            .then(|| (parent.to_path_buf(), num))
    });
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
    })
}

fn status_of(dir: &Path, summary: Option<&Value>) -> Status {
    let state = RunState::read(dir);
    if let Some(s) = summary {
        let text = s
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("finished");
        return Status::Finished(text.to_string());
    }
    match state {
        Some(st) if st.state == "failed" => Status::Failed(st.error.unwrap_or_default()),
        Some(st) if st.state == "running" => {
            if st.host != crate::records::hostname() {
                Status::Unknown(format!("running on {} as process {}", st.host, st.pid))
            } else if Path::new(&format!("/proc/{}", st.pid)).exists() {
                Status::Running
            } else {
                Status::Crashed(format!("process {} is gone, no summary.json", st.pid))
            }
        }
        Some(st) => Status::Unknown(format!("run.json state {}", st.state)),
        None => Status::Unknown("no summary.json or run.json".into()),
    }
}

/// `metrics.csv` as curve points at fractional epochs (step / steps per epoch, the latter from the first
/// epoch-end row), plus the number of epoch-end rows.
fn read_curve(path: &Path) -> anyhow::Result<(Vec<CurvePoint>, u64)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok((Vec::new(), 0));
    };
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let (step_c, epoch_c, time_c) = (col("step"), col("epoch"), col("epoch_time_s"));
    let (tl, vl, va) = (col("train/loss"), col("val/loss"), col("val/acc1"));
    let mut rows: Vec<(u64, bool, CurvePoint)> = Vec::new();
    for (n, line) in lines.enumerate() {
        let cells: Vec<&str> = line.split(',').collect();
        let num = |c: Option<usize>| -> Option<f64> {
            c.and_then(|i| cells.get(i))
                .filter(|s| !s.is_empty())
                .and_then(|s| s.parse().ok())
        };
        let step = num(step_c)
            .with_context(|| format!("{}:{}: no step number in this row", path.display(), n + 2))?
            as u64;
        let epoch_end = num(time_c).is_some();
        let point = CurvePoint {
            epoch: num(epoch_c).unwrap_or(0.0),
            train_loss: num(tl),
            val_loss: num(vl),
            val_acc1: num(va),
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
