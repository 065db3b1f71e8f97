//! How replicas, gradients, parameters and optimizer state are placed and kept in step (Lightning's
//! `strategies/`, burn-train's learner strategies). A `Strategy` owns its engine(s) and the collectives
//! over its ranks; it makes the rank-zero decisions, gives the sampler its share, combines gradients and
//! writes checkpoints. The training loop (`trainer`) is the same for every strategy and speaks only this
//! trait:
//! - `single`: one engine on one device;
//! - `dp`: DataParallel, replicas in threads of one process, the batch scattered among them;
//! - `ddp`: one process per device, gradients averaged in buckets (during the backward pass where the
//!   engine offers it, `backend::BackwardOverlap`);
//! - `fsdp`: parameters, gradients and optimizer state sharded across ranks unit by unit.
//!
//! A strategy uses engines (`backend`) and the communication layer (`comm`); neither knows strategies.

pub mod ddp;
pub mod dp;
pub mod fsdp;
pub mod scatter;
pub mod single;

use crate::backend::{Engine, PendingStats, StateBytes, StepStats};
use crate::comm::collective::{Collective, ReduceOp};
use crate::comm::Distributed;
use crate::data::loader::{Batch, StageBatch};
use crate::optim::GradClip;
use crate::plan::RunPlan;
use crate::schema::Experiment;
use crate::storage::checkpoint::TrainingState;
use crate::tensor::{HostTensor, StateDict};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A way of training one model on one or more devices.
pub trait Strategy {
    /// This process among the run's ranks, and the collectives over them.
    fn ranks(&self) -> &Ranks;
    /// Model replicas this process trains (DataParallel's devices; 1 otherwise).
    fn replicas(&self) -> usize {
        1
    }
    /// Before the first step, once pretrained weights and a checkpoint are loaded: make every rank start
    /// from the same state (DDP broadcasts rank 0's, as it does when it wraps a module).
    fn start(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
    /// Forward and backward on this process's batch; `ends_window`: the last micro-batch before an
    /// optimizer step (DDP averages the gradients of that backward pass where it can).
    fn forward_backward(
        &mut self,
        batch: &Batch,
        grad_scale: f64,
        ends_window: bool,
    ) -> anyhow::Result<StepStats>;
    /// `forward_backward`, its statistics read when the loop asks (`Engine::forward_backward_queued`):
    /// after the optimizer step when this batch ends the window.
    fn forward_backward_queued(
        &mut self,
        batch: &Batch,
        grad_scale: f64,
        ends_window: bool,
    ) -> anyhow::Result<PendingStats> {
        self.forward_backward(batch, grad_scale, ends_window)
            .map(PendingStats::ready)
    }
    /// Combine the accumulated gradients over replicas and ranks, clip, and step the optimizer. Returns
    /// the gradient norm before clipping (NaN when it was not computed, infinity for a skipped
    /// `16-mixed` step).
    fn optimizer_step(
        &mut self,
        lr: f64,
        momentum: Option<f64>,
        clip: Option<GradClip>,
    ) -> anyhow::Result<f64>;
    /// The staging the loader should do for this strategy's engine (`Engine::batch_stager`); none when
    /// the strategy splits batches (DataParallel), since a split batch is no longer the staged one.
    fn batch_stager(&self) -> Option<Arc<dyn StageBatch>> {
        None
    }
    /// Before a validation pass (DDP: every rank takes rank 0's BatchNorm buffers).
    fn before_validation(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
    /// The engine that holds this rank's model as checkpoints and statistics see it (DataParallel: replica
    /// 0). The methods below default to it; a strategy whose state is not that engine's alone (FSDP's
    /// shards, DataParallel's other replicas) overrides them.
    fn engine(&self) -> &dyn Engine;
    /// `engine`, to change.
    fn engine_mut(&mut self) -> &mut dyn Engine;
    /// Forward only, in eval mode, on this process's batch.
    /// The model's outputs of the last forward pass on the host (`Engine::take_outputs`), this rank's
    /// batch whole: stateful metrics' input.
    fn take_outputs(&mut self) -> anyhow::Result<Option<HostTensor>> {
        self.engine_mut().take_outputs()
    }
    fn evaluate(&mut self, batch: &Batch) -> anyhow::Result<StepStats> {
        self.engine_mut().evaluate(batch)
    }
    /// This rank's share of the validation set is used up while others still evaluate: take part in the
    /// collectives evaluating a batch would make (FSDP's gathers), so shares can be uneven and every image
    /// counted once.
    fn evaluate_idle(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
    /// Weights, buffers and optimizer state as this rank's checkpoint holds them (FSDP: consolidated, a
    /// collective, or this rank's slices).
    fn state_dict(&self) -> anyhow::Result<StateDict> {
        self.engine().state_dict()
    }
    /// Restore what `state_dict` gave (from a checkpoint of the same strategy and world size, or a full one).
    fn load_state_dict(&mut self, state: &StateDict) -> anyhow::Result<()> {
        self.engine_mut().load_state_dict(state)
    }
    /// Start from published weights (`backend::load_pretrained`; `head`: the classifier's module names);
    /// every rank reads the same file.
    fn load_pretrained(
        &mut self,
        published: &StateDict,
        head: &[String],
    ) -> anyhow::Result<Vec<String>> {
        crate::backend::load_pretrained(self.engine_mut(), published, head)
    }
    /// The name of the file that holds this rank's state in the checkpoint named `name`: `name` itself,
    /// or under FSDP's sharded checkpoints this rank's part beside it. Resuming reads it.
    fn checkpoint_file(&self, name: &str) -> String {
        name.to_string()
    }
    /// Write this rank's part of the checkpoint at `path` and return the file written, if this rank wrote
    /// one (rank 0 writes the whole model unless the strategy shards it). Every rank calls it at the same
    /// point: consolidating a sharded model is a collective.
    fn save_checkpoint(
        &mut self,
        path: &Path,
        training: &TrainingState,
        config_yaml: &str,
    ) -> anyhow::Result<Option<PathBuf>> {
        if !self.ranks().is_global_zero() {
            return Ok(None);
        }
        crate::storage::checkpoint::save(path, &self.state_dict()?, training, config_yaml)?;
        Ok(Some(path.to_path_buf()))
    }
    /// The dynamic loss scale (`16-mixed`), when there is one.
    fn loss_scale(&mut self) -> Option<f64> {
        self.engine_mut().loss_scaler().and_then(|s| s.scale().ok())
    }
    /// Trainable parameter count of the model.
    fn num_parameters(&self) -> usize {
        crate::backend::num_parameters(self.engine())
    }
    /// Parameter, gradient and optimizer-state bytes this rank keeps for training (what sharding divides).
    fn state_bytes(&self) -> StateBytes {
        self.engine().state_bytes()
    }
}

/// This process's place among the ranks of a run and the collectives over them: what the training loop
/// needs for rank-zero decisions, sampler shares and metrics summed over ranks.
#[derive(Clone)]
pub struct Ranks {
    pub rank: usize,
    pub world_size: usize,
    pub num_nodes: usize,
    comm: Option<Arc<dyn Collective>>,
}

impl Ranks {
    /// One process alone.
    pub fn single() -> Ranks {
        Ranks {
            rank: 0,
            world_size: 1,
            num_nodes: 1,
            comm: None,
        }
    }

    /// The ranks of `group`.
    pub fn of(group: &Distributed) -> Ranks {
        Ranks {
            rank: group.rank,
            world_size: group.world_size,
            num_nodes: group.num_nodes,
            comm: Some(group.comm.clone()),
        }
    }

    /// The ranks of the group `comm` reaches (one node).
    pub fn over(comm: Arc<dyn Collective>) -> Ranks {
        Ranks {
            rank: comm.rank(),
            world_size: comm.world_size(),
            num_nodes: 1,
            comm: Some(comm),
        }
    }

    /// Rank 0 writes the run's logs, records and (whole) checkpoints.
    pub fn is_global_zero(&self) -> bool {
        self.rank == 0
    }

    /// The collectives over the ranks, in a run of several processes.
    pub fn comm(&self) -> Option<&dyn Collective> {
        self.comm.as_deref()
    }

    /// The same, shared (for what keeps it, such as SyncBatchNorm).
    pub fn shared_comm(&self) -> Option<Arc<dyn Collective>> {
        self.comm.clone()
    }

    /// Step statistics summed over ranks: every rank then reports the global loss and accuracy
    /// (Lightning's `sync_dist=True`).
    pub fn sum_stats(&self, stats: StepStats) -> anyhow::Result<StepStats> {
        let Some(comm) = self.comm() else {
            return Ok(stats);
        };
        let mut v = vec![
            stats.loss_sum,
            stats.correct1 as f64,
            stats.correct5 as f64,
            stats.count as f64,
        ];
        v.extend(stats.metric_sums);
        comm.all_reduce_f64(&mut v, ReduceOp::Sum)?;
        let mut metric_sums = [0.0; crate::backend::MAX_METRICS];
        metric_sums.copy_from_slice(&v[4..]);
        Ok(StepStats {
            loss_sum: v[0],
            correct1: v[1].round() as u64,
            correct5: v[2].round() as u64,
            count: v[3].round() as u64,
            metric_sums,
        })
    }

    /// `values` summed over ranks, in place.
    pub fn sum(&self, values: &mut [f64]) -> anyhow::Result<()> {
        match self.comm() {
            Some(comm) => comm.all_reduce_f64(values, ReduceOp::Sum),
            None => Ok(()),
        }
    }

    /// Does any rank say yes? A decision taken on one rank's clock (the Timer) is taken by all, at the
    /// same step, so none is left waiting in a collective.
    pub fn any(&self, flag: bool) -> anyhow::Result<bool> {
        match self.comm() {
            Some(comm) => crate::comm::collective::any(comm, flag),
            None => Ok(flag),
        }
    }

    /// Wait until every rank gets here.
    pub fn barrier(&self) -> anyhow::Result<()> {
        match self.comm() {
            Some(comm) => comm.barrier(),
            None => Ok(()),
        }
    }
}

/// The strategy `trainer.strategy` names, built with its engines as `plan` places them; `group`: this
/// process's process group (DDP and FSDP run as its ranks).
pub fn build(
    exp: &Experiment,
    plan: &RunPlan,
    group: Option<Distributed>,
) -> anyhow::Result<Box<dyn Strategy>> {
    use crate::schema::Strategy as Kind;
    let needs_group = |group: Option<Distributed>| {
        group.ok_or_else(|| {
            anyhow::anyhow!(
                "trainer.strategy={} runs as the ranks of a process group: start it with `train` (which \
                 launches the ranks) or under torchrun/srun",
                exp.trainer.strategy
            )
        })
    };
    Ok(match exp.trainer.strategy {
        Kind::Single => Box::new(single::Single::new(exp)?),
        Kind::Dp => Box::new(dp::DataParallel::build(exp, plan.devices_per_node)?),
        Kind::Ddp => Box::new(ddp::Ddp::new(exp, needs_group(group)?)?),
        Kind::Fsdp => Box::new(fsdp::Fsdp::build(exp, needs_group(group)?)?),
    })
}
