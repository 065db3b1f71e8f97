//! `summary.json`: what a finished (or stopped) run records, written from `Summary` and read back into it
//! (by the logbook and the launcher's report), so writer and readers cannot drift apart. Every field has
//! a default, so a summary from an older version still reads.

use crate::backend::StateBytes;
use crate::callbacks::batch_size_finder::Finding;
use crate::callbacks::device_stats::DeviceStatsSummary;
use crate::callbacks::timer::TimerSummary;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// What `summary.json` records about a finished (or stopped) run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Summary {
    pub task_name: String,
    pub status: RunStatus,
    pub backend: String,
    pub model: String,
    pub data: String,
    pub strategy: String,
    pub precision: String,
    pub num_nodes: usize,
    pub devices: usize,
    pub batch_size: usize,
    pub global_batch_size: usize,
    pub num_parameters: usize,
    pub epochs_completed: u64,
    pub global_step: u64,
    pub best: Option<BestMetric>,
    /// The metric the run is judged by, its direction and final value (`LeadMetric`).
    pub lead: Option<crate::storage::records::LeadMetric>,
    #[serde(deserialize_with = "crate::json_nan::map")]
    pub final_metrics: BTreeMap<String, f64>,
    pub wall_time_s: f64,
    pub train_time_s: f64,
    pub train_samples_per_s: f64,
    /// Median time of one optimizer step's compute (forward, backward, update), excluding data loading.
    pub median_step_time_s: Option<f64>,
    /// How long the training steps waited for their batches against how long they computed (rank 0's).
    pub input: Option<InputWait>,
    /// `data.skip_corrupt`: the samples left out because their image could not be decoded.
    pub skipped_samples: Option<SkippedSamples>,
    pub peak_rss_bytes: Option<u64>,
    pub best_checkpoint: Option<String>,
    pub last_checkpoint: Option<String>,
    pub resumed_from: Option<String>,
    /// The step of the checkpoint the run resumed from (equal to `global_step`: nothing was trained).
    pub resumed_at_step: Option<u64>,
    /// `train=false` (`train eval`): what was measured, and on which weights.
    pub eval_only: Option<EvalOnly>,
    /// What the batch-size finder tried and chose, when it ran.
    pub batch_size_finder: Option<Finding>,
    /// DeviceStatsMonitor's figures for the whole run, when it ran.
    pub device_stats: Option<DeviceStatsSummary>,
    /// The Timer callback's limit and the training time it measured, when it ran.
    pub timer: Option<TimerSummary>,
    /// Parameter, gradient and optimizer-state bytes each rank keeps for training, by rank (what
    /// FSDP's sharding divides).
    pub state_bytes_per_rank: Vec<StateBytes>,
    /// `trainer.profiler: simple`: this rank's time per action of the loop, the longest first.
    pub profile: Option<Vec<super::profiler::ActionTime>>,
}

/// What a run that trained nothing (`train eval`, `train predict`) measured: the split, its samples over every rank, and
/// the checkpoint whose weights it measured (none: the model's initial weights).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct EvalOnly {
    pub split: String,
    pub samples: u64,
    pub checkpoint: Option<String>,
    /// `train predict`: the file its rows went to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predictions: Option<String>,
}

/// The training steps' time waiting for the loader's next batch and computing (forward, backward,
/// update). A run that waits a large share is input-bound: more `data.num_workers` (or a faster input
/// pipeline) would speed it up, a faster model would not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct InputWait {
    #[serde(rename = "waiting_s")]
    pub waiting: f64,
    #[serde(rename = "computing_s")]
    pub computing: f64,
}

impl InputWait {
    /// The share of the steps' time spent waiting for data, when the steps took any time.
    pub fn fraction(&self) -> Option<f64> {
        let total = self.waiting + self.computing;
        (total > 0.0).then(|| self.waiting / total)
    }

    /// Waiting at least a fifth of the time: said at the end of the run and in the logbook.
    pub fn input_bound(&self) -> bool {
        self.fraction().is_some_and(|f| f >= INPUT_BOUND)
    }
}

/// Samples left out of their batches (`data.skip_corrupt`): how many on all ranks, and the first of
/// rank 0's as their errors named them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SkippedSamples {
    pub count: u64,
    pub first: Vec<String>,
}

/// The share of a step's time waiting for data from which a run counts as input-bound.
pub const INPUT_BOUND: f64 = 0.2;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct BestMetric {
    pub monitor: String,
    #[serde(deserialize_with = "crate::json_nan::value")]
    pub value: f64,
    pub epoch: u64,
}

impl Summary {
    pub const FILE: &'static str = "summary.json";

