//! The backend boundary. The trainer loop speaks only `Engine`: feed a batch forward and backward, take an
//! optimizer step at a learning rate, evaluate, and move state in and out as named host tensors (the
//! checkpoint format). Candle is the default engine; tch plugs in behind the same trait (feature `torch`).

pub mod candle;
#[cfg(feature = "torch")]
pub mod torch;
pub mod units;

use crate::data::loader::Batch;
use crate::schema::Experiment;
use crate::tensor::{Flat, FlatHome, StateDict};

/// What one forward pass measured (sums, so batches of different sizes combine exactly).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepStats {
    pub loss_sum: f64,
    pub correct1: u64,
    pub correct5: u64,
    pub count: u64,
}

impl StepStats {
    pub fn add(&mut self, other: &StepStats) {
        self.loss_sum += other.loss_sum;
        self.correct1 += other.correct1;
        self.correct5 += other.correct5;
        self.count += other.count;
    }
    pub fn loss(&self) -> f64 {
        self.loss_sum / self.count.max(1) as f64
    }
    pub fn acc1(&self) -> f64 {
        self.correct1 as f64 / self.count.max(1) as f64
    }
    pub fn acc5(&self) -> f64 {
        self.correct5 as f64 / self.count.max(1) as f64
    }
}

/// Top-1 and top-5 hits for row-major logits `[n, classes]`.
pub fn topk_hits(logits: &[f32], classes: usize, labels: &[u32]) -> (u64, u64) {
    let mut top1 = 0;
    let mut top5 = 0;
    for (row, &label) in logits.chunks(classes).zip(labels) {
        let target = row[label as usize];
        // Rank = how many classes score strictly higher (ties go to the true class, as torch.topk mostly does).
        let rank = row.iter().filter(|&&v| v > target).count();
        top1 += u64::from(rank == 0);
        top5 += u64::from(rank < 5);
    }
    (top1, top5)
}

