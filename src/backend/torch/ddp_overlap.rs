//! The tch engine's side of DDP with overlap: when a c10d group is there, libtorch's reducer
//! (`comm::reducer`) averages gradients bucket by bucket during the backward pass of the micro-batch that
//! ends an accumulation window. This keeps the reducer's life cycle: built on the first armed pass over
//! the parameter tensors of that moment (with that run's fixed `trainer.ddp` settings), dropped whenever
//! the engine replaces those tensors.

use crate::comm::buckets::GradSync;
use crate::comm::c10d::ProcessGroup;
use crate::comm::reducer::Reducer;
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
    /// Arm the next backward pass (`BackwardOverlap::arm`). `order` is the model's definition order,
    /// which the first buckets follow.
    pub fn arm(
        &mut self,
        group: &ProcessGroup,
        sync: &GradSync,
        order: &[String],
        params: &BTreeMap<String, Tensor>,
    ) -> anyhow::Result<()> {
        let reducer = match &mut self.reducer {
            Some(r) => r,
            None => {
                let options = *sync;
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
        Ok(())
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
