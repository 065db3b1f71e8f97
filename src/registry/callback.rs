//! Callbacks written in Rust, registered under a `_target_` (`register_callback!`): a user's crate adds
//! `callbacks: {mine: {_target_: my_project.callbacks.StopAt, ...}}` the way Lightning takes a `Callback`
//! subclass. A callback sees every metric row the loggers see, decides at each epoch's end whether the
//! run goes on (Lightning's `trainer.should_stop`; a stop on any rank stops every rank, as Lightning
//! reduces the decision), and hears how the run ended.

use super::{Result, Row, RunEnd, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// What a callback is built with.
pub struct CallbackRun<'a> {
    pub run_dir: &'a Path,
    pub task_name: &'a str,
    /// This process's rank among all, and how many there are.
    pub rank: usize,
    pub world_size: usize,
}

/// An epoch's end as a callback sees it: the epoch (0-based), the optimizer steps so far and every
/// metric of the epoch's row (the training and validation metrics, `epoch_time_s`, `lr`, ...).
pub struct EpochEnd<'a> {
    pub epoch: u64,
    pub step: u64,
    pub metrics: &'a BTreeMap<String, f64>,
}

/// Whether the run goes on after an epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Stop after this epoch (its checkpoints are written), for this reason.
    Stop(String),
}

/// A callback: each hook has a default that does nothing, so a callback implements the ones it needs.
pub trait Callback {
    /// Every logged row (steps, mid-epoch validations, epochs, the test row), on every rank.
    fn on_row(&mut self, _row: &Row) -> Result<()> {
        Ok(())
    }

    /// An epoch ended (after validation and checkpointing): go on, or stop the run.
    fn on_epoch_end(&mut self, _end: &EpochEnd) -> Result<Flow> {
        Ok(Flow::Continue)
    }

    /// The run ended as `end` says.
    fn on_fit_end(&mut self, _end: &RunEnd) -> Result<()> {
        Ok(())
    }
}

/// Builds a registered callback from its `_target_` node's arguments (see `register_callback!`).
pub type CallbackBuild = fn(&Value, &CallbackRun) -> Result<Box<dyn Callback>>;

/// One registered callback: its `_target_`, how it is built, and how its arguments are checked before
/// anything runs.
pub struct CallbackEntry {
    pub target: &'static str,
    pub build: CallbackBuild,
    pub check: fn(&Value) -> Result<()>,
}

entry!(CallbackEntry);

/// The callback registered under `target`.
pub fn callback(target: &str) -> Option<&'static CallbackEntry> {
    super::find(target)
}

/// Every registered callback's `_target_`, sorted.
pub fn callback_targets() -> Vec<&'static str> {
    super::sorted(super::all::<CallbackEntry>())
}

/// Register a callback under a `_target_` name: `build(args, run) -> Result<C>` where `args`
/// deserializes from the config node (its other keys) and `C: Callback`. It runs on every rank.
#[macro_export]
macro_rules! register_callback {
    ($target:literal, $build:path) => {
        const _: () = {
            fn __trainyard_build(
                args: &$crate::registry::Value,
                run: &$crate::registry::CallbackRun,
            ) -> $crate::registry::Result<::std::boxed::Box<dyn $crate::registry::Callback>> {
                let args = $crate::registry::typed_args(args)?;
                let callback = $build(args, run)?;
                ::std::result::Result::Ok(::std::boxed::Box::new(callback))
            }
            fn __trainyard_check(args: &$crate::registry::Value) -> $crate::registry::Result<()> {
                $crate::registry::checked_args(args, $build)
            }
            $crate::registry::inventory::submit! {
                $crate::registry::CallbackEntry {
                    target: $target,
                    build: __trainyard_build,
                    check: __trainyard_check,
                }
            }
        };
    };
}