/// A model with its optimizer, on some device.
pub trait Engine {
    /// Forward and backward on a batch; gradients accumulate (scaled by `grad_scale`) until `optimizer_step`.
    fn forward_backward(&mut self, batch: &Batch, grad_scale: f64) -> anyhow::Result<StepStats>;
    /// Clip (if asked), apply the optimizer at this learning rate/momentum, then clear the gradients.
    /// Returns the gradient norm before clipping; an engine may return NaN when `clip_norm` is `None`
    /// rather than take an extra pass over every gradient (tch does; nothing reads it then).
    fn optimizer_step(
        &mut self,
        lr: f64,
        momentum: Option<f64>,
        clip_norm: Option<f64>,
    ) -> anyhow::Result<f64>;
    /// Forward only, in eval mode.
    fn evaluate(&mut self, batch: &Batch) -> anyhow::Result<StepStats>;
    /// A rank whose share of the validation set is used up while others still evaluate: take part in
    /// whatever collectives evaluating a batch would (FSDP's gathers), so validation shares can be uneven
    /// and every image counted once. Nothing for an engine whose evaluation is local.
    fn evaluate_idle(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
    /// Weights, buffers and optimizer state.
    fn state_dict(&self) -> anyhow::Result<StateDict>;
    /// Restore what `state_dict` returned (optimizer entries optional: weights alone load too).
    fn load_state_dict(&mut self, state: &StateDict) -> anyhow::Result<()>;
    /// Start from published weights (torchvision/timm names): every parameter and buffer must be present
    /// with its shape, except the classifier head, which is kept freshly initialised when its shape differs
    /// (a different `num_classes`). Returns the names that were not loaded.
    fn load_pretrained(&mut self, state: &StateDict) -> anyhow::Result<Vec<String>>;
    /// Trainable parameter count.
    fn num_parameters(&self) -> usize;
    /// The loss scale of dynamic loss scaling (`16-mixed`), when the engine uses one.
    fn loss_scale(&self) -> Option<f64> {
        None
    }
    /// `16-mixed` under a sharded strategy, which unscales its own gradient slices: once every rank agrees
    /// whether any of them overflowed, advance the loss scale as the engine's own step would have
    /// (PyTorch's ShardedGradScaler.update).
    fn update_loss_scale(&mut self, _found_inf: bool) -> anyhow::Result<()> {
        anyhow::bail!("this engine has no dynamic loss scaler (trainer.precision is not 16-mixed)")
    }
    /// Model replicas this engine trains in this process (DataParallel's devices; 1 otherwise).
    fn replicas(&self) -> usize {
        1
    }
    /// DDP: the next `forward_backward` ends an accumulation window. An engine that can average gradients
    /// during its backward pass (tch over a c10d group) arms that here and returns true; the following
    /// `all_reduce_gradients` then only checks that the reduction finished. Every rank calls it at the
    /// same point (the first armed pass may rebuild buckets with a collective).
    fn arm_gradient_sync(
        &mut self,
        _comm: &dyn crate::comm::collective::Collective,
        _sync: &crate::strategy::ddp::GradSync,
    ) -> anyhow::Result<bool> {
        Ok(false)
    }
    /// Data parallel: replace the accumulated gradients by their mean over all ranks (before
    /// `optimizer_step`), in buckets. A parameter without a gradient is an error unless
    /// `sync.find_unused_parameters`, which makes it zero.
    fn all_reduce_gradients(
        &mut self,
        comm: &dyn crate::comm::collective::Collective,
        sync: &crate::strategy::ddp::GradSync,
    ) -> anyhow::Result<()>;

    // What sharded data parallel (`strategy::fsdp`) needs: the engine computes, the strategy owns the
    // parameters between steps.

    /// Trainable parameters by name, with their shapes, in name order.
    fn parameter_shapes(&self) -> Vec<(String, Vec<usize>)>;
    /// Where sharded data parallel keeps this engine's flat slices: on its device, so the collectives
    /// and the sharded optimizer never leave it.
    fn flat_home(&self) -> FlatHome {
        FlatHome::Host
    }
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
    /// Move the accumulated gradients out, flat in layout order (zero where a parameter got none; in
    /// `flat_home`), and clear them. Also returns the names that had no gradient.
    fn take_gradients(
        &mut self,
        layout: &[(String, Vec<usize>)],
    ) -> anyhow::Result<(Flat, Vec<String>)>;
    /// Bytes of parameters, gradients and optimizer state this rank keeps for training (what sharding
    /// divides), as of now.
    fn state_bytes(&self) -> StateBytes;
    /// Is `state_dict` a collective (every rank must call it, at the same point)? True for a sharded
    /// model consolidated for a full checkpoint.
    fn state_dict_is_collective(&self) -> bool {
        false
    }
    /// FSDP units (`backend::units`): the model's stages with their parameters, from the current
    /// parameter shapes (so ask while the parameters are whole). Default: the whole model is one unit.
    fn units(&self) -> anyhow::Result<crate::model::stages::StageLayouts> {
        Ok(vec![self.parameter_shapes()])
    }
    /// A training forward and backward unit by unit (`FULL_SHARD`): each unit's parameters come from
    /// `exchange` when needed and its gradient goes back to it; nothing accumulates in the engine.
    fn forward_backward_by_unit(
        &mut self,
        _batch: &Batch,
        _grad_scale: f64,
        _exchange: &mut dyn units::UnitExchange,
    ) -> anyhow::Result<StepStats> {
        anyhow::bail!("this engine cannot compute unit by unit (FSDP FULL_SHARD)")
    }
    /// An evaluation forward pass unit by unit.
    fn evaluate_by_unit(
        &mut self,
        _batch: &Batch,
        _exchange: &mut dyn units::UnitExchange,
    ) -> anyhow::Result<StepStats> {
        anyhow::bail!("this engine cannot compute unit by unit (FSDP FULL_SHARD)")
    }
}

/// Per-rank training memory, by kind (the numbers FSDP's sharding cuts).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StateBytes {
    pub parameters: u64,
    pub gradients: u64,
    pub optimizer_state: u64,
    /// The most parameter bytes held whole at once while computing: all of them, except under FSDP,
    /// which gathers one unit at a time (`FULL_SHARD`) or the model only while it computes.
    #[serde(default)]
    pub unsharded_peak: u64,
}

impl StateBytes {
    pub fn total(&self) -> u64 {
        self.parameters + self.gradients + self.optimizer_state
    }
}

/// Build the engine the experiment asks for, on this process's device.
pub fn build(exp: &Experiment) -> anyhow::Result<Box<dyn Engine>> {
    Ok(build_replica(exp, crate::comm::local_device_index())?)
}

/// Build the engine on CUDA device `device_index` when the run is on CUDA (DataParallel puts replica r on
/// cuda:r); `Send`, so replicas can run in threads of their own.
pub fn build_replica(
    exp: &Experiment,
    device_index: usize,
) -> anyhow::Result<Box<dyn Engine + Send>> {
    let _ = device_index; // Candle runs on the CPU only
    match exp.backend {
        crate::schema::Backend::Candle => Ok(Box::new(candle::CandleEngine::new(exp)?)),
        #[cfg(feature = "torch")]
        crate::schema::Backend::Tch => Ok(Box::new(torch::TchEngine::on_device(
            exp,
            device_index,
        )?)),
        #[cfg(not(feature = "torch"))]
        crate::schema::Backend::Tch => anyhow::bail!(
            "backend=tch needs a build with the `torch` feature (libtorch); this build has only candle.\n    \
             Use backend=candle, or rebuild with --features torch"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topk_counts() {
        let logits = [0.1, 0.9, 0.0, 0.5, 0.2, 0.3];
        assert_eq!(topk_hits(&logits, 3, &[1, 0]), (2, 2));
        assert_eq!(topk_hits(&logits, 3, &[0, 1]), (0, 2));
    }
}
