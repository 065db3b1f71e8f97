//! How far a sweep got: its record (`sweep.json`, saved as each job starts and ends), its failures, and
//! whether it stopped early; the table and the logbook section it ends with.

use crate::config::errors::ConfigError;
use crate::job::in_sweep::JobResult;
use crate::launch::{Progress, SweepJob};
use crate::storage::records;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

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
        if self.stopped_because.is_none() {
            if let Some(signal) = crate::platform::signals::received_signal() {
                self.stopped_because = Some(format!(
                    "{signal} stopped the sweep; rerun with hydra.sweep.dir={} to continue it",
                    records::display(&self.sweep_dir)
                ));
            }
        }
        self.record.end(self.stopped_because.take());
        self.save()?;
        // The column is the metric the jobs are judged by (the optimized or monitored one), with its
        // direction; a job judged by another names its own.
        let lead = self
            .record
            .jobs
            .iter()
            .find_map(|j| j.main_metric.as_ref())
            .map(|l| (l.name.clone(), l.arrow()));
        let header = match &lead {
            Some((name, arrow)) => format!("{name} {arrow}"),
            None => "main metric".into(),
        };
        println!("| job | overrides | status | {header} |");
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
            let metric = match (&j.main_metric, &lead) {
                (Some(m), Some((name, _))) if &m.name == name => format!("{:.4}", m.value),
                (Some(m), _) => format!("{} {:.4}", m.name, m.value),
                (None, _) => "-".into(),
            };
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
        // A stop signal ends the sweep as preempted even when its running jobs finished first.
        let preempted = crate::platform::signals::preemption_requested()
            || self
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

/// The launcher reports into the sweep's record, saved as each job starts and ends.
impl Progress for Tally {
    fn save(&self) -> Result<(), ConfigError> {
        self.record.write(&self.sweep_dir).map_err(|e| {
            ConfigError::Io(format!(
                "could not write {}: {e}",
                self.sweep_dir.join(records::SweepRecord::FILE).display()
            ))
        })
    }

    fn started(&mut self, job: &SweepJob) {
        self.record
            .set_job(job.num, records::JobState::Running, None);
    }

    fn submitted(&mut self, num: usize, launch_id: &str) {
        if let Some(j) = self.record.jobs.iter_mut().find(|j| j.num == num) {
            j.launch_id = Some(launch_id.to_string());
        }
    }

    fn ended(&mut self, result: JobResult) -> Result<bool, ConfigError> {
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
}
