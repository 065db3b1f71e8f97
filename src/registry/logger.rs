//! Loggers (metric sinks) written in Rust, registered under a `_target_` (`register_logger!`): a user's
//! crate adds `logger: {mine: {_target_: my_project.loggers.Jsonl, path: rows.jsonl}}` the way Lightning
//! takes a `Logger` subclass. The trait every logger implements, trainyard's own included, is here, so a
//! user's crate implements the same one.

use super::{Result, Value};
use std::path::Path;

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

/// What a registered logger is opened with: where the run writes, its name, its resolved config.
pub struct LoggerRun<'a> {
    /// The run directory (`.hydra/`, `metrics.csv`, `checkpoints/`).
    pub run_dir: &'a Path,
    pub task_name: &'a str,
    /// The resolved config, as JSON.
    pub config: &'a Value,
    /// The sweep's name, for a sweep's job.
    pub sweep: Option<&'a str>,
    /// The optimizer step the run resumed at, when it resumed: rows past it were logged before.
    pub resumed_at: Option<u64>,
}

/// Opens a registered logger from its `_target_` node's arguments (see `register_logger!`).
pub type LoggerBuild = fn(&Value, &LoggerRun) -> Result<Box<dyn MetricSink>>;

/// One registered logger: its `_target_`, how it is opened, and how its arguments are checked before
/// anything runs (the same typed deserialization, without opening anything).
pub struct LoggerEntry {
    pub target: &'static str,
    pub build: LoggerBuild,
    pub check: fn(&Value) -> Result<()>,
}

entry!(LoggerEntry);

/// The logger registered under `target`.
pub fn logger(target: &str) -> Option<&'static LoggerEntry> {
    super::find(target)
}

/// Every registered logger's `_target_`, sorted.
pub fn logger_targets() -> Vec<&'static str> {
    super::sorted(super::all::<LoggerEntry>())
}

/// Register a logger under a `_target_` name: `open(args, run) -> Result<S>` where `args` deserializes
/// from the config node (its other keys) and `S: MetricSink`. It runs on rank 0, as Lightning's loggers do.
#[macro_export]
macro_rules! register_logger {
    ($target:literal, $open:path) => {
        const _: () = {
            fn __trainyard_open(
                args: &$crate::registry::Value,
                run: &$crate::registry::LoggerRun,
            ) -> $crate::registry::Result<::std::boxed::Box<dyn $crate::registry::MetricSink>> {
                let args = $crate::registry::typed_args(args)?;
                let sink = $open(args, run)?;
                ::std::result::Result::Ok(::std::boxed::Box::new(sink))
            }
            fn __trainyard_check(args: &$crate::registry::Value) -> $crate::registry::Result<()> {
                $crate::registry::checked_args(args, $open)
            }
            $crate::registry::inventory::submit! {
                $crate::registry::LoggerEntry {
                    target: $target,
                    build: __trainyard_open,
                    check: __trainyard_check,
                }
            }
        };
    };
}
