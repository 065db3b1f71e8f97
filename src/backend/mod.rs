//! The backend boundary: an `Engine` computes and holds state, a model with its optimizer on one device.
//! It feeds batches forward and backward, hands its accumulated gradients out as values and takes them
//! back, steps its optimizer, and moves its state in and out as named host tensors (the checkpoint
//! format). It does not know how many replicas or ranks there are: a strategy (`crate::strategy`) places
//! engines and combines their gradients. What only some engines can do is an optional capability
//! (`capabilities`): sharding (FSDP), averaging during the backward pass (DDP on libtorch's reducer) and
//! dynamic loss scaling (`16-mixed`). Candle is the default engine; tch plugs in behind the same trait
//! (feature `torch`). Neither imports the other; both read the model zoo from `crate::model`.

pub mod candle;
pub mod capabilities;
#[cfg(feature = "torch")]
pub mod torch;
pub mod units;

use crate::comm::collective::Collective;
use crate::data::loader::{Batch, StageBatch};
use crate::optim::GradClip;
use crate::schema::Experiment;
use crate::tensor::{Flat, FlatHome, HostTensor, StateDict};
pub use capabilities::{BackwardOverlap, LossScaler, Sharding};
use std::sync::Arc;

/// What one forward pass measured (sums, so batches of different sizes combine exactly).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepStats {
    pub loss_sum: f64,
    pub correct1: u64,
    pub correct5: u64,
    pub count: u64,
    /// A registered loss's metrics (`registry::CandleLoss::metrics`, in its order), each summed over
    /// samples (a batch's mean times its size).
    pub metric_sums: [f64; MAX_METRICS],
}

pub use crate::registry::MAX_METRICS;

