//! DistributedDataParallel: every rank starts from rank 0's model (broadcast), trains on its own share of
//! each batch, and before every optimizer step the gradients are averaged across ranks, bucket by bucket
//! (`trainer.ddp.bucket_cap_mb`), so every rank takes the same step. Where the engine can
//! (`backend::BackwardOverlap`: tch on a c10d group, libtorch's reducer), each bucket is averaged during
//! the backward pass as soon as it is ready; otherwise after it, by `average_gradients` — the one place
//! DDP's mean is written, for every engine and for DataParallel's replicas alike. A parameter that got no
//! gradient is an error unless `find_unused_parameters` is set (then it counts as zero), as in PyTorch.

use super::{Ranks, Strategy};
use crate::backend::{self, Engine, Gradients, Placement, StepStats};
use crate::comm::buckets::{buckets, unused_parameters_error, GradSync};
use crate::comm::collective::{broadcast_state, Collective, ReduceOp};
use crate::comm::Distributed;
use crate::data::loader::{Batch, StageBatch};
use crate::optim::GradClip;
use crate::schema::Experiment;
use crate::tensor::Flat;
use anyhow::Context;
use std::sync::Arc;

/// The gradient-averaging settings of `trainer.ddp` (PyTorch's defaults when the section is absent).
pub fn grad_sync(exp: &Experiment) -> GradSync {
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

/// Without `find_unused_parameters`, every parameter must have a gradient.
fn check_unused(grads: &Gradients, sync: &GradSync) -> anyhow::Result<()> {
    let missing = grads.missing();
    if missing.is_empty() || sync.find_unused_parameters {
        return Ok(());
    }
    Err(unused_parameters_error(&missing))
}

/// With `find_unused_parameters`: which parameters (by position) got a gradient on at least one rank. One
/// unused everywhere keeps no gradient, so the optimizer leaves it alone (no momentum, no weight decay),
/// as PyTorch's reducer does; one unused on some ranks only counts as zero there.
fn used_anywhere(comm: &dyn Collective, here: &[bool]) -> anyhow::Result<Vec<bool>> {
    let mut flags: Vec<f32> = here.iter().map(|&u| f32::from(u8::from(u))).collect();
    comm.all_reduce_f32(&mut flags, ReduceOp::Max)?;
    Ok(flags.into_iter().map(|f| f > 0.0).collect())
}

/// Replace every gradient by its mean over the ranks of `comm`, bucket by bucket in the order the engine
/// gave them (the last layers first): each bucket is concatenated, averaged by the collective (all in
/// flight at once where the library allows, device to device where the gradients are on a device), and
/// its mean written back into the gradients, which may be views of the engine's own storage.
pub fn average_gradients(
    comm: &dyn Collective,
    grads: &mut Gradients,
    sync: &GradSync,
) -> anyhow::Result<()> {
    check_unused(grads, sync)?;
    let here: Vec<bool> = grads.entries.iter().map(|g| g.value.is_some()).collect();
    let used = if sync.find_unused_parameters {
        used_anywhere(comm, &here)?
    } else {
        vec![true; here.len()]
    };
    // Used elsewhere but not here: a zero gradient, so every rank reduces the same tensors.
    let mut picked = Vec::new();
    for (i, (g, used)) in grads.entries.iter_mut().zip(used).enumerate() {
        if used {
            if g.value.is_none() {
                g.value = Some(grads.home.zeros(g.numel)?);
            }
            picked.push(i);
        }
    }
    let numels: Vec<usize> = picked.iter().map(|&i| grads.entries[i].numel).collect();
    let ranges = buckets(&numels, sync.bucket_cap_bytes);
    let mut flats = Vec::with_capacity(ranges.len());
    for range in &ranges {
        let parts: Vec<&Flat> = picked[range.clone()]
            .iter()
            .filter_map(|&i| grads.entries[i].value.as_ref())
            .collect();
        flats.push(Flat::concat_refs(&parts, grads.home)?);
    }
    let means = comm.average_flats(flats)?;
    for (range, mean) in ranges.into_iter().zip(&means) {
        let mut at = 0;
        for &i in &picked[range] {
            let g = &mut grads.entries[i];
            if let Some(value) = g.value.as_mut() {
                value.copy_from(&mean.slice(at..at + g.numel)?)?;
            }
            at += g.numel;
        }
    }
    Ok(())
}

/// DDP over a process group: one engine on this rank's device.
pub struct Ddp {
    engine: Box<dyn Engine>,
    /// Keeps the process group (and the rendezvous) alive.
    group: Distributed,
    ranks: Ranks,
    sync: GradSync,
    /// DDP's `broadcast_buffers`: before validation every rank takes rank 0's BatchNorm statistics
    /// (unless SyncBatchNorm keeps them equal already).
    broadcast_buffers: bool,
}

impl Ddp {
    /// This rank's engine on its device (cuda:<local_rank> on a GPU), with SyncBatchNorm over the group
    /// when `trainer.sync_batchnorm`.
    pub fn new(exp: &Experiment, group: Distributed) -> anyhow::Result<Self> {
        let placement = Placement {
            device_index: group.local_rank,
            owns_device: true,
            sync_batchnorm: exp.trainer.sync_batchnorm.then(|| group.comm.clone()),
        };
        let mut engine = backend::build(exp, &placement)?;
        let sync = grad_sync(exp);
        if sync.gradient_as_bucket_view && engine.overlap().is_none() {
            tracing::warn!(
                "trainer.ddp.gradient_as_bucket_view=true has no effect with backend={}: its gradients \
                 are averaged through buckets after the backward pass (backend=tch uses libtorch's reducer)",
                format!("{:?}", exp.backend).to_lowercase()
            );
        }
        let has_buffers = engine.state_dict()?.keys().any(|k| k.contains("running_"));
        Ok(Ddp {
            engine,
            ranks: Ranks::of(&group),
            group,
            sync,
            broadcast_buffers: has_buffers && !exp.trainer.sync_batchnorm,
        })
    }

    fn broadcast_state(&mut self) -> anyhow::Result<()> {
        let state = broadcast_state(self.group.comm.as_ref(), self.engine.state_dict()?)?;
        self.engine.load_state_dict(&state)
    }
}

impl Strategy for Ddp {
    fn ranks(&self) -> &Ranks {
        &self.ranks
    }
    fn engine(&self) -> &dyn Engine {
        self.engine.as_ref()
    }
    fn engine_mut(&mut self) -> &mut dyn Engine {
        self.engine.as_mut()
    }
    fn batch_stager(&self) -> Option<Arc<dyn StageBatch>> {
        self.engine.batch_stager()
    }

    /// Every rank starts from rank 0's weights, buffers and optimizer state.
    fn start(&mut self) -> anyhow::Result<()> {
        self.broadcast_state()
            .context("broadcasting rank 0's model to every rank")
    }

    /// The backward pass that ends an accumulation window averages during the backward pass where the
    /// engine can; the others only accumulate (DDP's `no_sync`).
    fn forward_backward(
        &mut self,
        batch: &Batch,
        grad_scale: f64,
        ends_window: bool,
    ) -> anyhow::Result<StepStats> {
        if ends_window {
            if let Some(overlap) = self.engine.overlap() {
                overlap.arm(self.group.comm.as_ref(), &self.sync)?;
            }
        }
        self.engine.forward_backward(batch, grad_scale)
    }

    fn optimizer_step(
        &mut self,
        lr: f64,
        momentum: Option<f64>,
        clip: Option<GradClip>,
    ) -> anyhow::Result<f64> {
        let reduced = match self.engine.overlap() {
            Some(overlap) => overlap.take_reduced()?,
            None => false,
        };
        let mut grads = self.engine.take_gradients()?;
        if reduced {
            check_unused(&grads, &self.sync)?;
        } else {
            average_gradients(self.group.comm.as_ref(), &mut grads, &self.sync)?;
        }
        self.engine.put_gradients(grads)?;
        self.engine.optimizer_step(lr, momentum, clip)
    }

    fn before_validation(&mut self) -> anyhow::Result<()> {
        if self.broadcast_buffers {
            self.broadcast_state()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Backend;
    use rstest::rstest;

    fn experiment(backend: Backend) -> Experiment {
        let mut exp = crate::testing::experiment(
            "{name: mlp, num_classes: 4, hidden: [8]}",
            "{name: sgd, lr: 0.1, momentum: 0.9}",
            "{strategy: ddp, devices: 2}",
            4,
        );
        exp.backend = backend;
        exp
    }

    fn values(grads: &Gradients, name: &str) -> Option<Vec<f32>> {
        let g = grads.entries.iter().find(|g| g.name == name)?;
        g.value.as_ref().map(|v| v.to_vec().unwrap())
    }

    /// DDP with `find_unused_parameters`, on both engines: a parameter without a gradient on every rank
    /// keeps none (the optimizer leaves it, momentum and all, as PyTorch's reducer does); one without a
    /// gradient on one rank only counts as zero there.
    #[rstest]
    #[case::candle(Backend::Candle)]
    #[cfg_attr(feature = "torch", case::tch(Backend::Tch))]
    fn unused_everywhere_keeps_no_gradient_unused_somewhere_counts_zero(#[case] backend: Backend) {
        let exp = experiment(backend);
        let sync = GradSync {
            bucket_cap_bytes: 1 << 20,
            find_unused_parameters: true,
            gradient_as_bucket_view: false,
        };
        let names: Vec<String> = backend::build(&exp, &Placement::single())
            .unwrap()
            .parameter_shapes()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let (everywhere, somewhere) = (names[0].clone(), names[names.len() - 1].clone());
        let comms = crate::comm::local::group(2);
        let results: Vec<(Box<dyn Engine>, Vec<f32>)> = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .iter()
                .enumerate()
                .map(|(rank, comm)| {
                    let (exp, everywhere, somewhere) = (&exp, &everywhere, &somewhere);
                    s.spawn(move || {
                        let mut e = backend::build(exp, &Placement::single()).unwrap();
                        e.forward_backward(&crate::testing::batch(rank as u64), 1.0)
                            .unwrap();
                        let mut grads = e.take_gradients().unwrap();
                        let kept = values(&grads, somewhere).unwrap();
                        for g in &mut grads.entries {
                            if g.name == *everywhere || (rank == 0 && g.name == *somewhere) {
                                g.value = None;
                            }
                        }
                        average_gradients(comm, &mut grads, &sync).unwrap();
                        e.put_gradients(grads).unwrap();
                        (e, kept)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut engines: Vec<Box<dyn Engine>> = Vec::new();
        let mut kept = Vec::new();
        for (e, k) in results {
            engines.push(e);
            kept.push(k);
        }
        for e in &mut engines {
            let grads = e.take_gradients().unwrap();
            assert!(values(&grads, &everywhere).is_none(), "{backend:?}");
            // Rank 1's gradient averaged with rank 0's zero.
            let got = values(&grads, &somewhere).unwrap();
            for (g, k) in got.iter().zip(&kept[1]) {
                assert!(
                    (g - 0.5 * k).abs() < 1e-7,
                    "{backend:?}: {g} vs {}",
                    0.5 * k
                );
            }
            e.put_gradients(grads).unwrap();
        }
        let e = &mut engines[0];
        let before = e.state_dict().unwrap()[&everywhere].clone();
        e.optimizer_step(0.1, None, None).unwrap();
        let after = e.state_dict().unwrap();
        assert_eq!(after[&everywhere], before, "{backend:?}");
        assert!(!after
            .keys()
            .any(|k| k.starts_with(&format!("optimizer.{everywhere}."))));
    }

    /// DDP's step on two in-process ranks (threads over the local collective, so in every build): each
    /// rank's own half-batch, gradients averaged in `optimizer_step`, equals one process stepping on the
    /// whole batch, step after step; and the ranks' weights stay identical.
    #[test]
    fn two_ranks_on_half_batches_step_as_one_process_on_the_whole() {
        let exp = experiment(Backend::Candle);
        let halves = |step: u64| {
            [
                crate::testing::batch(2 * step),
                crate::testing::batch(2 * step + 1),
            ]
        };
        let comms = crate::comm::local::group(2);
        let ranks: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .enumerate()
                .map(|(rank, comm)| {
                    let exp = &exp;
                    s.spawn(move || {
                        let group = Distributed::in_process(Arc::new(comm), rank, 2);
                        let mut ddp = Ddp::new(exp, group).unwrap();
                        ddp.start().unwrap();
                        for step in 0..3 {
                            ddp.forward_backward(&halves(step)[rank], 1.0, true)
                                .unwrap();
                            ddp.optimizer_step(0.1, Some(0.9), None).unwrap();
                        }
                        weights(ddp.engine())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(ranks[0] == ranks[1], "the ranks' weights drifted apart");
        let mut one = backend::build(&exp, &Placement::single()).unwrap();
        for step in 0..3 {
            let [a, b] = halves(step);
            let mut whole = crate::testing::batch(0);
            whole.images = [a.images.clone(), b.images.clone()].concat();
            whole.labels = [a.labels.clone(), b.labels.clone()].concat();
            one.forward_backward(&whole, 1.0).unwrap();
            one.optimizer_step(0.1, Some(0.9), None).unwrap();
        }
        let single = weights(one.as_ref());
        let worst = single
            .iter()
            .flatten()
            .zip(ranks[0].iter().flatten())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst < 1e-5,
            "DDP's weights differ from one process's by {worst}"
        );
    }

    fn weights(e: &dyn Engine) -> Vec<Vec<f32>> {
        let s = e.state_dict().unwrap();
        e.parameter_shapes()
            .iter()
            .map(|(n, _)| s[n].data.clone())
            .collect()
    }

    #[test]
    fn a_missing_gradient_without_find_unused_is_an_error_that_names_it() {
        let exp = experiment(Backend::Candle);
        let mut e = backend::build(&exp, &Placement::single()).unwrap();
        e.forward_backward(&crate::testing::batch(1), 1.0).unwrap();
        let mut grads = e.take_gradients().unwrap();
        grads.entries[0].value = None;
        let name = grads.entries[0].name.clone();
        let comms = crate::comm::local::group(1);
        let err = average_gradients(&comms[0], &mut grads, &grad_sync(&exp))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&name) && err.contains("find_unused_parameters"),
            "{err}"
        );
    }

    /// On two ranks over a real Gloo group, the reducer's way (armed, averaged inside backward) gives,
    /// step after step, the gradients and weights of the post-backward bucketed average, with two
    /// accumulated micro-batches per step (only the second is armed: DDP's `no_sync`). The gradients are
    /// averaged already when `forward_backward` returns.
    #[cfg(feature = "torch")]
    #[rstest]
    #[case::one_bucket(25 << 20, false, false)]
    #[case::small_buckets_rebuilt(2048, false, false)]
    #[case::find_unused(2048, true, false)]
    #[case::gradient_as_bucket_view(2048, false, true)]
    fn armed_backward_averages_as_the_post_backward_average(
        #[case] bucket_cap_bytes: usize,
        #[case] find_unused_parameters: bool,
        #[case] gradient_as_bucket_view: bool,
    ) {
        let mut exp = crate::testing::experiment(
            "{name: mlp, num_classes: 4, hidden: [16, 16]}",
            "{name: sgd, lr: 0.1, momentum: 0.9}",
            "{strategy: ddp, devices: 2}",
            4,
        );
        exp.backend = Backend::Tch;
        let sync = GradSync {
            bucket_cap_bytes,
            find_unused_parameters,
            gradient_as_bucket_view,
        };
        /// The engine's gradients, copied to the host (and left in place).
        fn grads(e: &mut Box<dyn Engine>) -> Vec<Vec<f32>> {
            let g = e.take_gradients().unwrap();
            let out = g
                .entries
                .iter()
                .map(|g| g.value.as_ref().unwrap().to_vec().unwrap())
                .collect();
            e.put_gradients(g).unwrap();
            out
        }
        fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
            a.iter()
                .flatten()
                .zip(b.iter().flatten())
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max)
        }
        crate::testing::on_two_ranks(|rank, group| {
            let mut armed = backend::build(&exp, &Placement::single()).unwrap();
            let mut reference = backend::build(&exp, &Placement::single()).unwrap();
            for step in 0..3u64 {
                let micro = |m: u64| crate::testing::batch(100 * step + 10 * m + rank as u64);
                armed.forward_backward(&micro(0), 0.5).unwrap();
                assert!(armed.overlap().unwrap().arm(group, &sync).unwrap());
                armed.forward_backward(&micro(1), 0.5).unwrap();
                assert!(armed.overlap().unwrap().take_reduced().unwrap());
                let averaged_in_backward = grads(&mut armed);
                reference.forward_backward(&micro(0), 0.5).unwrap();
                reference.forward_backward(&micro(1), 0.5).unwrap();
                let local = grads(&mut reference);
                let mut g = reference.take_gradients().unwrap();
                average_gradients(group, &mut g, &sync).unwrap();
                reference.put_gradients(g).unwrap();
                let expected = grads(&mut reference);
                assert!(
                    max_diff(&local, &expected) > 1e-4,
                    "the ranks' batches differ, so averaging must change the gradients"
                );
                let diff = max_diff(&averaged_in_backward, &expected);
                assert!(diff < 1e-6, "rank {rank} step {step}: {diff}");
                armed.optimizer_step(0.1, Some(0.9), None).unwrap();
                reference.optimizer_step(0.1, Some(0.9), None).unwrap();
            }
            let weights = |e: &dyn Engine| -> Vec<Vec<f32>> {
                let s = e.state_dict().unwrap();
                e.parameter_shapes()
                    .iter()
                    .map(|(n, _)| s[n].data.clone())
                    .collect()
            };
            let diff = max_diff(&weights(armed.as_ref()), &weights(reference.as_ref()));
            assert!(
                diff < 1e-5,
                "rank {rank}: weights after 3 steps differ by {diff}"
            );
        });
    }
}
