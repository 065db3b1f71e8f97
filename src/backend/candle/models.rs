//! The Candle forward passes of the model zoo (`crate::model` describes the architectures): each stage
//! over named variables, with PyTorch's `state_dict()` names.

use crate::model::cnn::Cnn;
use crate::model::dropout::dropout_mask;
use crate::model::mlp::Mlp;
use crate::model::Architecture;
use crate::rng::Rng;
use candle_core::{Result, Tensor, Var, D};
use std::collections::BTreeMap;

pub type Params = BTreeMap<String, Var>;
/// Non-trainable state (BatchNorm running statistics), saved in checkpoints but never optimised.
pub type Buffers = BTreeMap<String, Tensor>;

/// A model's forward pass on Candle, one stage at a time (the stages of its description).
pub trait CandleForward {
    /// Stage `k` of the forward pass. `rng` drives dropout masks in train mode (deterministic, seeded per
    /// step); train mode updates `buffers`.
    fn forward_stage(
        &self,
        k: usize,
        p: &Params,
        buffers: &mut Buffers,
        x: &Tensor,
        train: bool,
        rng: &mut Rng,
    ) -> Result<Tensor>;
}

impl CandleForward for Architecture {
    fn forward_stage(
        &self,
        k: usize,
        p: &Params,
        buffers: &mut Buffers,
        x: &Tensor,
        train: bool,
        rng: &mut Rng,
    ) -> Result<Tensor> {
        match self {
            Architecture::Mlp(m) => m.forward_stage(k, p, buffers, x, train, rng),
            Architecture::Cnn(m) => m.forward_stage(k, p, buffers, x, train, rng),
            Architecture::ResNet(m) => m.forward_stage(k, p, buffers, x, train, rng),
            Architecture::Vit(m) => m.forward_stage(k, p, buffers, x, train, rng),
        }
    }
}

/// The whole forward pass: the stages in order.
pub fn forward(
    arch: &Architecture,
    p: &Params,
    buffers: &mut Buffers,
    x: &Tensor,
    train: bool,
    rng: &mut Rng,
) -> Result<Tensor> {
    let mut h = x.clone();
    for k in 0..arch.stages().len() {
        h = arch.forward_stage(k, p, buffers, &h, train, rng)?;
    }
    Ok(h)
}

fn get<'a>(p: &'a Params, name: &str) -> Result<&'a Var> {
    p.get(name)
        .ok_or_else(|| candle_core::Error::Msg(format!("missing parameter {name}")))
}

/// A parameter's tensor by name, or an error naming it.
pub fn param<'a>(p: &'a Params, name: &str) -> Result<&'a Tensor> {
    get(p, name).map(|v| v.as_tensor())
}

fn linear(p: &Params, prefix: &str, x: &Tensor) -> Result<Tensor> {
    let w = get(p, &format!("{prefix}.weight"))?;
    let b = get(p, &format!("{prefix}.bias"))?;
    super::autocast::linear(x, w, b)
}

/// `relu(conv3x3(x) + bias)`, fused.
fn conv3x3_relu(p: &Params, prefix: &str, x: &Tensor) -> Result<Tensor> {
    let w = get(p, &format!("{prefix}.weight"))?;
    let b = get(p, &format!("{prefix}.bias"))?;
    super::conv_relu::conv2d_bias_relu(x, w, b, 1, 1)
}

/// Inverted dropout with a host-generated mask, so runs are reproducible.
pub fn dropout(x: &Tensor, prob: f64, train: bool, rng: &mut Rng) -> Result<Tensor> {
    if !train || prob <= 0.0 {
        return Ok(x.clone());
    }
    let mask = dropout_mask(x.elem_count(), prob, rng);
    x.mul(&Tensor::from_vec(mask, x.shape(), x.device())?)
}

impl CandleForward for Mlp {
    fn forward_stage(
        &self,
        k: usize,
        p: &Params,
        _buffers: &mut Buffers,
        x: &Tensor,
        train: bool,
        rng: &mut Rng,
    ) -> Result<Tensor> {
        let layers = self.depth();
        match k {
            0 => x.flatten_from(1),
            k if k <= layers => {
                let h = super::fused::relu(&linear(p, &format!("layers.{}", k - 1), x)?)?;
                dropout(&h, self.dropout, train, rng)
            }
            _ => linear(p, "head", x),
        }
    }
}

impl CandleForward for Cnn {
    fn forward_stage(
        &self,
        k: usize,
        p: &Params,
        _buffers: &mut Buffers,
        x: &Tensor,
        train: bool,
        rng: &mut Rng,
    ) -> Result<Tensor> {
        match k {
            0 => Ok(x.clone()),
            k if k <= self.blocks() => {
                let h = conv3x3_relu(p, &format!("blocks.{}.conv", k - 1), x)?;
                if h.dim(2)? < 2 || h.dim(3)? < 2 {
                    Ok(h)
                } else if matches!(h.device(), candle_core::Device::Cpu) {
                    super::fused::max_pool2d(&h, 2, 2, 0)
                } else {
                    h.max_pool2d(2)
                }
            }
            _ => {
                let pooled = x.mean(D::Minus1)?.mean(D::Minus1)?;
                let pooled = dropout(&pooled, self.dropout, train, rng)?;
                linear(p, "head", &pooled)
            }
        }
    }
}
