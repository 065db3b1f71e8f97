//! A study's storage: an append-only journal of JSON lines (Optuna's `JournalFileStorage` idea), one
//! entry per event (the study, a trial asked, a value reported, a trial told). Appends hold an exclusive
//! `flock`, so the sweeper and its trials' processes (local or on a cluster's shared disk) can write to
//! the same file; replaying the lines rebuilds the study, which is how a search resumes after a crash.

use super::distribution::{Choice, Distribution};
use super::pruner::MedianPruner;
use super::study::{Direction, Study, TrialState};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// The file in a search's sweep directory that names its journal (trials and the logbook find it there).
pub const SWEEP_POINTER: &str = ".search";

/// What a study is: written once, first; a rerun with another header is refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StudyHeader {
    pub study_name: String,
    pub direction: Direction,
    /// The run metric the study optimises (`optimized_metric`).
    pub metric: String,
    pub space: IndexMap<String, Distribution>,
    #[serde(default)]
    pub pruner: Option<MedianPruner>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Entry {
    Study(StudyHeader),
    Ask {
        trial: usize,
        params: IndexMap<String, Choice>,
    },
    Report {
        trial: usize,
        step: u64,
        value: f64,
    },
    Tell {
        trial: usize,
        state: TrialState,
        value: Option<f64>,
    },
}

/// Does the file end inside a line (a writer crashed mid-append)?
fn ends_torn(file: &mut std::fs::File) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let mut last = [0u8; 1];
    file.seek(SeekFrom::End(-1)).is_ok() && file.read_exact(&mut last).is_ok() && last[0] != b'\n'
}

pub struct Journal {
    pub path: PathBuf,
}

impl Journal {
    pub fn at(path: &Path) -> Journal {
        Journal {
            path: path.to_path_buf(),
        }
    }

    /// Append one entry (one line, one `write`, under an exclusive lock).
    pub fn append(&self, entry: &Entry) -> anyhow::Result<()> {
        let mut line = serde_json::to_string(entry)?;
        line.push('\n');
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| {
                anyhow::anyhow!("cannot open the study journal {}: {e}", self.path.display())
            })?;
        let fd = file.as_raw_fd();
        // SAFETY: flock on a descriptor this function owns; released on drop/close.
        unsafe { libc::flock(fd, libc::LOCK_EX) };
        // A line torn by a crash is closed first, so that it stays one bad line that `load` skips.
        if ends_torn(&mut file) {
            line.insert(0, '\n');
        }
        let written = file.write_all(line.as_bytes()).and_then(|_| file.flush());
        unsafe { libc::flock(fd, libc::LOCK_UN) };
        written.map_err(|e| {
            anyhow::anyhow!(
                "cannot write the study journal {}: {e}",
                self.path.display()
            )
        })
    }

    /// The study as the journal has it (`None` when there is no journal yet). A torn line (a crash
    /// mid-write) is skipped, any other bad line is an error naming it.
    pub fn load(&self) -> anyhow::Result<Option<(StudyHeader, Study)>> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => anyhow::bail!("cannot read the study journal {}: {e}", self.path.display()),
        };
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let torn = |i: usize, line: &str| {
            (i + 1 == lines.len() && !text.ends_with('\n')) || !line.trim_end().ends_with('}')
        };
        let mut header: Option<StudyHeader> = None;
        let mut study = Study::default();
        for (i, line) in lines.iter().enumerate() {
            let entry: Entry = match serde_json::from_str(line) {
                Ok(e) => e,
                Err(_) if torn(i, line) => continue,
                Err(e) => anyhow::bail!(
                    "{}:{}: not a journal entry: {e}",
                    self.path.display(),
                    i + 1
                ),
            };
            match entry {
                // A later header only changes the pruner (the sweeper refuses any other change).
                Entry::Study(h) => {
                    study.space = h.space.clone();
                    study.direction = Some(h.direction);
                    match header.as_mut() {
                        Some(first) => first.pruner = h.pruner,
                        None => header = Some(h),
                    }
                }
                Entry::Ask { trial, params } => study.add_running(trial, params),
                Entry::Report { trial, step, value } => {
                    if let Some(t) = study.trial_mut(trial) {
                        t.intermediate.insert(step, value);
                    }
                }
                Entry::Tell {
                    trial,
                    state,
                    value,
                } => {
                    if let Some(t) = study.trial_mut(trial) {
                        t.state = state;
                        t.value = value;
                    }
                }
            }
        }
        Ok(header.map(|h| (h, study)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_study_replays_from_its_journal_and_a_torn_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::at(&dir.path().join("study.journal"));
        assert!(j.load().unwrap().is_none());
        let header = StudyHeader {
            study_name: "s".into(),
            direction: Direction::Maximize,
            metric: "val/acc1".into(),
            space: IndexMap::from([(
                "x".to_string(),
                Distribution::Int {
                    low: 1,
                    high: 3,
                    log: false,
                    step: 1,
                },
            )]),
            pruner: Some(MedianPruner::default()),
        };
        j.append(&Entry::Study(header.clone())).unwrap();
        for n in 0..2 {
            j.append(&Entry::Ask {
                trial: n,
                params: IndexMap::from([("x".to_string(), Choice::Int(n as i64 + 1))]),
            })
            .unwrap();
        }
        j.append(&Entry::Report {
            trial: 0,
            step: 0,
            value: 0.5,
        })
        .unwrap();
        j.append(&Entry::Tell {
            trial: 0,
            state: TrialState::Complete,
            value: Some(0.7),
        })
        .unwrap();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&j.path)
            .unwrap();
        f.write_all(b"{\"op\":\"tell\",\"tri").unwrap();
        let (h, study) = j.load().unwrap().unwrap();
        assert_eq!(h, header);
        // The next writer closes the torn line; it stays skipped and the new entry counts.
        j.append(&Entry::Report {
            trial: 1,
            step: 0,
            value: 0.25,
        })
        .unwrap();
        let (_, after) = j.load().unwrap().unwrap();
        assert_eq!(after.trials[1].intermediate.get(&0), Some(&0.25));
        assert_eq!(study.trials.len(), 2);
        assert_eq!(study.trials[0].state, TrialState::Complete);
        assert_eq!(study.trials[0].intermediate.get(&0), Some(&0.5));
        assert_eq!(study.trials[1].state, TrialState::Running);
        assert_eq!(study.best_trial().unwrap().number, 0);
    }
}
