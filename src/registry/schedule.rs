//! Learning-rate schedules written in Rust, registered under a `_target_` (`register_schedule!`):
//! `scheduler: {_target_: my_project.WarmupCosine, _partial_: true, warmup_steps: 500}` is completed
//! later, as Hydra's partial is called with the optimizer: trainyard asks it for each step's rate once it
//! knows the run's length. A schedule is a pure function of the step, so a resumed run continues the same
//! curve. `interval` (`step` or `epoch`, Lightning's) is trainyard's; the node's other keys are the
//! constructor's arguments.

use super::{Result, Value};
use std::sync::Arc;

/// What a schedule knows of the run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScheduleContext {
    /// The optimizer's `lr`.
    pub base_lr: f64,
    /// Optimizer steps in the whole run (all epochs).
    pub total_steps: u64,
    /// Optimizer steps in one epoch.
    pub steps_per_epoch: u64,
}

/// A learning-rate schedule: the rate (and optionally a momentum, as OneCycle cycles one) for optimizer
/// step `step` (from 0). Under `interval: epoch` it is asked only at the first step of each epoch.
pub trait LrSchedule: Send + Sync + 'static {
    fn lr(&self, step: u64, run: &ScheduleContext) -> f64;
    fn momentum(&self, _step: u64, _run: &ScheduleContext) -> Option<f64> {
        None
    }
}

/// Builds a schedule from its `_target_` node's arguments (see `register_schedule!`).
pub type ScheduleBuild = fn(&Value) -> Result<Arc<dyn LrSchedule>>;

/// One registered schedule: its `_target_` name and constructor.
pub struct ScheduleEntry {
    pub target: &'static str,
    pub build: ScheduleBuild,
}

entry!(ScheduleEntry);

/// The schedule registered under `target`.
pub fn schedule(target: &str) -> Option<&'static ScheduleEntry> {
    super::find(target)
}

/// Every registered schedule's `_target_`, sorted.
pub fn schedule_targets() -> Vec<&'static str> {
    super::sorted(super::all::<ScheduleEntry>())
}

/// Register a schedule under a `_target_` name: `build(args) -> Result<S>` where `args` deserializes from
/// the `scheduler:` node (less `interval`, `_target_`, `_partial_`) and `S: LrSchedule`.
#[macro_export]
macro_rules! register_schedule {
    ($target:literal, $build:path) => {
        const _: () = {
            fn __trainyard_build(
                args: &$crate::registry::Value,
            ) -> $crate::registry::Result<::std::sync::Arc<dyn $crate::registry::LrSchedule>> {
                let args = $crate::registry::typed_args(args)?;
                let schedule = $build(args)?;
                ::std::result::Result::Ok(::std::sync::Arc::new(schedule))
            }
            $crate::registry::inventory::submit! {
                $crate::registry::ScheduleEntry { target: $target, build: __trainyard_build }
            }
        };
    };
}
