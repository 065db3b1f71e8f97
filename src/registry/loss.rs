//! Losses written with Candle, registered under a `_target_` (`register_candle_loss!`): what a training
//! step computes from the model's output and the batch's targets — the loss it differentiates and named
//! metrics, logged as `train/<name>` and `val/<name>`, monitored by ModelCheckpoint and EarlyStopping,
//! shown in the logbook. Without a `loss:` node a run classifies (cross-entropy, top-1/top-5).

use super::{Result, Tensor, Value};

/// The most metrics one loss reports (a run's statistics are a fixed-size sum, reduced over ranks in one
/// collective).
pub const MAX_METRICS: usize = 8;

/// A metric a loss reports, and which way is better (for `val/<name>_best` and a search's direction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metric {
    pub name: String,
    pub higher_is_better: bool,
}

impl Metric {
    pub fn higher(name: &str) -> Metric {
        Metric {
            name: name.into(),
            higher_is_better: true,
        }
    }
    pub fn lower(name: &str) -> Metric {
        Metric {
            name: name.into(),
            higher_is_better: false,
        }
    }
}

/// One batch's values: the mean loss (a scalar the engine differentiates) and each metric's batch mean
/// (scalars, in `CandleLoss::metrics`'s order). Means over batches are weighted by the batch's size, as
/// Lightning's `self.log(..., on_epoch=True)` averages them.
pub struct LossValue {
    pub loss: Tensor,
    pub metrics: Vec<Tensor>,
}

/// A training objective. `target` is `u32` `[N]` for class targets, `f32` `[N, ...]` for values.
pub trait CandleLoss: Send + Sync {
    /// The metrics `compute` reports besides the loss, in order.
    fn metrics(&self) -> Vec<Metric> {
        Vec::new()
    }
    fn compute(&self, output: &Tensor, target: &Tensor) -> candle_core::Result<LossValue>;
}

/// Builds a loss from its `_target_` node's arguments (see `register_candle_loss!`).
pub type LossBuild = fn(&Value) -> Result<Box<dyn CandleLoss>>;

/// One registered loss: its `_target_` name and constructor.
pub struct LossEntry {
    pub target: &'static str,
    pub build: LossBuild,
}

entry!(LossEntry);

/// The loss registered under `target`.
pub fn loss(target: &str) -> Option<&'static LossEntry> {
    super::find(target)
}

/// Every registered loss's `_target_` (Candle's and libtorch's), sorted, each once.
pub fn loss_targets() -> Vec<&'static str> {
    let candle = super::all::<LossEntry>();
    #[cfg(feature = "torch")]
    return super::merged(candle, super::tch_loss_targets);
    #[cfg(not(feature = "torch"))]
    return super::merged(candle, Vec::new);
}

/// Is `target` a loss registered for some backend?
pub fn is_loss(target: &str) -> bool {
    loss_targets().contains(&target)
}

/// Is `target` a loss registered for libtorch? Never in a build without the `torch` feature.
pub fn loss_runs_on_tch(target: &str) -> bool {
    #[cfg(feature = "torch")]
    return super::tch_loss(target).is_some();
    #[cfg(not(feature = "torch"))]
    return {
        let _ = target;
        false
    };
}

/// The metrics the loss `target` reports, built from `args` (its Candle version's, else its libtorch
/// version's).
pub fn loss_metrics(target: &str, args: &Value) -> Result<Vec<Metric>> {
    if let Some(entry) = loss(target) {
        return Ok((entry.build)(args)?.metrics());
    }
    #[cfg(feature = "torch")]
    if let Some(entry) = super::tch_loss(target) {
        return Ok((entry.build)(args)?.metrics());
    }
    anyhow::bail!("no loss is registered as '{target}'")
}

/// Register a loss under a `_target_` name: `build(args) -> Result<L>` where `args` deserializes from the
/// `loss:` node and `L: CandleLoss`.
#[macro_export]
macro_rules! register_candle_loss {
    ($target:literal, $build:path) => {
        const _: () = {
            fn __trainyard_build(
                args: &$crate::registry::Value,
            ) -> $crate::registry::Result<::std::boxed::Box<dyn $crate::registry::CandleLoss>> {
                let args = $crate::registry::typed_args(args)?;
                let loss = $build(args)?;
                ::std::result::Result::Ok(::std::boxed::Box::new(loss))
            }
            $crate::registry::inventory::submit! {
                $crate::registry::LossEntry { target: $target, build: __trainyard_build }
            }
        };
    };
}
