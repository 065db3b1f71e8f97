//! Where metrics go, behind one trait: `metrics.csv` (`csv`), TensorBoard event files (`tensorboard`), a
//! Weights & Biases offline run (`wandb`), an MLflow tracking server (`mlflow`) and the console's lines
//! (`console`). The training loop hands every row to each sink it was given; a sink
//! keeps what it records. A new logger is one more `MetricSink`.

pub mod console;
pub mod csv;
pub mod mlflow;
pub mod tensorboard;
pub mod wandb;

/// When a row is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowKind {
    /// Every `log_every_n_steps` optimizer steps: the window's training loss and accuracy.
    Step,
    /// A validation in the middle of an epoch (`val_check_interval`), after this many of its batches.
    MidEpochValidation { batches_done: usize },
    /// An epoch's end: its training metrics, validation, time, throughput and device statistics.
    Epoch,
    /// `test: true`: the test split measured after training (`test/*`).
    Test,
}

/// One row of metrics at a point of training.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    pub kind: RowKind,
    /// The epoch in progress (0-based).
    pub epoch: u64,
    /// Optimizer steps taken so far.
    pub step: u64,
    pub values: &'a [(&'a str, f64)],
}

impl Row<'_> {
    pub fn get(&self, key: &str) -> Option<f64> {
        self.values.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }
}

/// How a run ended, for the sinks that record it (a sink dropped without `finish` saw the run fail).
pub struct RunEnd<'a> {
    pub final_metrics: &'a std::collections::BTreeMap<String, f64>,
    /// The best and the last checkpoint files, when local (an `s3://` one is not a file here).
    pub best_checkpoint: Option<&'a std::path::Path>,
    pub last_checkpoint: Option<&'a std::path::Path>,
    /// The run's logbook section: its markdown, then the plots it links (empty when none was written).
    pub logbook: &'a [std::path::PathBuf],
}

/// A destination for metric rows.
pub trait MetricSink {
    fn log(&mut self, row: &Row) -> anyhow::Result<()>;

    /// Does the sink keep the run's logbook section (`RunEnd::logbook`)? It is written only when one does.
    fn keeps_run_report(&self) -> bool {
        false
    }

    /// The run completed (or stopped early on purpose): close what the sink keeps open.
    fn finish(&mut self, _end: &RunEnd) -> anyhow::Result<()> {
        Ok(())
    }
}
