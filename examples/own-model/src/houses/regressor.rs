//! A network for table rows (`own_model.models.Regressor`): Linear-SiLU layers, then one output per target
//! value (`ctx.num_classes`, the data's `num_classes`).

use candle_core::{Result, Tensor};
use candle_nn::{Linear, Module, VarBuilder};
use trainyard::registry::{CandleModel, ModelContext};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RegressorArgs {
    /// Widths of the hidden layers.
    hidden: Vec<usize>,
}

struct Regressor {
    layers: Vec<Linear>,
    out: Linear,
}

fn regressor(args: RegressorArgs, vb: VarBuilder, ctx: &ModelContext) -> anyhow::Result<Regressor> {
    let [features] = ctx.input_shape[..] else {
        anyhow::bail!(
            "a regressor reads table rows (one dimension); the data gives {:?}",
            ctx.input_shape
        );
    };
    let mut width = features;
    let mut layers = Vec::new();
    for (i, &h) in args.hidden.iter().enumerate() {
        layers.push(candle_nn::linear(width, h, vb.pp(format!("layers.{i}")))?);
        width = h;
    }
    Ok(Regressor {
        layers,
        out: candle_nn::linear(width, ctx.num_classes, vb.pp("out"))?,
    })
}

impl CandleModel for Regressor {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        let mut h = x.clone();
        for layer in &self.layers {
            h = candle_nn::ops::silu(&layer.forward(&h)?)?;
        }
        self.out.forward(&h)
    }
}

trainyard::register_candle_model!("own_model.models.Regressor", regressor);
