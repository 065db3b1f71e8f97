//! Optimizers written in Rust, registered under a `_target_` (`register_optimizer!`): the update rule of
//! one parameter, written once over `RuleTensor` (the element-wise operations trainyard's own SGD and Adam
//! use), so the same rule runs on Candle, on libtorch and on FSDP's flat shards. The config node is what
//! lightning-hydra-template writes for `torch.optim.*` — `{_target_: my_project.Lion, _partial_: true,
//! lr: 1e-4, ...}` — and, as Hydra's partial, it is completed later: trainyard hands the rule each
//! parameter, its gradient and the scheduled rate at every step. `lr` is trainyard's (the schedule's
//! base); the node's other keys are the constructor's arguments.

use super::{Result, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The element-wise operations an optimizer rule is written with, on whatever tensor type an engine keeps
/// its parameters in (Candle's, libtorch's, FSDP's flat shards). A value never aliases its input: the
/// rules build new tensors.
pub trait RuleTensor: Sized {
    /// Another handle on the same values.
    fn duplicate(&self) -> Self;
    /// A copy that owns its values (to keep a gradient or a parameter as state).
    fn owned_copy(&self) -> Result<Self>;
    /// `self * mul + add`.
    fn affine(&self, mul: f64, add: f64) -> Result<Self>;
    fn plus(&self, other: &Self) -> Result<Self>;
    fn minus(&self, other: &Self) -> Result<Self>;
    /// The element-wise product.
    fn times(&self, other: &Self) -> Result<Self>;
    fn divide(&self, other: &Self) -> Result<Self>;
    fn square(&self) -> Result<Self>;
    fn root(&self) -> Result<Self>;
    /// Each value's sign: -1, 0 or 1 (`torch.sign`).
    fn signum(&self) -> Result<Self>;
    /// Each value limited to [-max, max].
    fn clamp_abs(&self, max: f64) -> Result<Self>;
    /// Σ x² (under FSDP: of this rank's slice).
    fn sum_of_squares(&self) -> Result<f64>;
}

/// What one step gives a rule besides the parameter and its gradient.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OptimizerStep {
    /// The scheduled learning rate for this step.
    pub lr: f64,
    /// This step's number, from 1 (Adam's bias correction uses it).
    pub step: u64,
    /// A momentum the schedule cycles (OneCycle), for a rule with momentum to use in place of its own.
    pub momentum: Option<f64>,
}

/// One parameter's optimizer state: named slots (`exp_avg`, ...) saved in checkpoints as
/// `optimizer.<param>.<slot>`, sharded with the parameter under FSDP. A slot's value must be a tensor of
/// the parameter's shape, element-wise in it (FSDP keeps each rank's slice of it).
pub struct ParamState<'a, T> {
    param: &'a str,
    slots: &'a [&'static str],
    target: &'a str,
    state: &'a mut BTreeMap<String, T>,
}

impl<'a, T> ParamState<'a, T> {
    pub(crate) fn new(
        param: &'a str,
        slots: &'a [&'static str],
        target: &'a str,
        state: &'a mut BTreeMap<String, T>,
    ) -> Self {
        ParamState {
            param,
            slots,
            target,
            state,
        }
    }

    /// The parameter's name (`layers.0.weight`).
    pub fn param(&self) -> &str {
        self.param
    }

    /// The slot's value from the previous step, `None` on the first.
    pub fn get(&self, slot: &str) -> Option<&T> {
        self.state.get(&format!("{}.{slot}", self.param))
    }

    /// Run `rule` over this parameter's slots as another tensor type: `to` converts the slots set so far,
    /// `back` the slots the rule sets (for an engine that keeps state in a type the rule does not run on).
    #[doc(hidden)]
    pub fn converted<U, X>(
        &mut self,
        to: impl Fn(&T) -> Result<U>,
        back: impl Fn(U) -> Result<T>,
        rule: impl FnOnce(&mut ParamState<'_, U>) -> Result<X>,
    ) -> Result<X> {
        let mut mine: BTreeMap<String, U> = BTreeMap::new();
        for slot in self.slots {
            let key = format!("{}.{slot}", self.param);
            if let Some(v) = self.state.get(&key) {
                mine.insert(key, to(v)?);
            }
        }
        let out = rule(&mut ParamState::new(
            self.param,
            self.slots,
            self.target,
            &mut mine,
        ))?;
        for (key, v) in mine {
            self.state.insert(key, back(v)?);
        }
        Ok(out)
    }

    /// Keep `value` as the slot's value for the next step (and the checkpoints). A parameter's or a
    /// gradient's own handle must be copied first (`owned_copy`): engines reuse those buffers.
    pub fn set(&mut self, slot: &str, value: T) -> Result<()> {
        anyhow::ensure!(
            self.slots.contains(&slot),
            "optimizer _target_ {}: its rule set the state slot '{slot}', which its slots() does not list \
             ({:?}); list every slot, so checkpoints and FSDP keep it",
            self.target,
            self.slots
        );
        self.state.insert(format!("{}.{slot}", self.param), value);
        Ok(())
    }
}

