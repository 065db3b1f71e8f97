//! What only some engines can do, offered through `Engine::sharding`, `Engine::overlap` and
//! `Engine::loss_scaler` rather than as methods every engine must stub: a strategy asks, and an engine
//! that cannot is refused by the run plan before anything runs.

use super::units::UnitExchange;
use super::StepStats;
use crate::comm::buckets::GradSync;
use crate::comm::collective::Collective;
use crate::data::loader::Batch;
use crate::model::stages::StageLayouts;
use crate::tensor::{Flat, FlatHome};

/// What sharded data parallel (`strategy::fsdp`) needs of an engine: the strategy owns the parameters
/// between steps, the engine computes with what it is given.
pub trait Sharding {
    /// Where the strategy keeps this engine's flat slices: on its device (f32), so the collectives and
    /// the sharded optimizer never leave it.
    fn flat_home(&self) -> FlatHome;
    /// The model's stages with their parameters, from the current parameter shapes (ask while the
    /// parameters are whole).
    fn stage_layouts(&self) -> anyhow::Result<StageLayouts>;
    /// Give the parameters in `layout` these values (`flat`, concatenated in layout order), as fresh
    /// tensors: a parameter released by `release_parameters` comes back.
    fn set_parameters(
        &mut self,
        layout: &[(String, Vec<usize>)],
        flat: &Flat,
    ) -> anyhow::Result<()>;
    /// Free the parameters' (and their gradients') storage until the next `set_parameters`: between
    /// steps a sharded rank holds only its shard.
    fn release_parameters(&mut self) -> anyhow::Result<()>;
    /// A training forward and backward unit by unit (`FULL_SHARD`): each unit's parameters come from
    /// `exchange` when needed and its gradient goes back to it; nothing accumulates in the engine.
    fn forward_backward_by_unit(
        &mut self,
        batch: &Batch,
        grad_scale: f64,
        exchange: &mut dyn UnitExchange,
    ) -> anyhow::Result<StepStats>;
    /// An evaluation forward pass unit by unit.
    fn evaluate_by_unit(
        &mut self,
        batch: &Batch,
        exchange: &mut dyn UnitExchange,
    ) -> anyhow::Result<StepStats>;
}

/// DDP's gradient averaging during the backward pass (libtorch's reducer over a c10d group), armed for
/// the backward pass that ends an accumulation window.
pub trait BackwardOverlap {
    /// Arm the next forward and backward pass to average the gradients over `group`, bucket by bucket
    /// as they become ready. False when this group cannot (it is not a c10d group); every rank calls it
    /// at the same point (the first armed pass may rebuild buckets with a collective).
    fn arm(&mut self, group: &dyn Collective, sync: &GradSync) -> anyhow::Result<bool>;
    /// Did the last backward pass average the gradients? If so, every bucket is confirmed finished.
    fn take_reduced(&mut self) -> anyhow::Result<bool>;
}

/// Dynamic loss scaling (`16-mixed`, PyTorch's GradScaler): the engine scales the loss in its backward
/// pass and unscales in its optimizer step; a sharded strategy, which steps the slices itself, unscales
/// with `scale` and reports the ranks' verdict to `update`.
pub trait LossScaler {
    fn scale(&self) -> anyhow::Result<f64>;
    /// After a step: back off when the gradients overflowed (the step was skipped), grow after enough
    /// clean steps.
    fn update(&mut self, found_inf: bool) -> anyhow::Result<()>;
}
