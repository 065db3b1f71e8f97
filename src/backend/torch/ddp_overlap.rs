//! The tch engine's side of DDP with overlap: when a c10d group is there, libtorch's reducer
//! (`comm::reducer`) averages gradients bucket by bucket during the backward pass of the micro-batch that
//! ends an accumulation window. This keeps the reducer's life cycle: built on the first armed pass over
//! the parameter tensors of that moment (with that run's fixed `trainer.ddp` settings), dropped whenever
//! the engine replaces those tensors.

use crate::comm::collective::Collective;
use crate::comm::reducer::{Reducer, ReducerOptions};
use crate::strategy::ddp::GradSync;
use std::collections::BTreeMap;
use tch::Tensor;

#[derive(Default)]
pub struct Overlap {
    reducer: Option<Reducer>,
    /// The next backward pass reduces.
    armed: bool,
    /// The last backward pass reduced: the gradients are averaged already.
    reduced: bool,
}

impl Overlap {
    /// Arm the next backward pass (see `Engine::arm_gradient_sync`); false without a c10d group.
    /// `order` is the model's definition order, which the first buckets follow.
    pub fn arm(
        &mut self,
        comm: &dyn Collective,
        sync: &GradSync,
        order: &[String],
        params: &BTreeMap<String, Tensor>,
    ) -> anyhow::Result<bool> {
        let Some(group) = comm.process_group() else {
            return Ok(false);
        };
        let reducer = match &mut self.reducer {
            Some(r) => r,
            None => {
                let options = ReducerOptions {
                    bucket_cap_bytes: sync.bucket_cap_bytes,
                    find_unused_parameters: sync.find_unused_parameters,
                    gradient_as_bucket_view: sync.gradient_as_bucket_view,
                };
                let named: Vec<(&str, &Tensor)> =
                    order.iter().map(|n| (n.as_str(), &params[n])).collect();
                tracing::info!(
                    "DDP: gradients are all-reduced during the backward pass, in buckets of up to \
                     {:.1} MB (libtorch's reducer; find_unused_parameters={}, gradient_as_bucket_view={})",
                    options.bucket_cap_bytes as f64 / (1024.0 * 1024.0),
                    options.find_unused_parameters,
                    options.gradient_as_bucket_view
                );
                self.reducer.insert(Reducer::new(group, &named, options)?)
            }
        };
        reducer.prepare_forward()?;
        self.armed = true;
        Ok(true)
    }

    /// Between the armed forward pass and its backward pass (`outputs`: what the loss came from).
    pub fn before_backward(&mut self, outputs: &[&Tensor]) -> anyhow::Result<()> {
        if std::mem::take(&mut self.armed) {
            if let Some(r) = self.reducer.as_mut() {
                r.prepare_backward(outputs)?;
                self.reduced = true;
            }
        }
        Ok(())
    }

    /// Did the last backward pass reduce? If so, confirm every bucket was reduced.
    pub fn take_reduced(&mut self) -> anyhow::Result<bool> {
        if !std::mem::take(&mut self.reduced) {
            return Ok(false);
        }
        if let Some(r) = self.reducer.as_mut() {
            r.check_finalized()?;
        }
        Ok(true)
    }

    /// The parameter tensors are being replaced: the reducer's hooks would point at the old ones.
    pub fn forget(&mut self) {
        *self = Overlap::default();
    }
}

#[cfg(test)]
mod tests {
    use super::super::TchEngine;
    use crate::backend::Engine;
    use crate::strategy::ddp::GradSync;
    use rstest::rstest;
    use tch::Tensor;

    fn grads(e: &TchEngine) -> Vec<Tensor> {
        e.param_order
            .iter()
            .map(|n| e.params[n].grad().copy())
            .collect()
    }

    fn max_diff(a: &[Tensor], b: &[Tensor]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs().max().double_value(&[]))
            .fold(0.0, f64::max)
    }

    /// On two ranks over a real Gloo group, the reducer's way (armed, averaged inside backward) gives,
    /// step after step, the gradients and weights of the post-backward bucketed all-reduce, with two
    /// accumulated micro-batches per step (only the second is armed: DDP's `no_sync`). The gradients are
    /// averaged already when `forward_backward` returns, and `all_reduce_gradients` then leaves them.
    #[rstest]
    #[case::one_bucket(25 << 20, false, false)]
    #[case::small_buckets_rebuilt(2048, false, false)]
    #[case::find_unused(2048, true, false)]
    #[case::gradient_as_bucket_view(2048, false, true)]
    fn armed_backward_averages_as_the_post_backward_all_reduce(
        #[case] bucket_cap_bytes: usize,
        #[case] find_unused_parameters: bool,
        #[case] gradient_as_bucket_view: bool,
    ) {
        let exp = crate::testing::experiment(
            "{name: mlp, num_classes: 4, hidden: [16, 16]}",
            "{name: sgd, lr: 0.1, momentum: 0.9}",
            "{strategy: ddp, devices: 2}",
            4,
        );
        let sync = GradSync {
            bucket_cap_bytes,
            find_unused_parameters,
            gradient_as_bucket_view,
        };
        crate::testing::on_two_ranks(|rank, group| {
            let mut armed = TchEngine::new(&exp).unwrap();
            let mut reference = TchEngine::new(&exp).unwrap();
            for step in 0..3u64 {
                let micro = |m: u64| crate::testing::batch(100 * step + 10 * m + rank as u64);
                armed.forward_backward(&micro(0), 0.5).unwrap();
                assert!(armed.arm_gradient_sync(group, &sync).unwrap());
                armed.forward_backward(&micro(1), 0.5).unwrap();
                let averaged_in_backward = grads(&armed);
                reference.forward_backward(&micro(0), 0.5).unwrap();
                reference.forward_backward(&micro(1), 0.5).unwrap();
                let local = grads(&reference);
                reference.all_reduce_gradients(group, &sync).unwrap();
                let expected = grads(&reference);
                assert!(
                    max_diff(&local, &expected) > 1e-4,
                    "the ranks' batches differ, so averaging must change the gradients"
                );
                let diff = max_diff(&averaged_in_backward, &expected);
                assert!(diff < 1e-6, "rank {rank} step {step}: {diff}");
                armed.all_reduce_gradients(group, &sync).unwrap();
                assert!(max_diff(&grads(&armed), &expected) < 1e-6, "reduced twice");
                armed.optimizer_step(0.1, Some(0.9), None).unwrap();
                reference.optimizer_step(0.1, Some(0.9), None).unwrap();
            }
            let weights = |e: &TchEngine| -> Vec<Tensor> {
                e.param_order.iter().map(|n| e.params[n].copy()).collect()
            };
            let diff = max_diff(&weights(&armed), &weights(&reference));
            assert!(
                diff < 1e-5,
                "rank {rank}: weights after 3 steps differ by {diff}"
            );
        });
    }
}
