//! A registered model (`model::registered`) on Candle: built again for each forward pass over the engine's
//! own variables (a `VarBuilder` that hands out the engine's `Var`s by name), so its candle-nn layers
//! compute with the weights the optimizer updates and their gradients reach the engine. Building a model
//! over existing variables allocates nothing but the layer structs.

use super::models::{Buffers, CandleForward, Params, Pass};
use crate::model::registered::Registered;
use candle_core::{DType, Device, Result, Shape, Tensor};

impl CandleForward for Registered {
    fn forward_stage(
        &self,
        _k: usize,
        p: &Params,
        _b: &mut Buffers,
        x: &Tensor,
        pass: &mut Pass,
    ) -> Result<Tensor> {
        let vb = candle_nn::VarBuilder::from_backend(
            Box::new(EngineVariables(p)),
            DType::F32,
            x.device().clone(),
        );
        let entry = self
            .candle_entry()
            .map_err(|e| candle_core::Error::Msg(format!("{e:#}")))?;
        let model = (entry.candle)(&self.args, vb, &self.ctx)
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e:#}", self.target)))?;
        // The loader's NCHW view of a registered dataset's samples, back in their own shape.
        let dims: Vec<usize> = std::iter::once(x.dim(0)?)
            .chain(self.ctx.input_shape.iter().copied())
            .collect();
        match x.dims() == dims.as_slice() {
            true => model.forward_t(x, pass.train),
            false => model.forward_t(&x.reshape(dims)?, pass.train),
        }
    }
}

/// The engine's variables, by name, as a `VarBuilder` backend.
struct EngineVariables<'a>(&'a Params);

impl candle_nn::var_builder::SimpleBackend for EngineVariables<'_> {
    fn get(
        &self,
        s: Shape,
        name: &str,
        _: candle_nn::Init,
        _: DType,
        _: &Device,
    ) -> Result<Tensor> {
        let t = self.get_unchecked(name, DType::F32, &Device::Cpu)?;
        if t.dims() != s.dims() {
            candle_core::bail!(
                "the model asked for '{name}' as {:?}, but it was created as {:?}: a registered model must \
                 ask for the same variables every time it is built",
                s.dims(),
                t.dims()
            );
        }
        Ok(t)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> Result<Tensor> {
        match self.0.get(name) {
            Some(var) => Ok(var.as_tensor().clone()),
            None => candle_core::bail!(
                "the model asked for '{name}', which it did not create when it was first built"
            ),
        }
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }
}
