//! What the strategies need from a communication library, in one trait: reductions, broadcast,
//! all-gather, reduce-scatter and a barrier over host buffers (any backend), plus, with the `torch`
//! feature, the c10d process group itself so the tch engine can reduce its tensors in place. Between
//! processes the implementation is c10d's (`comm::c10d`): collectives are PyTorch's own, never home-made.
//! Between the threads of one process (DataParallel's replicas) it is `comm::local`, which moves nothing
//! over a network.

use crate::backend::{Engine, StepStats};
use crate::tensor::{HostTensor, StateDict};

/// Reduction of a collective (values match the shim's codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum ReduceOp {
    Sum = 0,
    Max = 1,
    Min = 2,
}

pub trait Collective: Send + Sync {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// Reduce `data` in place across ranks; every rank ends with the result.
    fn all_reduce_f32(&self, data: &mut [f32], op: ReduceOp) -> anyhow::Result<()>;
    fn all_reduce_f64(&self, data: &mut [f64], op: ReduceOp) -> anyhow::Result<()>;
    /// Overwrite `data` on every rank with `root`'s.
    fn broadcast_f32(&self, data: &mut [f32], root: usize) -> anyhow::Result<()>;
    fn barrier(&self) -> anyhow::Result<()>;
    /// `output` (world × `input.len()`) receives every rank's `input`, in rank order. The default goes
    /// through `all_reduce_f32` (each rank fills its own slot of zeros); c10d has its own.
    fn all_gather_f32(&self, input: &[f32], output: &mut [f32]) -> anyhow::Result<()> {
        let n = input.len();
        anyhow::ensure!(
            output.len() == n * self.world_size(),
            "all_gather: output holds {} values, expected {} ranks × {n}",
            output.len(),
            self.world_size()
        );
        output.fill(0.0);
        output[self.rank() * n..(self.rank() + 1) * n].copy_from_slice(input);
        self.all_reduce_f32(output, ReduceOp::Sum)
    }
    /// `input` (world × `output.len()`) is summed across ranks; this rank keeps its chunk in `output`.
    fn reduce_scatter_f32(&self, input: &mut [f32], output: &mut [f32]) -> anyhow::Result<()> {
        let n = output.len();
        anyhow::ensure!(
            input.len() == n * self.world_size(),
            "reduce_scatter: input holds {} values, expected {} ranks × {n}",
            input.len(),
            self.world_size()
        );
        self.all_reduce_f32(input, ReduceOp::Sum)?;
        output.copy_from_slice(&input[self.rank() * n..(self.rank() + 1) * n]);
        Ok(())
    }
    /// The c10d group under this collective, for engines that pass their tensors without host copies.
    #[cfg(feature = "torch")]
    fn process_group(&self) -> Option<&super::c10d::ProcessGroup> {
        None
    }
    /// Are the ranks threads of this process that average libtorch tensors where they are
    /// (`mean_in_process`: DataParallel's replicas)?
    #[cfg(feature = "torch")]
    fn averages_tensors_in_process(&self) -> bool {
        false
    }
    /// The mean of `tensor` over those ranks in f32, device to device: one tensor on rank 0's device
    /// that every rank reads (and none may write). Rank 0's `tensor`, when f32, becomes it.
    #[cfg(feature = "torch")]
    fn mean_in_process(&self, _tensor: &tch::Tensor) -> anyhow::Result<tch::Tensor> {
        anyhow::bail!("this group's ranks are processes: its tensors go through the process group")
    }
}

/// Step statistics summed over ranks: every rank then reports the global loss and accuracy
/// (Lightning's `sync_dist=True`).
pub fn sum_stats(comm: &dyn Collective, stats: &StepStats) -> anyhow::Result<StepStats> {
    let mut v = [
        stats.loss_sum,
        stats.correct1 as f64,
        stats.correct5 as f64,
        stats.count as f64,
    ];
    comm.all_reduce_f64(&mut v, ReduceOp::Sum)?;
    Ok(StepStats {
        loss_sum: v[0],
        correct1: v[1].round() as u64,
        correct5: v[2].round() as u64,
        count: v[3].round() as u64,
    })
}

/// Does any rank say yes? (A stop decision taken on one rank's clock must be taken by all.)
pub fn any(comm: &dyn Collective, flag: bool) -> anyhow::Result<bool> {
    let mut v = [f64::from(u8::from(flag))];
    comm.all_reduce_f64(&mut v, ReduceOp::Max)?;
    Ok(v[0] > 0.0)
}

/// Make every rank's model (weights, buffers, optimizer state) rank 0's, as DDP does when it wraps a
/// module. The keys must agree across ranks; their sizes are checked first so a mismatch is an error, not
/// a scrambled model.
pub fn broadcast_state(comm: &dyn Collective, engine: &mut dyn Engine) -> anyhow::Result<()> {
    let state = engine.state_dict()?;
    let total: usize = state.values().map(HostTensor::numel).sum();
    let mut sizes = [total as f64, state.len() as f64];
    let mut lowest = sizes;
    comm.all_reduce_f64(&mut sizes, ReduceOp::Max)?;
    comm.all_reduce_f64(&mut lowest, ReduceOp::Min)?;
    anyhow::ensure!(
        sizes == lowest,
        "ranks hold different models ({} to {} tensors, {} to {} values): every rank must run the same config",
        lowest[1],
        sizes[1],
        lowest[0],
        sizes[0]
    );
    let mut flat: Vec<f32> = Vec::with_capacity(total);
    for t in state.values() {
        flat.extend_from_slice(&t.data);
    }
    comm.broadcast_f32(&mut flat, 0)?;
    let mut out = StateDict::new();
    let mut at = 0;
    for (name, t) in state {
        let n = t.numel();
        out.insert(
            name,
            HostTensor {
                shape: t.shape,
                data: flat[at..at + n].to_vec(),
            },
        );
        at += n;
    }
    engine.load_state_dict(&out)
}
