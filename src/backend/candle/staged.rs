//! The Candle engine's side of FSDP's unit-by-unit schedule (`backend::units`): one model stage at a
//! time, forward without keeping the stage's graph, backward by running the stage again from its saved
//! input.

use super::kernels::tape;
use super::models::{Buffers, CandleForward, Pass};
use super::CandleEngine;
use crate::backend::units::StagedCompute;
use crate::platform::rng::Rng;
use crate::registry::LossValue;
use crate::tensor::Flat;
use candle_core::{backprop::GradStore, DType, Tensor, Var};

/// The engine with the batch's labels, for the loss stage.
pub struct LossStage<'a> {
    pub engine: &'a mut CandleEngine,
    pub labels: Tensor,
}

type Layout = [(String, Vec<usize>)];

impl LossStage<'_> {
    /// Stage `k` from `x` as a graph leaf (`None`: the batch, which needs no gradient).
    fn leaf(x: &Tensor, input_grad: bool) -> anyhow::Result<(Tensor, Option<Var>)> {
        if !input_grad {
            return Ok((x.clone(), None));
        }
        let var = Var::from_tensor(x)?;
        Ok((var.as_tensor().clone(), Some(var)))
    }

    /// The unit's parameter gradients, flat in layout order (zero where one got none).
    fn flat_gradient(&self, layout: &Layout, grads: &GradStore) -> anyhow::Result<Flat> {
        let mut flat = Vec::with_capacity(
            layout
                .iter()
                .map(|(_, s)| s.iter().product::<usize>())
                .sum(),
        );
        for (name, shape) in layout {
            let var = &self.engine.params[name];
            match grads.get(var.as_tensor()) {
                Some(g) => flat.extend(g.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?),
                None => flat.resize(flat.len() + shape.iter().product::<usize>(), 0.0),
            }
        }
        Ok(Flat::Host(flat))
    }

    fn input_gradient(x: &Option<Var>, grads: &GradStore) -> anyhow::Result<Option<Tensor>> {
        Ok(match x {
            Some(v) => Some(match grads.get(v.as_tensor()) {
                Some(g) => g.clone(),
                None => v.as_tensor().zeros_like()?,
            }),
            None => None,
        })
    }
}

impl StagedCompute for LossStage<'_> {
    type Act = Tensor;
    /// The logits, and the loss with its metrics (a registered loss's, or cross-entropy's alone).
    type Out = (Tensor, LossValue);

    fn stage_count(&self) -> usize {
        self.engine.model.stages().len()
    }

    fn home(&self) -> crate::tensor::FlatHome {
        crate::tensor::FlatHome::Host
    }

    fn install(&mut self, layout: &Layout, flat: &Flat) -> anyhow::Result<()> {
        crate::backend::Sharding::set_parameters(self.engine, layout, flat)
    }

    fn release(&mut self, layout: &Layout) -> anyhow::Result<()> {
        for (name, _) in layout {
            self.engine.params.insert(
                name.clone(),
                Var::from_slice::<_, f32>(&[], 0, &self.engine.device)?,
            );
            self.engine.grads.remove(name);
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
        let e = &mut *self.engine;
        let mut pass = Pass {
            train,
            rng,
            sync_batchnorm: e.sync_batchnorm.as_ref(),
            autocast: e.autocast,
        };
        Ok(e.model
            .forward_stage(k, &e.params, &mut e.buffers, x, &mut pass)?
            .detach())
    }

    fn backward_loss(
        &mut self,
        layout: &Layout,
        x: &Tensor,
        grad_scale: f64,
        rng: &mut Rng,
    ) -> anyhow::Result<(Tensor, Flat, (Tensor, LossValue))> {
        let (input, var) = Self::leaf(x, true)?;
        let e = &mut *self.engine;
        let k = e.model.stages().len() - 1;
        let mut pass = Pass {
            train: true,
            rng,
            sync_batchnorm: e.sync_batchnorm.as_ref(),
            autocast: e.autocast,
        };
        let logits = e
            .model
            .forward_stage(k, &e.params, &mut e.buffers, &input, &mut pass)?;
        let value = match &e.loss {
            Some(registered) => registered.compute(&logits, &self.labels)?,
            None => LossValue {
                loss: e.training_loss(&logits, &self.labels)?,
                metrics: Vec::new(),
            },
        };
        let grads = value.loss.affine(grad_scale, 0.0)?.backward()?;
        let grad_in = Self::input_gradient(&var, &grads)?
            .ok_or_else(|| anyhow::anyhow!("FSDP units: the head's input is not a graph leaf"))?;
        let detached = LossValue {
            loss: value.loss.detach(),
            metrics: value.metrics.iter().map(Tensor::detach).collect(),
        };
        Ok((
            grad_in,
            self.flat_gradient(layout, &grads)?,
            (logits.detach(), detached),
        ))
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
        let (input, var) = Self::leaf(x, input_grad)?;
        // The forward pass already moved the running statistics: this run's updates are dropped.
        let mut scratch: Buffers = self.engine.buffers.clone();
        let e = &*self.engine;
        let mut pass = Pass {
            train: true,
            rng,
            sync_batchnorm: e.sync_batchnorm.as_ref(),
            autocast: e.autocast,
        };
        let (y, tape) = tape::record(|| {
            e.model
                .forward_stage(k, &e.params, &mut scratch, &input, &mut pass)
        })?;
        let g = grad_out.to_dtype(y.dtype())?;
        let grads = if tape.usable(&y) {
            tape.backward(&y, g)?
        } else {
            // d(sum(y * g))/dy = g exactly: backpropagates `grad_out` through the stage.
            (y * g)?.sum_all()?.backward()?
        };
        Ok((
            Self::input_gradient(&var, &grads)?,
            self.flat_gradient(layout, &grads)?,
        ))
    }
}