/// An optimizer's update rule for one parameter: the new value of `p` from its gradient, its state and
/// the step. Generic over the tensor type, so one rule serves every engine and the sharded strategy.
pub trait OptimizerRule: Send + Sync + 'static {
    /// The state slots it keeps per parameter (for checkpoints and FSDP's shards).
    fn slots(&self) -> Vec<&'static str>;
    fn update<T: RuleTensor>(
        &self,
        p: &T,
        grad: &T,
        state: &mut ParamState<'_, T>,
        step: &OptimizerStep,
    ) -> Result<T>;
}

/// A registered rule on each tensor type an engine computes with (what `register_optimizer!` stores; every
/// `OptimizerRule` is one). FSDP's flat shards run it as one of these (`optim::tensors`).
#[doc(hidden)]
pub trait AnyRule: Send + Sync {
    fn slot_names(&self) -> Vec<&'static str>;
    fn on_candle(
        &self,
        p: &candle_core::Tensor,
        grad: &candle_core::Tensor,
        state: &mut ParamState<'_, candle_core::Tensor>,
        step: &OptimizerStep,
    ) -> Result<candle_core::Tensor>;
    #[cfg(feature = "torch")]
    fn on_tch(
        &self,
        p: &tch::Tensor,
        grad: &tch::Tensor,
        state: &mut ParamState<'_, tch::Tensor>,
        step: &OptimizerStep,
    ) -> Result<tch::Tensor>;
}

impl<R: OptimizerRule> AnyRule for R {
    fn slot_names(&self) -> Vec<&'static str> {
        self.slots()
    }
    fn on_candle(
        &self,
        p: &candle_core::Tensor,
        grad: &candle_core::Tensor,
        state: &mut ParamState<'_, candle_core::Tensor>,
        step: &OptimizerStep,
    ) -> Result<candle_core::Tensor> {
        self.update(p, grad, state, step)
    }
    #[cfg(feature = "torch")]
    fn on_tch(
        &self,
        p: &tch::Tensor,
        grad: &tch::Tensor,
        state: &mut ParamState<'_, tch::Tensor>,
        step: &OptimizerStep,
    ) -> Result<tch::Tensor> {
        self.update(p, grad, state, step)
    }
}

/// Builds a rule from its `_target_` node's arguments (see `register_optimizer!`).
pub type OptimizerBuild = fn(&Value) -> Result<Arc<dyn AnyRule>>;

/// One registered optimizer: its `_target_` name and constructor.
pub struct OptimizerEntry {
    pub target: &'static str,
    pub build: OptimizerBuild,
}

entry!(OptimizerEntry);

/// The optimizer registered under `target`.
pub fn optimizer(target: &str) -> Option<&'static OptimizerEntry> {
    super::find(target)
}

/// Every registered optimizer's `_target_`, sorted.
pub fn optimizer_targets() -> Vec<&'static str> {
    super::sorted(super::all::<OptimizerEntry>())
}

/// Register an optimizer under a `_target_` name: `build(args) -> Result<R>` where `args` deserializes
/// from the `optimizer:` node (less `lr`, `_target_`, `_partial_`) and `R: OptimizerRule`.
#[macro_export]
macro_rules! register_optimizer {
    ($target:literal, $build:path) => {
        const _: () = {
            fn __trainyard_build(
                args: &$crate::registry::Value,
            ) -> $crate::registry::Result<::std::sync::Arc<dyn $crate::registry::AnyRule>> {
                let args = $crate::registry::typed_args(args)?;
                let rule = $build(args)?;
                ::std::result::Result::Ok(::std::sync::Arc::new(rule))
            }
            $crate::registry::inventory::submit! {
                $crate::registry::OptimizerEntry { target: $target, build: __trainyard_build }
            }
        };
    };
}
