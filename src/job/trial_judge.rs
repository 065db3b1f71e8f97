//! The seam between a search and a trial's training (`trainer::ValidationJudge`): after each validation,
//! rank 0 of a trial reports the optimised metric to the study's journal and asks the study's pruner.
//! A sweep is a search when its directory names a study journal (`.search`, written by the sweeper), so
//! a trial in any process, local or on a cluster, finds its study.

use crate::config::errors::ConfigError;
use crate::search::journal::{Entry, Journal, SWEEP_POINTER as POINTER};
use crate::search::MedianPruner;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub struct TrialJudge {
    journal: Journal,
    trial: usize,
    metric: String,
    pruner: Option<MedianPruner>,
}

/// Name the journal of the search in `sweep_dir`.
pub fn point_at(sweep_dir: &Path, journal: &Path) -> Result<(), ConfigError> {
    crate::storage::records::write_atomic(
        &sweep_dir.join(POINTER),
        journal.display().to_string().as_bytes(),
    )
    .map_err(|e| {
        ConfigError::Io(format!(
            "cannot write {}: {e}",
            sweep_dir.join(POINTER).display()
        ))
    })
}

impl TrialJudge {
    /// The judge for job `num` of the sweep in `sweep_dir`, when that sweep is a search.
    pub fn for_job(sweep_dir: &Path, num: usize) -> Result<Option<TrialJudge>, ConfigError> {
        let pointer = sweep_dir.join(POINTER);
        let Ok(text) = std::fs::read_to_string(&pointer) else {
            return Ok(None);
        };
        let journal = Journal::at(&PathBuf::from(text.trim()));
        let Some((header, _)) = journal
            .load()
            .map_err(|e| ConfigError::Run(format!("{e:#}")))?
        else {
            return Ok(None);
        };
        Ok(Some(TrialJudge {
            journal,
            trial: num,
            metric: header.metric,
            pruner: header.pruner,
        }))
    }
}

impl crate::trainer::ValidationJudge for TrialJudge {
    fn judge(&self, epoch: u64, metrics: &HashMap<String, f64>) -> anyhow::Result<Option<String>> {
        let Some(&value) = metrics.get(&self.metric) else {
            return Ok(None);
        };
        self.journal.append(&Entry::Report {
            trial: self.trial,
            step: epoch,
            value,
        })?;
        let Some(pruner) = self.pruner else {
            return Ok(None);
        };
        let Some((_, study)) = self.journal.load()? else {
            return Ok(None);
        };
        Ok(study
            .trial(self.trial)
            .and_then(|t| pruner.prune(&study, t)))
    }
}
