//! Run records: the run directory and the files under `.hydra/` that say exactly what ran.
//! Every file is written to a temporary name and renamed, so a crash never leaves half a record.

use crate::config::tree::{Map, Node, Source, Value};
use crate::config::yaml;
use serde::Deserialize as _;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Write `contents` to `path` atomically: temp file in the same directory, fsync, rename.
pub fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("record");
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(contents)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        // A full disk (or a failing one) must not leave the half-written copy behind.
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Bytes of spaces after `run.json`'s text: room for its final state to be written over it in place when
/// the disk is too full for a new copy (`RunState::write`).
const RUN_RECORD_RESERVE: usize = 4096;

/// `text` written over the file at `path` from its start, padded with spaces to the file's length, where
/// it fits: a full disk has no room for a temporary copy, but the file's own blocks are there.
fn overwrite_in_place(path: &Path, text: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
    let len = f.metadata()?.len() as usize;
    if text.len() > len {
        return Err(std::io::Error::other(format!(
            "{}: the final record ({} bytes) is longer than the file ({len})",
            path.display(),
            text.len()
        )));
    }
    let mut padded = text.to_vec();
    padded.resize(len, b' ');
    f.write_all(&padded)?;
    f.sync_all()
}

/// What `.hydra/` records about a job besides its config.
#[derive(Debug, Clone)]
pub struct JobInfo {
    pub output_dir: PathBuf,
    /// The job's overrides (`.hydra/overrides.yaml`).
    pub overrides: Vec<String>,
    /// The job's `hydra` node with its run-time fields filled (`.hydra/hydra.yaml`, unresolved as Hydra
    /// writes it).
    pub hydra: Node,
}

fn map(items: Vec<(&str, Node)>) -> Node {
    let mut m = Map::new();
    for (k, v) in items {
        m.insert(k.to_string(), v);
    }
    Node::new(Value::Map(m), Source::Internal)
}

/// Write `.hydra/config.yaml` (as composed), `.hydra/resolved.yaml`, `.hydra/overrides.yaml`, `.hydra/hydra.yaml`.
pub fn write_job_records(job: &JobInfo, config: &Node, resolved: &Node) -> std::io::Result<()> {
    let dir = job.output_dir.join(".hydra");
    write_atomic(&dir.join("config.yaml"), yaml::to_yaml(config).as_bytes())?;
    write_atomic(
        &dir.join("resolved.yaml"),
        yaml::to_yaml(resolved).as_bytes(),
    )?;
    let overrides = Node::new(
        Value::List(
            job.overrides
                .iter()
                .map(|o| Node::new(Value::Str(o.clone()), Source::Internal))
                .collect(),
        ),
        Source::Internal,
    );
    write_atomic(
        &dir.join("overrides.yaml"),
        yaml::to_yaml(&overrides).as_bytes(),
    )?;
    let doc = map(vec![("hydra", job.hydra.clone())]);
    write_atomic(&dir.join("hydra.yaml"), yaml::to_yaml(&doc).as_bytes())
}

/// A path as the user would type it (relative to the current directory when below it).
pub fn display(path: &Path) -> String {
    crate::config::repository::display_path(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a/b.txt");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "two");
        let leftovers: Vec<_> = std::fs::read_dir(p.parent().unwrap()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temp files left behind");
    }
}

/// How far a job got (in `run.json`, and for every job of a sweep's plan in `sweep.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// In a sweep's plan, not started yet.
    Planned,
    Running,
    Completed,
    Failed,
    /// Stopped by the cluster's warning signal at a checkpoint and requeued: it resumes from there.
    Preempted,
    /// A search's pruner stopped it early (a result, not a failure).
    Pruned,
}

impl JobState {
    /// Finished with a result: a resumed sweep keeps it, and it is no failure.
    pub fn is_done(self) -> bool {
        matches!(self, JobState::Completed | JobState::Pruned)
    }
}

/// How far a sweep got (in `sweep.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SweepState {
    Running,
    /// Every job was tried.
    Completed,
    /// The sweep ended before every job was tried (`stopped_because` says why).
    Stopped,
}

/// `run.json`: whether a job is running, finished or failed. Written when the job starts and again when it
/// ends, so a reader (the logbook) can tell a crashed run (state `running`, process gone) from a live one.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunState {
    pub state: JobState,
    pub pid: u32,
    pub host: String,
    pub started_at: String,
    #[serde(default)]
    pub ended_at: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
    /// Why training stopped where it did (`max_epochs` reached, early stopping on its metric, the
    /// timer, a stop signal, the pruner), once it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_because: Option<String>,
    /// Each time the launcher restarted the run's processes (`trainer.max_restarts`), oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restarts: Vec<Restart>,
}

/// One restart of a run's processes after a failure: why, who failed, and where training went on from.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Restart {
    pub at: String,
    /// The failure, as the launcher saw it ("was killed by signal 9 (SIGKILL: ...)").
    pub cause: String,
    pub rank: usize,
    pub node: usize,
    /// The checkpoint the restarted processes resume from, and its step; none: from the start.
    pub resumed_from: Option<String>,
    pub resumed_at_step: Option<u64>,
}

