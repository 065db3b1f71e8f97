//! What strategies need from a communication library, in one trait: reductions, broadcast, all-gather,
//! reduce-scatter and a barrier, over host buffers and over `Flat` vectors (host or device: gradient
//! buckets, FSDP slices). Between processes the implementation is c10d's (`comm::c10d`): collectives are
//! PyTorch's own, never home-made, and device tensors stay on their device (NCCL for CUDA). Between the
//! threads of one process (DataParallel's replicas) it is `comm::local`, which moves nothing over a network.
//! The `Flat` collectives have host-memory defaults; an implementation that can do better overrides them.

use crate::tensor::{Flat, HostTensor, StateDict};

/// Reduction of a collective (values match the shim's codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum ReduceOp {
    Sum = 0,
    Max = 1,
    Min = 2,
}

/// A group of ranks that reduce, gather and broadcast together. Every rank must make the same calls in
/// the same order. `Any`: an engine that can hand its tensors to the library itself (libtorch's DDP
/// reducer, SyncBatchNorm) asks whether the group is a c10d one (`c10d::ProcessGroup::of`).
pub trait Collective: std::any::Any + Send + Sync {
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
    /// Every rank's `shard`, in rank order (world × its length), where `shard` lives.
    fn gather_flat(&self, shard: &Flat) -> anyhow::Result<Flat> {
        through_host::gather(self, shard)
    }
    /// `full` (world × n values) summed across ranks; this rank's chunk of n, where `full` lived.
    fn reduce_scatter_flat(&self, full: Flat) -> anyhow::Result<Flat> {
        through_host::reduce_scatter(self, full)
    }
    /// `flat` summed across ranks, where it lived.
    fn all_reduce_flat(&self, flat: Flat) -> anyhow::Result<Flat> {
        through_host::all_reduce(self, flat)
    }
    /// The mean over ranks of each buffer (DDP's buckets). An implementation may keep every buffer in
    /// flight at once, and the means may share storage with the inputs or with other ranks' means: read
    /// them, never write into them.
    fn average_flats(&self, flats: Vec<Flat>) -> anyhow::Result<Vec<Flat>> {
        flats
            .into_iter()
            .map(|f| through_host::average(self, f))
            .collect()
    }
}

/// The `Flat` collectives through host memory and the host-buffer collectives: what every group can do.
pub mod through_host {
    use super::{Collective, ReduceOp};
    use crate::tensor::Flat;

    pub fn gather<C: Collective + ?Sized>(comm: &C, shard: &Flat) -> anyhow::Result<Flat> {
        let mut full = vec![0.0; shard.len() * comm.world_size()];
        comm.all_gather_f32(&shard.host_values()?, &mut full)?;
        shard.home().place(full)
    }

    pub fn reduce_scatter<C: Collective + ?Sized>(comm: &C, full: Flat) -> anyhow::Result<Flat> {
        let world = comm.world_size();
        anyhow::ensure!(
            full.len().is_multiple_of(world),
            "reduce_scatter: {} values do not split into {world} equal chunks",
            full.len()
        );
        let home = full.home();
        let mut input = full.into_host()?;
        let mut mine = vec![0.0f32; input.len() / world];
        comm.reduce_scatter_f32(&mut input, &mut mine)?;
        home.place(mine)
    }

    pub fn all_reduce<C: Collective + ?Sized>(comm: &C, flat: Flat) -> anyhow::Result<Flat> {
        let home = flat.home();
        let mut values = flat.into_host()?;
        comm.all_reduce_f32(&mut values, ReduceOp::Sum)?;
        home.place(values)
    }

    pub fn average<C: Collective + ?Sized>(comm: &C, flat: Flat) -> anyhow::Result<Flat> {
        let mut sum = all_reduce(comm, flat)?;
        sum.divide_in_place(comm.world_size() as f64)?;
        Ok(sum)
    }
}

/// Does any rank say yes? (A stop decision taken on one rank's clock must be taken by all.)
pub fn any(comm: &dyn Collective, flag: bool) -> anyhow::Result<bool> {
    let mut v = [f64::from(u8::from(flag))];
    comm.all_reduce_f64(&mut v, ReduceOp::Max)?;
    Ok(v[0] > 0.0)
}

/// Rank 0's `state` on every rank (weights, buffers, optimizer state), as DDP makes every replica rank 0's
/// when it wraps a module. The keys must agree across ranks; their sizes are checked first so a mismatch
/// is an error, not a scrambled model.
pub fn broadcast_state(comm: &dyn Collective, state: StateDict) -> anyhow::Result<StateDict> {
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
    Ok(out)
}
