//! Losses on libtorch (`backend=tch`, cargo feature `torch`), registered under a `_target_` with
//! `register_tch_loss!`: the same contract as a Candle loss (`CandleLoss`: the loss a step
//! differentiates, and named metrics), computed with tch ops on the engine's device. A loss registered for
//! both backends uses the same `_target_` twice; its metrics must be the same.

use super::{Metric, Result, Value};
use tch::Tensor;

/// One batch's values: the mean loss (a scalar) and each metric's batch mean (scalars, in `metrics`'s
/// order).
pub struct TchLossValue {
    pub loss: Tensor,
    pub metrics: Vec<Tensor>,
}

/// A training objective on libtorch. `target` is `i64` `[N]` for class targets, `f32` `[N, ...]` for
/// values.
pub trait TchLoss: Send {
    /// The metrics `compute` reports besides the loss, in order.
    fn metrics(&self) -> Vec<Metric> {
        Vec::new()
    }
    fn compute(&self, output: &Tensor, target: &Tensor) -> Result<TchLossValue>;
}

/// Builds a libtorch loss from its `_target_` node's arguments.
pub type TchLossBuild = fn(&Value) -> Result<Box<dyn TchLoss>>;

/// One loss registered for libtorch.
pub struct TchLossEntry {
    pub target: &'static str,
    pub build: TchLossBuild,
}

entry!(TchLossEntry);

/// The libtorch loss registered under `target`.
pub fn tch_loss(target: &str) -> Option<&'static TchLossEntry> {
    super::find(target)
}

pub(super) fn tch_loss_targets() -> Vec<&'static str> {
    super::all::<TchLossEntry>()
}

/// Register a libtorch loss under a `_target_` name: `build(args) -> Result<L>` where `args` deserializes
/// from the `loss:` node and `L: TchLoss`.
#[macro_export]
macro_rules! register_tch_loss {
    ($target:literal, $build:path) => {
        const _: () = {
            fn __trainyard_build_tch_loss(
                args: &$crate::registry::Value,
            ) -> $crate::registry::Result<::std::boxed::Box<dyn $crate::registry::TchLoss>> {
                let args = $crate::registry::typed_args(args)?;
                let loss = $build(args)?;
                ::std::result::Result::Ok(::std::boxed::Box::new(loss))
            }
            $crate::registry::inventory::submit! {
                $crate::registry::TchLossEntry { target: $target, build: __trainyard_build_tch_loss }
            }
        };
    };
}