impl Restart {
    /// The launcher's list (`restarts.json`), which a restarted rank 0 copies into `run.json`.
    pub fn read_all(run_dir: &Path) -> Vec<Restart> {
        std::fs::read_to_string(run_dir.join(RESTARTS_FILE))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default()
    }

    /// Add one to the launcher's list (atomically).
    pub fn append(run_dir: &Path, restart: Restart) -> std::io::Result<()> {
        let mut all = Restart::read_all(run_dir);
        all.push(restart);
        let text = serde_json::to_string_pretty(&all).map_err(std::io::Error::other)?;
        write_atomic(&run_dir.join(RESTARTS_FILE), text.as_bytes())
    }
}

const RESTARTS_FILE: &str = "restarts.json";

impl RunState {
    /// A run starting in `run_dir` (again, after the restarts the launcher recorded there).
    pub fn started(run_dir: &Path) -> Self {
        RunState {
            state: JobState::Running,
            pid: std::process::id(),
            host: hostname(),
            started_at: chrono::Local::now().to_rfc3339(),
            ended_at: None,
            error: None,
            stopped_because: None,
            restarts: Restart::read_all(run_dir),
        }
    }

    /// The same record, ended: `completed` (and why training stopped there), or `failed` with the error.
    pub fn ended(&self, outcome: Result<String, String>) -> Self {
        let (state, error, stopped_because) = match outcome {
            Ok(why) => (JobState::Completed, None, Some(why)),
            Err(e) => (JobState::Failed, Some(e), None),
        };
        RunState {
            state,
            ended_at: Some(chrono::Local::now().to_rfc3339()),
            error,
            stopped_because,
            ..self.clone()
        }
    }

    /// The same record, stopped at a checkpoint by the cluster's warning signal (`why`) and requeued.
    pub fn preempted(&self, why: String) -> Self {
        RunState {
            state: JobState::Preempted,
            ended_at: Some(chrono::Local::now().to_rfc3339()),
            stopped_because: Some(why),
            ..self.clone()
        }
    }

    /// Atomically, with `RUN_RECORD_RESERVE` spaces after the JSON; when the disk has no room for the
    /// new copy, an ended record is written over the old one in place, its error shortened to fit, so a
    /// run that failed for a full disk still says `failed` and why.
    pub fn write(&self, run_dir: &Path) -> std::io::Result<()> {
        let path = run_dir.join("run.json");
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        let mut padded = text.clone().into_bytes();
        padded.extend(std::iter::repeat_n(b' ', RUN_RECORD_RESERVE));
        padded.push(b'\n');
        let atomic = write_atomic(&path, &padded);
        let Err(e) = atomic else {
            return Ok(());
        };
        if self.state == JobState::Running || !path.is_file() {
            return Err(e);
        }
        let mut shortened = self.clone();
        if let Some(error) = &mut shortened.error {
            if error.len() > RUN_RECORD_RESERVE / 2 {
                let mut cut = RUN_RECORD_RESERVE / 2;
                while !error.is_char_boundary(cut) {
                    cut -= 1;
                }
                error.truncate(cut);
                error.push_str(" ...");
            }
        }
        let text = serde_json::to_string_pretty(&shortened).map_err(std::io::Error::other)?;
        overwrite_in_place(&path, text.as_bytes()).map_err(|_| e)
    }

    pub fn read(run_dir: &Path) -> Option<RunState> {
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("run.json")).ok()?).ok()
    }
}

/// This machine's name (Linux `kernel.hostname`), for telling whose process a `running` record belongs to.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "unknown".into())
}

/// `sweep.json` in a multirun directory: every job the sweep planned (number, overrides) and how far each
/// got. Written before the first job starts and rewritten as each job starts and ends, so a reader can
/// list jobs that failed before their run directory existed, or never started because the sweep stopped
/// or was killed, instead of silently missing them.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SweepRecord {
    pub task_name: String,
    pub state: SweepState,
    pub pid: u32,
    pub host: String,
    pub started_at: String,
    #[serde(default)]
    pub ended_at: Option<String>,
    #[serde(default)]
    pub stopped_because: Option<String>,
    pub jobs: Vec<PlannedJob>,
}

/// One job of a sweep's plan.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PlannedJob {
    pub num: usize,
    pub overrides: Vec<String>,
    pub state: JobState,
    #[serde(default)]
    pub error: Option<String>,
    /// Where the job wrote (known once it ran).
    #[serde(default)]
    pub output_dir: Option<PathBuf>,
    /// The metric it is judged by and its final value, for the sweep's table when a resumed sweep
    /// skips it (an older record's bare number is its `val/acc1`).
    #[serde(default, deserialize_with = "lead_or_number")]
    pub main_metric: Option<LeadMetric>,
    /// The launcher's name for it (a SLURM job id such as `123_4`), so a resumed sweep can find it.
    #[serde(default)]
    pub launch_id: Option<String>,
}

