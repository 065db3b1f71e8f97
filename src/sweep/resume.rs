//! Resumable sweeps: `train -m ... hydra.sweep.dir=<an earlier sweep's directory>` continues that sweep.
//! Jobs recorded as completed are kept (not run again); failed, killed and never-started ones run again
//! under their own numbers, each continuing from its own last checkpoint if it wrote one. A directory
//! that holds a different sweep, or one whose sweep is still running, is refused.

use crate::config::errors::ConfigError;
use crate::storage::records::{self, JobState, SweepRecord, SweepState};
use std::path::{Path, PathBuf};

/// The sweep's record: a new plan, or the earlier record of the same sweep to resume.
pub fn plan_or_resume(
    sweep_dir: &Path,
    task_name: &str,
    jobs: &[Vec<String>],
) -> Result<(SweepRecord, bool), ConfigError> {
    let earlier = SweepRecord::read(sweep_dir).map_err(|e| ConfigError::Io(format!("{e:#}")))?;
    let Some(earlier) = earlier else {
        return Ok((SweepRecord::plan(task_name, jobs), false));
    };
    let shown = records::display(sweep_dir);
    refuse_live(sweep_dir, &earlier)?;
    let planned: Vec<&Vec<String>> = earlier.jobs.iter().map(|j| &j.overrides).collect();
    if planned.len() != jobs.len() || planned.iter().zip(jobs).any(|(a, b)| *a != b) {
        let first =
            (0..planned.len().max(jobs.len())).find(|&i| planned.get(i) != jobs.get(i).as_ref());
        let describe = |j: Option<&Vec<String>>| match j {
            Some(o) => format!("`{}`", o.join(" ")),
            None => "absent".into(),
        };
        let i = first.unwrap_or(0);
        return Err(ConfigError::Run(format!(
            "hydra.sweep.dir={shown} holds a different sweep ({} jobs; this one has {}; job #{i} was {}, \
             now {}): to resume it, sweep over the same values; to start a new sweep, choose another \
             hydra.sweep.dir",
            planned.len(),
            jobs.len(),
            describe(planned.get(i).copied()),
            describe(jobs.get(i)),
        )));
    }
    Ok((reopened(earlier), true))
}

/// A search's record: a new one, or the earlier one in this directory to continue (its study journal
/// says which trials to keep; only a live sweep there is refused).
pub fn reopen(sweep_dir: &Path, task_name: &str) -> Result<SweepRecord, ConfigError> {
    let earlier = SweepRecord::read(sweep_dir).map_err(|e| ConfigError::Io(format!("{e:#}")))?;
    let Some(earlier) = earlier else {
        return Ok(SweepRecord::plan(task_name, &[]));
    };
    refuse_live(sweep_dir, &earlier)?;
    Ok(reopened(earlier))
}

fn refuse_live(sweep_dir: &Path, earlier: &SweepRecord) -> Result<(), ConfigError> {
    if earlier.state == SweepState::Running
        && earlier.pid != std::process::id()
        && records::process_alive(&earlier.host, earlier.pid) == Some(true)
    {
        return Err(ConfigError::Run(format!(
            "hydra.sweep.dir={}: that sweep is still running (process {} on {}); wait for it or \
             stop it before resuming",
            records::display(sweep_dir),
            earlier.pid,
            earlier.host
        )));
    }
    Ok(())
}

/// The earlier record, running again here: jobs with a result kept, the rest planned again.
fn reopened(earlier: SweepRecord) -> SweepRecord {
    let mut record = earlier;
    record.state = SweepState::Running;
    record.pid = std::process::id();
    record.host = records::hostname();
    record.ended_at = None;
    record.stopped_because = None;
    for job in &mut record.jobs {
        if !job.state.is_done() {
            job.state = JobState::Planned;
            job.error = None;
        }
    }
    record
}

/// Only a sweep directory named on the command line is resumed. Two sweeps started in the same second
/// share the default `${now:...}` directory: the second one gets a fresh sibling (`<dir>_1`, ...) and says
/// so, instead of silently continuing the first.
pub fn fresh_unless_named(sweep_dir: PathBuf, named_on_command_line: bool) -> PathBuf {
    let holds_sweep = |d: &Path| d.join(SweepRecord::FILE).exists();
    if named_on_command_line || !holds_sweep(&sweep_dir) {
        return sweep_dir;
    }
    let name = sweep_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let fresh = (1..)
        .map(|i| sweep_dir.with_file_name(format!("{name}_{i}")))
        .find(|d| !d.exists())
        .expect("an unbounded range has a free name");
    eprintln!(
        "{} already holds a sweep; launching into {} (to resume that sweep, pass hydra.sweep.dir={})",
        records::display(&sweep_dir),
        records::display(&fresh),
        records::display(&sweep_dir),
    );
    fresh
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jobs(v: &[&str]) -> Vec<Vec<String>> {
        v.iter().map(|s| vec![s.to_string()]).collect()
    }

    #[test]
    fn only_a_named_sweep_dir_is_resumed_a_default_one_gets_a_fresh_sibling() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("12-00-00");
        let empty = fresh_unless_named(dir.clone(), false);
        assert_eq!(
            empty, dir,
            "no sweep there yet: the directory is used as it is"
        );
        SweepRecord::plan("t", &jobs(&["a=1"])).write(&dir).unwrap();
        assert_eq!(fresh_unless_named(dir.clone(), true), dir);
        let fresh = fresh_unless_named(dir.clone(), false);
        assert_eq!(fresh, root.path().join("12-00-00_1"));
        std::fs::create_dir_all(&fresh).unwrap();
        assert_eq!(
            fresh_unless_named(dir, false),
            root.path().join("12-00-00_2")
        );
    }

    #[test]
    fn completed_jobs_are_kept_and_the_rest_planned_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut rec = SweepRecord::plan("t", &jobs(&["a=1", "a=2", "a=3"]));
        rec.set_job(0, JobState::Completed, None);
        rec.set_job(1, JobState::Failed, Some("boom".into()));
        rec.set_job(2, JobState::Running, None);
        rec.pid = u32::MAX - 1;
        rec.write(dir.path()).unwrap();
        let (back, resumed) =
            plan_or_resume(dir.path(), "t", &jobs(&["a=1", "a=2", "a=3"])).unwrap();
        assert!(resumed);
        let states: Vec<JobState> = back.jobs.iter().map(|j| j.state).collect();
        assert_eq!(
            states,
            [JobState::Completed, JobState::Planned, JobState::Planned]
        );
    }

    #[test]
    fn another_sweep_in_the_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut rec = SweepRecord::plan("t", &jobs(&["a=1", "a=2"]));
        rec.pid = u32::MAX - 1;
        rec.write(dir.path()).unwrap();
        let err = plan_or_resume(dir.path(), "t", &jobs(&["a=1", "a=5"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("job #1 was `a=2`, now `a=5`"), "{err}");
    }

    #[test]
    fn a_fresh_directory_gets_a_new_plan() {
        let dir = tempfile::tempdir().unwrap();
        let (rec, resumed) = plan_or_resume(dir.path(), "t", &jobs(&["a=1"])).unwrap();
        assert!(!resumed);
        assert_eq!(rec.jobs.len(), 1);
    }
}