impl StepStats {
    pub fn add(&mut self, other: &StepStats) {
        self.loss_sum += other.loss_sum;
        self.correct1 += other.correct1;
        self.correct5 += other.correct5;
        self.count += other.count;
        for (sum, more) in self.metric_sums.iter_mut().zip(other.metric_sums) {
            *sum += more;
        }
    }
    /// The mean of a registered loss's `i`th metric.
    pub fn metric(&self, i: usize) -> f64 {
        self.metric_sums[i] / self.count.max(1) as f64
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

/// A batch's statistics, either known or still being computed on a device: reading them makes the host
/// wait for the device, so the loop reads them after it has queued the optimizer step.
pub struct PendingStats(Pending);

enum Pending {
    Ready(StepStats),
    Deferred(Box<dyn FnOnce() -> anyhow::Result<StepStats> + Send>),
}

impl PendingStats {
    pub fn ready(stats: StepStats) -> Self {
        PendingStats(Pending::Ready(stats))
    }
    /// Statistics `read` will fetch when asked.
    pub fn deferred(read: impl FnOnce() -> anyhow::Result<StepStats> + Send + 'static) -> Self {
        PendingStats(Pending::Deferred(Box::new(read)))
    }
    /// The statistics (waiting for the device if they are not known yet).
    pub fn resolve(self) -> anyhow::Result<StepStats> {
        match self.0 {
            Pending::Ready(stats) => Ok(stats),
            Pending::Deferred(read) => read(),
        }
    }
}

/// Top-1 and top-5 hits for row-major logits `[n, classes]`.
pub fn topk_hits(logits: &[f32], classes: usize, labels: &[u32]) -> (u64, u64) {
    let mut top1 = 0;
    let mut top5 = 0;
    for (row, &label) in logits.chunks(classes).zip(labels) {
        let label = label as usize;
        let target = row[label];
        // Rank = how many classes score strictly higher (ties go to the true class, as torch.topk mostly
        // does), a NaN score counting as higher; a NaN for the true class is a miss, so a diverged
        // model's NaN logits are not counted as hits.
        let rank = match target.is_nan() {
            true => classes.max(5),
            false => row.iter().filter(|&&v| v > target || v.is_nan()).count(),
        };
        top1 += u64::from(rank == 0);
        top5 += u64::from(rank < 5);
    }
    (top1, top5)
}

/// A model with its optimizer, on one device.
pub trait Engine: Send {
    /// Forward and backward on a batch; gradients accumulate (scaled by `grad_scale`) until they are
    /// taken or the optimizer steps.
    fn forward_backward(&mut self, batch: &Batch, grad_scale: f64) -> anyhow::Result<StepStats>;
    /// `forward_backward` without waiting to read its statistics: a GPU engine queues the passes and
    /// returns, so the optimizer step is queued behind them before the host waits, and the GPU does not
    /// idle while the host queues the update (as PyTorch's loop reads its loss after `opt.step()`).
    fn forward_backward_queued(
        &mut self,
        batch: &Batch,
        grad_scale: f64,
    ) -> anyhow::Result<PendingStats> {
        self.forward_backward(batch, grad_scale)
            .map(PendingStats::ready)
    }
    /// Forward only, in eval mode.
    fn evaluate(&mut self, batch: &Batch) -> anyhow::Result<StepStats>;
    /// The eval-mode logits `evaluate` scores, on the host (batch x classes): predictions, and the
    /// comparison with PyTorch's own forward of the same weights.
    fn predict(&mut self, batch: &Batch) -> anyhow::Result<HostTensor>;
    /// The model's outputs (logits) of the last forward pass, training or evaluation, moved to the host
    /// once: what stateful metrics (`metrics`) are updated with. `None`: none kept since.
    fn take_outputs(&mut self) -> anyhow::Result<Option<HostTensor>> {
        Ok(None)
    }
    /// Move the accumulated gradients out (the engine then holds none), in the order its backward pass
    /// produces them. A device engine may hand out views of its own gradient storage: writing into them
    /// and putting them back costs no copy.
    fn take_gradients(&mut self) -> anyhow::Result<Gradients>;
    /// Install gradients (those `take_gradients` gave, possibly changed); a parameter whose entry has no
    /// value keeps no gradient, and the optimizer leaves it alone.
    fn put_gradients(&mut self, grads: Gradients) -> anyhow::Result<()>;
    /// Clip (if asked), apply the optimizer at this learning rate/momentum, then clear the gradients.
    /// Returns the gradient norm before clipping; an engine may return NaN when it does not clip by norm
    /// rather than take an extra pass over every gradient (tch does; nothing reads it then), and
    /// infinity for a `16-mixed` step it skipped because the gradients overflowed.
    fn optimizer_step(
        &mut self,
        lr: f64,
        momentum: Option<f64>,
        clip: Option<GradClip>,
    ) -> anyhow::Result<f64>;
    /// Weights, buffers and optimizer state (with the loss scaler's, when there is one).
    fn state_dict(&self) -> anyhow::Result<StateDict>;
    /// Restore what `state_dict` returned (optimizer entries optional: weights alone load too).
    fn load_state_dict(&mut self, state: &StateDict) -> anyhow::Result<()>;
    /// Trainable parameters by name, with their shapes, in name order.
    fn parameter_shapes(&self) -> Vec<(String, Vec<usize>)>;
    /// Bytes of parameters, gradients and optimizer state this engine keeps for training, as of now.
    fn state_bytes(&self) -> StateBytes;
    /// Sharded data parallel's needs (FSDP), when this engine can be sharded.
    fn sharding(&mut self) -> Option<&mut dyn Sharding> {
        None
    }
    /// Gradient averaging during the backward pass (DDP), when this engine can do it.
    fn overlap(&mut self) -> Option<&mut dyn BackwardOverlap> {
        None
    }
    /// The dynamic loss scaler (`16-mixed`), when the engine uses one.
    fn loss_scaler(&mut self) -> Option<&mut dyn LossScaler> {
        None
    }
    /// A copy of each batch the loader's workers should make for this engine (a GPU's page-locked
    /// staging), when it reads such copies faster than `Batch::images`.
    fn batch_stager(&self) -> Option<Arc<dyn StageBatch>> {
        None
    }
}

/// One parameter's accumulated gradient, flat.
pub struct Gradient {
    pub name: String,
    pub numel: usize,
    /// `None`: the parameter took no part in the loss.
    pub value: Option<Flat>,
}

/// The gradients an engine hands out, in the order its backward pass produces them (the last layers
/// first, as DDP's buckets fill), and where a missing one would live (`home`, with the gradients' dtype).
pub struct Gradients {
    pub entries: Vec<Gradient>,
    pub home: FlatHome,
}

impl Gradients {
    /// The names of the parameters without a gradient.
    pub fn missing(&self) -> Vec<String> {
        self.entries
            .iter()
            .filter(|g| g.value.is_none())
            .map(|g| g.name.clone())
            .collect()
    }
}

/// Where an engine runs, as the strategy that builds it decides.
#[derive(Clone, Default)]
pub struct Placement {
    /// The CUDA device index when the run is on CUDA (a worker's local rank; DataParallel's replica).
    pub device_index: usize,
    /// This process works on that one device, which becomes its current CUDA device (as
    /// `torch.cuda.set_device(local_rank)`); DataParallel's replicas share their process and do not.
    pub owns_device: bool,
    /// SyncBatchNorm: BatchNorm layers in training normalise with the statistics of every rank's batch,
    /// reduced over this group.
    pub sync_batchnorm: Option<Arc<dyn Collective>>,
}

impl Placement {
    /// A process of its own on device 0, without SyncBatchNorm: a single-device run.
    pub fn single() -> Placement {
        Placement {
            owns_device: true,
            ..Placement::default()
        }
    }
}

/// Trainable parameter count of `engine`.
pub fn num_parameters(engine: &dyn Engine) -> usize {
    engine
        .parameter_shapes()
        .iter()
        .map(|(_, s)| s.iter().product::<usize>())
        .sum()
}

/// Start `engine` from published weights (torchvision/timm names): every parameter and buffer must be
/// present with its shape, except the classifier head, which is kept freshly initialised when its shape
/// differs (a different `num_classes`; `model::pretrained`; `head`: its module names, from
/// `Architecture::head`). Returns the names that were not loaded.
pub fn load_pretrained(
    engine: &mut dyn Engine,
    published: &StateDict,
    head: &[String],
) -> anyhow::Result<Vec<String>> {
    let mut state = engine.state_dict()?;
    let params: std::collections::BTreeSet<String> = engine
        .parameter_shapes()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    let slots: Vec<crate::model::pretrained::Slot> = state
        .iter()
        .filter(|(name, _)| !name.starts_with("optimizer."))
        .map(|(name, t)| crate::model::pretrained::Slot {
            name,
            shape: t.shape.clone(),
            trainable: params.contains(name.as_str()),
        })
        .collect();
    let crate::model::pretrained::PretrainedPlan { set, kept } =
        crate::model::pretrained::plan_pretrained(&slots, published, head)?;
    state.extend(set);
    engine.load_state_dict(&state)?;
    Ok(kept)
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

/// Build the engine the experiment asks for, placed as `placement` says.
pub fn build(exp: &Experiment, placement: &Placement) -> anyhow::Result<Box<dyn Engine>> {
    match exp.backend {
        crate::schema::Backend::Candle => Ok(Box::new(candle::CandleEngine::placed(exp, placement)?)),
        #[cfg(feature = "torch")]
        crate::schema::Backend::Tch => Ok(Box::new(torch::TchEngine::placed(exp, placement)?)),
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
        // NaN logits (a diverged model) are never hits.
        let nan = [f32::NAN; 6];
        assert_eq!(topk_hits(&nan, 3, &[1, 0]), (0, 0));
        let one_nan = [0.1, f32::NAN, 0.0];
        assert_eq!(topk_hits(&one_nan, 3, &[0]), (0, 1));
    }
}
