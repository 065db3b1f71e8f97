//! The tch engine's side of FSDP's unit-by-unit schedule (`backend::units`): one model stage at a time,
//! forward under `no_grad`, backward by running the stage again from its saved input. Under a mixed
//! precision only the stages' forward computations run in autocast, as `torch.utils.checkpoint` re-enters
//! it for its recomputation: backward passes run outside it, as in the whole-model step.

use super::TchEngine;
use crate::backend::units::StagedCompute;
use crate::platform::rng::Rng;
use crate::tensor::{Flat, FlatHome};
use std::collections::BTreeMap;
use tch::{Device, Kind, Tensor};

/// The engine with the batch's labels, for the loss stage.
pub struct LossStage<'a> {
    pub engine: &'a mut TchEngine,
    pub labels: Tensor,
}

type Layout = [(String, Vec<usize>)];

impl LossStage<'_> {
    /// The unit's parameter gradients, flat in layout order (zero where one got none), on the
    /// engine's device.
    fn flat_gradient(&self, layout: &Layout) -> anyhow::Result<Flat> {
        let e = &*self.engine;
        flat_gradients(layout, e.device, |name| Ok(e.params[name].grad()))
    }

    /// Autocast for the engine's precision (nothing at 32 bits), around a forward computation.
    fn autocast(&self) -> anyhow::Result<Option<super::amp::AutocastGuard>> {
        super::amp::autocast(self.engine.mode, self.engine.device)
    }

    /// The stage's input as a graph leaf (with a gradient only when asked).
    fn leaf(x: &Tensor, input_grad: bool) -> anyhow::Result<Tensor> {
        Ok(x.f_detach()?.set_requires_grad(input_grad))
    }
}

impl StagedCompute for LossStage<'_> {
    type Act = Tensor;
    /// The logits and the batch's statistics (the objective's: cross-entropy's or a registered loss's).
    type Out = (Tensor, super::objective::Packed);

    fn stage_count(&self) -> usize {
        self.engine.arch.arch.stages().len()
    }

    fn home(&self) -> FlatHome {
        FlatHome::Tch(self.engine.device, tch::Kind::Float)
    }

    fn install(&mut self, layout: &Layout, flat: &Flat) -> anyhow::Result<()> {
        crate::backend::Sharding::set_parameters(self.engine, layout, flat)
    }

    fn release(&mut self, layout: &Layout) -> anyhow::Result<()> {
        let e = &mut *self.engine;
        for (name, _) in layout {
            // Dropping the tensor drops its `.grad` too.
            let empty = Tensor::f_empty([0], (e.mode.storage(), e.device))?;
            e.params.insert(name.clone(), empty);
        }
        Ok(())
    }

    fn forward(
        &mut self,
        k: usize,
        x: &Tensor,
        train: bool,
        rng: &mut Rng,
    ) -> anyhow::Result<Tensor> {
        let _autocast = self.autocast()?;
        let e = &mut *self.engine;
        tch::no_grad(|| {
            e.arch
                .forward_stage(k, &e.params, &mut e.buffers, x, train, rng)
        })
    }

    fn backward_loss(
        &mut self,
        layout: &Layout,
        x: &Tensor,
        grad_scale: f64,
        rng: &mut Rng,
    ) -> anyhow::Result<(Tensor, Flat, (Tensor, super::objective::Packed))> {
        let input = Self::leaf(x, true)?;
        let (logits, computed) = {
            let _autocast = self.autocast()?;
            let e = &mut *self.engine;
            let k = e.arch.arch.stages().len() - 1;
            let logits = e
                .arch
                .forward_stage(k, &e.params, &mut e.buffers, &input, true, rng)?;
            let computed = e.objective.compute(&logits, None, &self.labels, true)?;
            (logits, computed)
        };
        let loss = computed.loss;
        let scale = match &self.engine.scaler {
            Some(s) => grad_scale * s.scale()?,
            None => grad_scale,
        };
        loss.f_mul_scalar(scale)?.f_backward()?;
        let grad_in = input.grad();
        anyhow::ensure!(
            grad_in.defined(),
            "FSDP units: the head's input got no gradient"
        );
        let flat = self.flat_gradient(layout)?;
        Ok((grad_in, flat, (logits.detach(), computed.stats)))
    }

    fn backward(
        &mut self,
        k: usize,
        layout: &Layout,
        x: &Tensor,
        grad_out: &Tensor,
        input_grad: bool,
        rng: &mut Rng,
    ) -> anyhow::Result<(Option<Tensor>, Flat)> {
        let input = Self::leaf(x, input_grad)?;
        // The forward pass already moved the running statistics (in place): this run updates copies.
        let mut scratch = BTreeMap::new();
        for (name, t) in &self.engine.buffers {
            scratch.insert(name.clone(), t.copy());
        }
        let y = {
            let _autocast = self.autocast()?;
            let e = &*self.engine;
            e.arch
                .forward_stage(k, &e.params, &mut scratch, &input, true, rng)?
        };
        // d(sum(y * g))/dy = g exactly: backpropagates `grad_out` through the stage (a stage with no
        // parameters over the batch, such as a flatten, has nothing to backpropagate into).
        if y.requires_grad() {
            y.f_mul(grad_out)?.f_sum(None)?.f_backward()?;
        }
        let grad_in = if input_grad {
            let g = input.grad();
            Some(if g.defined() {
                g
            } else {
                input.f_zeros_like()?
            })
        } else {
            None
        };
        Ok((grad_in, self.flat_gradient(layout)?))
    }
}

/// The gradients `grad_of` gives for `layout`'s parameters, flat in layout order on `device` as f32
/// (zeros for an undefined gradient).
fn flat_gradients(
    layout: &[(String, Vec<usize>)],
    device: Device,
    mut grad_of: impl FnMut(&str) -> anyhow::Result<Tensor>,
) -> anyhow::Result<Flat> {
    let mut parts = Vec::with_capacity(layout.len());
    for (name, shape) in layout {
        let g = grad_of(name)?;
        parts.push(if g.defined() {
            g.f_detach()?
                .f_to_kind(Kind::Float)?
                .f_to(device)?
                .f_reshape([-1])?
        } else {
            Tensor::f_zeros(
                [shape.iter().product::<usize>() as i64],
                (Kind::Float, device),
            )?
        });
    }
    if parts.is_empty() {
        return Ok(Flat::Tch(Tensor::f_zeros([0], (Kind::Float, device))?));
    }
    Ok(Flat::Tch(Tensor::f_cat(&parts, 0)?))
}