    /// The run's summary in `run_dir`, if it has one (`Err`: it is there but does not read).
    pub fn read(run_dir: &Path) -> anyhow::Result<Option<Summary>> {
        let path = run_dir.join(Self::FILE);
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Ok(None);
        };
        let summary = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: not a summary ({e})", path.display()))?;
        Ok(Some(summary))
    }

    /// Written atomically.
    pub fn write(&self, run_dir: &Path) -> anyhow::Result<()> {
        crate::storage::records::write_atomic(
            &run_dir.join(Self::FILE),
            serde_json::to_string_pretty(self)?.as_bytes(),
        )?;
        Ok(())
    }

    /// The metric the run is judged by, with its final value: the sweep table's main metric.
    pub fn main_metric(&self) -> Option<crate::storage::records::LeadMetric> {
        self.lead.clone()
    }

    /// What the console's last line reports: the lead metric (the optimized or monitored one), else
    /// the monitored metric, else `val/acc1`, else `val/loss` (a summary written before `lead` was).
    pub fn headline(&self) -> Option<(&str, f64)> {
        if let Some(l) = &self.lead {
            return Some((l.name.as_str(), l.value));
        }
        let monitored = self.best.as_ref().map(|b| b.monitor.as_str());
        monitored
            .into_iter()
            .chain(["val/acc1", "val/acc", "val/loss"])
            .find_map(|k| Some((k, *self.final_metrics.get(k)?)))
    }
}

/// How a run ended. In `summary.json` it is the sentence the console shows (`completed`, `max_steps
/// reached`, `early stopped: …`, `stopped by the timer …`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum RunStatus {
    #[default]
    Completed,
    MaxStepsReached,
    /// EarlyStopping's patience ran out: why, in its words.
    EarlyStopped(String),
    /// The Timer's `max_time` ran out: when, in its words.
    TimeLimit(String),
    /// The batch-size finder ran with `fit_after: false`.
    BatchSizeOnly,
    /// The cluster's warning signal came (time limit or preemption): a checkpoint was written to resume
    /// from; in its words.
    Preempted(String),
    /// A search's pruner stopped the trial after a validation: why, in its words.
    Pruned(String),
}

impl Summary {
    /// Why training stopped where it did, for `run.json`: the limit it reached, or the callback or
    /// signal that stopped it, in its words.
    pub fn stopped_because(&self) -> String {
        match &self.status {
            _ if self.eval_only.is_some() => "evaluated only (train=false)".into(),
            RunStatus::Completed if self.resumed_at_step == Some(self.global_step) => format!(
                "nothing to train: the checkpoint it resumed from was already at its end (epoch {}, \
                 step {})",
                self.epochs_completed, self.global_step
            ),
            RunStatus::Completed => format!(
                "max_epochs reached ({} epochs, {} steps)",
                self.epochs_completed, self.global_step
            ),
            RunStatus::MaxStepsReached => format!("max_steps reached (step {})", self.global_step),
            other => other.to_string(),
        }
    }
}

impl RunStatus {
    /// Does `test: true` test after a run that ended so? Not after a preemption (the run goes on when
    /// requeued), a pruned trial (Lightning's pruning callback raises) or a finder-only run.
    pub fn tests_after(&self) -> bool {
        !matches!(
            self,
            RunStatus::Preempted(_) | RunStatus::Pruned(_) | RunStatus::BatchSizeOnly
        )
    }
}

const COMPLETED: &str = "completed";
const MAX_STEPS: &str = "max_steps reached";
const BATCH_SIZE_ONLY: &str = "batch size found; not trained (fit_after=false)";
const EARLY_STOPPED: &str = "early stopped";
const TIMER: &str = "stopped by the timer";
const PREEMPTED: &str = "preempted";
const PRUNED: &str = "pruned";

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RunStatus::Completed => COMPLETED,
            RunStatus::MaxStepsReached => MAX_STEPS,
            RunStatus::EarlyStopped(why)
            | RunStatus::TimeLimit(why)
            | RunStatus::Preempted(why)
            | RunStatus::Pruned(why) => why,
            RunStatus::BatchSizeOnly => BATCH_SIZE_ONLY,
        })
    }
}

impl From<RunStatus> for String {
    fn from(status: RunStatus) -> String {
        status.to_string()
    }
}

impl TryFrom<String> for RunStatus {
    type Error = String;

    fn try_from(text: String) -> Result<RunStatus, String> {
        Ok(match text.as_str() {
            COMPLETED => RunStatus::Completed,
            MAX_STEPS => RunStatus::MaxStepsReached,
            BATCH_SIZE_ONLY => RunStatus::BatchSizeOnly,
            t if t.starts_with(EARLY_STOPPED) => RunStatus::EarlyStopped(text),
            t if t.starts_with(TIMER) => RunStatus::TimeLimit(text),
            t if t.starts_with(PREEMPTED) => RunStatus::Preempted(text),
            t if t.starts_with(PRUNED) => RunStatus::Pruned(text),
            _ => return Err(format!("unknown run status '{text}'")),
        })
    }
}

