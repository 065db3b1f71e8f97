//! Metrics by `_target_` (`metrics.<name>: {_target_: ..., ...}`): a crate's own, registered with
//! `register_metric!` (a type implementing `trainyard::metrics::Metric`: update / compute / reset over
//! declared states), and torchmetrics' classes, which trainyard implements (`metrics::torchmetrics`).
//! A metric works on host arrays, so one registration serves every backend.

use super::{Result, Value};
use crate::metrics::Metric;

/// Builds a metric from its node's arguments (see `register_metric!`).
pub type MetricBuild = fn(&Value) -> Result<Box<dyn Metric>>;

/// One registered metric: its `_target_` name and constructor.
pub struct MetricEntry {
    pub target: &'static str,
    pub build: MetricBuild,
}

entry!(MetricEntry);

/// The constructor of metric `target`: a crate's registered one, else torchmetrics' class of that name.
pub fn metric(target: &str) -> Option<MetricBuild> {
    super::find::<MetricEntry>(target)
        .map(|e| e.build)
        .or_else(|| crate::metrics::torchmetrics::builder(target))
}

/// Every metric `_target_` this program builds (registered and torchmetrics'), sorted.
pub fn metric_targets() -> Vec<&'static str> {
    let mut names = super::all::<MetricEntry>();
    names.extend(
        crate::metrics::torchmetrics::TARGETS
            .iter()
            .map(|(t, _)| *t),
    );
    let mut names = super::sorted(names);
    names.dedup();
    names
}

/// Register a metric under a `_target_` name: `build(args) -> Result<M>` where `args` deserializes from
/// the `metrics.<name>` node (its keys other than `_target_` and trainyard's own, `on_step`) and
/// `M: trainyard::metrics::Metric`.
#[macro_export]
macro_rules! register_metric {
    ($target:literal, $build:path) => {
        const _: () = {
            fn __trainyard_build(
                args: &$crate::registry::Value,
            ) -> $crate::registry::Result<::std::boxed::Box<dyn $crate::metrics::Metric>> {
                let args = $crate::registry::typed_args(args)?;
                let metric = $build(args)?;
                ::std::result::Result::Ok(::std::boxed::Box::new(metric))
            }
            $crate::registry::inventory::submit! {
                $crate::registry::MetricEntry { target: $target, build: __trainyard_build }
            }
        };
    };
}
