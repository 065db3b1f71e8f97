//! DistributedDataParallel's contract: every rank starts from rank 0's model (broadcast), trains on its own
//! shard of each batch, and before every optimizer step the gradients are averaged across ranks, bucket by
//! bucket (`trainer.ddp.bucket_cap_mb`), so every rank takes the same step. Where the engine can (tch on a
//! c10d group: `comm::reducer`), each bucket is reduced during the backward pass as soon as it is ready;
//! otherwise (Candle, which has no autograd hooks) after it, with the helpers here. A parameter that got no gradient
//! is an error unless `find_unused_parameters` is set (then it counts as zero), as in PyTorch.

use crate::comm::collective::{Collective, ReduceOp};
use crate::schema::Experiment;

/// The gradient-averaging settings of `trainer.ddp`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradSync {
    pub bucket_cap_bytes: usize,
    pub find_unused_parameters: bool,
    /// Gradients alias the reducer's buckets instead of being copied back (tch's reducer only: the
    /// other paths have no bucket a gradient could alias, so it changes nothing there).
    pub gradient_as_bucket_view: bool,
}

impl GradSync {
    pub fn of(exp: &Experiment) -> GradSync {
        let ddp = exp.trainer.ddp.clone().unwrap_or(crate::schema::DdpConfig {
            bucket_cap_mb: 25.0,
            find_unused_parameters: false,
            gradient_as_bucket_view: false,
        });
        GradSync {
            bucket_cap_bytes: ((ddp.bucket_cap_mb * 1024.0 * 1024.0) as usize).max(1),
            find_unused_parameters: ddp.find_unused_parameters,
            gradient_as_bucket_view: ddp.gradient_as_bucket_view,
        }
    }
}

/// Group tensors (given by element count, in the order gradients become ready) into buckets of at most
/// `cap_bytes` of f32; a tensor larger than the cap is a bucket of its own. Returns index ranges.
pub fn buckets(numels: &[usize], cap_bytes: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, &n) in numels.iter().enumerate() {
        let size = n * 4;
        if i > start && bytes + size > cap_bytes {
            out.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += size;
    }
    if start < numels.len() {
        out.push(start..numels.len());
    }
    out
}

/// The error DDP gives when a parameter took no part in the loss.
pub fn unused_parameters_error(names: &[String]) -> anyhow::Error {
    anyhow::anyhow!(
        "DDP: {} parameter(s) received no gradient in this step: {}{}.\n    \
         Every rank must produce a gradient for every parameter before the all-reduce. If parts of the \
         model are unused on purpose, set trainer.ddp.find_unused_parameters=true (they then count as zero)",
        names.len(),
        names.iter().take(5).cloned().collect::<Vec<_>>().join(", "),
        if names.len() > 5 { ", ..." } else { "" }
    )
}

/// With `find_unused_parameters`: which parameters (by position) got a gradient on at least one rank. One
/// unused everywhere keeps no gradient, so the optimizer leaves it alone (no momentum, no weight decay),
/// as PyTorch's reducer does; one unused on some ranks only counts as zero there.
pub fn used_anywhere(comm: &dyn Collective, here: &[bool]) -> anyhow::Result<Vec<bool>> {
    let mut flags: Vec<f32> = here.iter().map(|&u| f32::from(u8::from(u))).collect();
    comm.all_reduce_f32(&mut flags, ReduceOp::Max)?;
    Ok(flags.into_iter().map(|f| f > 0.0).collect())
}

/// Average host-side gradients across ranks, bucket by bucket (for engines whose tensors c10d cannot take
/// directly, e.g. Candle's).
pub fn average_on_host(
    comm: &dyn Collective,
    grads: &mut [Vec<f32>],
    sync: &GradSync,
) -> anyhow::Result<()> {
    let world = comm.world_size() as f32;
    let numels: Vec<usize> = grads.iter().map(Vec::len).collect();
    for range in buckets(&numels, sync.bucket_cap_bytes) {
        let total: usize = numels[range.clone()].iter().sum();
        let mut flat = Vec::with_capacity(total);
        for g in &grads[range.clone()] {
            flat.extend_from_slice(g);
        }
        comm.all_reduce_f32(&mut flat, ReduceOp::Sum)?;
        let mut at = 0;
        for g in &mut grads[range] {
            for (dst, src) in g.iter_mut().zip(&flat[at..]) {
                *dst = src / world;
            }
            at += g.len();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::one_bucket(&[10, 10, 10], 1000, vec![0..3])]
    #[case::split(&[100, 100, 100], 800, vec![0..2, 2..3])]
    #[case::oversized_alone(&[10, 1000, 10], 100, vec![0..1, 1..2, 2..3])]
    #[case::empty(&[], 100, vec![])]
    fn buckets_respect_the_cap(
        #[case] numels: &[usize],
        #[case] cap: usize,
        #[case] expected: Vec<std::ops::Range<usize>>,
    ) {
        assert_eq!(buckets(numels, cap), expected);
    }

    #[test]
    fn unused_parameters_are_named_with_the_fix() {
        let e = unused_parameters_error(&["head.weight".into()]).to_string();
        assert!(
            e.contains("head.weight") && e.contains("find_unused_parameters=true"),
            "{e}"
        );
    }
}