impl RunStatus {
    /// Stopped by a signal (SIGTERM, SLURM's SIGUSR1), with the checkpoint written to resume from.
    pub fn preempted(
        signal: &str,
        epoch: u64,
        step: u64,
        checkpoint: &std::path::Path,
    ) -> RunStatus {
        RunStatus::Preempted(format!(
            "{PREEMPTED} by {signal} at epoch {epoch}, step {step}: resumes from {}",
            checkpoint.display()
        ))
    }

    /// A registered callback stopped the run (`what`: which, when and why).
    pub fn stopped_by_callback(what: &str) -> RunStatus {
        RunStatus::EarlyStopped(format!("{EARLY_STOPPED}: {what}"))
    }

    /// EarlyStopping's reason for stopping.
    pub fn early_stopped(monitor: &str, patience: u64) -> RunStatus {
        RunStatus::EarlyStopped(format!(
            "{EARLY_STOPPED}: {monitor} did not improve for {patience} validation checks"
        ))
    }
}

pub use crate::platform::memory::{peak_rss_bytes, reset_peak_rss};

/// The median of measured step times (forward, backward and optimizer step; no data loading).
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    (!v.is_empty()).then(|| v[v.len() / 2])
}

/// `<metric>_best` for each validation metric: the best value so far (highest accuracy, lowest loss), what
/// lightning-hydra-template's `val/acc_best` is, and what a search may optimise.
pub(super) fn record_best_so_far(
    metrics: &mut std::collections::HashMap<String, f64>,
    directions: &[(String, bool)],
) {
    for (key, higher_is_better) in directions {
        let higher_is_better = *higher_is_better;
        let Some(&now) = metrics.get(key.as_str()) else {
            continue;
        };
        let best_key = format!("{key}_best");
        let best = match metrics.get(&best_key) {
            Some(&b) if (higher_is_better && b >= now) || (!higher_is_better && b <= now) => b,
            _ => now,
        };
        metrics.insert(best_key, best);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    /// The peak RSS can be reset: after touching 512 MiB and freeing it, a reset brings the peak back
    /// well under it (what keeps a sweep's jobs from inheriting each other's peaks). The margin is wide
    /// because other tests run in the same process.
    #[test]
    fn peak_rss_resets() {
        let big = vec![1u8; 512 << 20];
        std::hint::black_box(&big);
        let before = peak_rss_bytes().unwrap();
        assert!(before >= 512 << 20, "{before}");
        drop(big);
        reset_peak_rss();
        let after = peak_rss_bytes().unwrap();
        assert!(
            after < before - (128 << 20),
            "peak {before} -> {after} after reset"
        );
    }

    #[rstest]
    #[case::completed(RunStatus::Completed)]
    #[case::max_steps(RunStatus::MaxStepsReached)]
    #[case::early(RunStatus::early_stopped("val/loss", 3))]
    #[case::timer(RunStatus::TimeLimit("stopped by the timer after 1.0s (max_time=00:00:00:01)".into()))]
    #[case::finder(RunStatus::BatchSizeOnly)]
    fn statuses_read_back_as_written(#[case] status: RunStatus) {
        let summary = Summary {
            status: status.clone(),
            ..Summary::default()
        };
        let text = serde_json::to_string(&summary).unwrap();
        let back: Summary = serde_json::from_str(&text).unwrap();
        assert_eq!(back.status, status);
        let e = serde_json::from_str::<Summary>(r#"{"status": "vanished"}"#).unwrap_err();
        assert!(
            e.to_string().contains("unknown run status 'vanished'"),
            "{e}"
        );
    }

    /// An older summary without the newer fields reads, with their defaults.
    #[test]
    fn an_older_summary_reads() {
        let s: Summary =
            serde_json::from_str(r#"{"task_name": "t", "status": "completed", "global_step": 7}"#)
                .unwrap();
        assert_eq!((s.task_name.as_str(), s.global_step), ("t", 7));
        assert!(s.state_bytes_per_rank.is_empty() && s.best.is_none());
    }

    /// Each validation metric keeps its best by its own direction: the lowest error, the highest share.
    #[test]
    fn the_best_so_far_follows_each_metrics_direction() {
        let directions = [
            ("val/mae".to_string(), false),
            ("val/iou".to_string(), true),
        ];
        let mut metrics = std::collections::HashMap::new();
        for (mae, iou) in [(0.5, 0.2), (0.3, 0.6), (0.4, 0.5)] {
            metrics.insert("val/mae".to_string(), mae);
            metrics.insert("val/iou".to_string(), iou);
            record_best_so_far(&mut metrics, &directions);
        }
        assert_eq!(metrics["val/mae_best"], 0.3);
        assert_eq!(metrics["val/iou_best"], 0.6);
    }
}