/// The metric a run is judged by (a search's `optimized_metric`, else the monitored one, else top-1,
/// else the validation loss), with its direction and the run's final value: what the console, the sweep
/// table, the logbook and a search lead with.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LeadMetric {
    pub name: String,
    pub higher_is_better: bool,
    #[serde(deserialize_with = "crate::json_nan::value")]
    pub value: f64,
}

impl LeadMetric {
    /// `val/f1 0.8123 (higher is better)` as a table cell says it: the value, and an arrow for the
    /// direction.
    pub fn arrow(&self) -> &'static str {
        if self.higher_is_better {
            "↑"
        } else {
            "↓"
        }
    }
}

/// A `main_metric` as a record holds it: a `LeadMetric`, or the bare number older records kept (their
/// `val/acc1`).
fn lead_or_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<LeadMetric>, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Either {
        Lead(LeadMetric),
        Number(f64),
    }
    Ok(match Option::<Either>::deserialize(d)? {
        Some(Either::Lead(l)) => Some(l),
        Some(Either::Number(v)) => Some(LeadMetric {
            name: "val/acc1".into(),
            higher_is_better: true,
            value: v,
        }),
        None => None,
    })
}

impl SweepRecord {
    pub const FILE: &'static str = "sweep.json";

    /// The plan of a sweep about to start: every job `planned`.
    pub fn plan(task_name: &str, jobs: &[Vec<String>]) -> Self {
        SweepRecord {
            task_name: task_name.to_string(),
            state: SweepState::Running,
            pid: std::process::id(),
            host: hostname(),
            started_at: chrono::Local::now().to_rfc3339(),
            ended_at: None,
            stopped_because: None,
            jobs: jobs
                .iter()
                .enumerate()
                .map(|(num, overrides)| PlannedJob {
                    num,
                    overrides: overrides.clone(),
                    state: JobState::Planned,
                    error: None,
                    output_dir: None,
                    main_metric: None,
                    launch_id: None,
                })
                .collect(),
        }
    }

    /// Add job `num` to the plan (a search plans its trials as it asks them); a job already there (a trial
    /// run again) keeps its state and gets these overrides, the ones it runs with now.
    pub fn add_job(&mut self, num: usize, overrides: &[String]) {
        if let Some(job) = self.jobs.iter_mut().find(|j| j.num == num) {
            job.overrides = overrides.to_vec();
            return;
        }
        self.jobs.push(PlannedJob {
            num,
            overrides: overrides.to_vec(),
            state: JobState::Planned,
            error: None,
            output_dir: None,
            main_metric: None,
            launch_id: None,
        });
        self.jobs.sort_by_key(|j| j.num);
    }

    /// Mark job `num` as `state` (with the error of a failed job).
    pub fn set_job(&mut self, num: usize, state: JobState, error: Option<String>) {
        if let Some(job) = self.jobs.iter_mut().find(|j| j.num == num) {
            job.state = state;
            job.error = error;
        }
    }

    /// The sweep is over: `completed`, or `stopped` with the reason.
    pub fn end(&mut self, stopped_because: Option<String>) {
        self.state = match stopped_because {
            Some(_) => SweepState::Stopped,
            None => SweepState::Completed,
        };
        self.stopped_because = stopped_because;
        self.ended_at = Some(chrono::Local::now().to_rfc3339());
    }

    pub fn write(&self, sweep_dir: &Path) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        write_atomic(&sweep_dir.join(Self::FILE), text.as_bytes())
    }

    /// The record of `sweep_dir`; none for sweeps made before it existed. A record that exists but cannot
    /// be parsed is an error naming the file.
    pub fn read(sweep_dir: &Path) -> anyhow::Result<Option<SweepRecord>> {
        let path = sweep_dir.join(Self::FILE);
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Ok(None);
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("{}: not a sweep record: {e}", path.display()))
    }
}

/// Whether process `pid` on `host` is alive: `None` when it ran on another machine (cannot be checked).
pub fn process_alive(host: &str, pid: u32) -> Option<bool> {
    (host == hostname()).then(|| Path::new(&format!("/proc/{pid}")).exists())
}

#[cfg(test)]
mod sweep_record_tests {
    use super::*;

    #[test]
    fn plan_marks_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = vec![vec!["a=1".to_string()], vec!["a=2".to_string()]];
        let mut rec = SweepRecord::plan("t", &jobs);
        assert!(rec.jobs.iter().all(|j| j.state == JobState::Planned));
        rec.set_job(1, JobState::Failed, Some("boom".into()));
        rec.end(Some("--fail-fast".into()));
        rec.write(dir.path()).unwrap();
        let back = SweepRecord::read(dir.path()).unwrap().unwrap();
        assert_eq!(back, rec);
        assert_eq!(back.state, SweepState::Stopped);
        assert_eq!(back.jobs[1].error.as_deref(), Some("boom"));
        assert_eq!(process_alive(&back.host, back.pid), Some(true));
        std::fs::write(dir.path().join(SweepRecord::FILE), "{").unwrap();
        let err = SweepRecord::read(dir.path()).unwrap_err().to_string();
        assert!(err.contains("sweep.json"), "{err}");
    }
}
