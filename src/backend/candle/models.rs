//! The Candle forward passes of the model zoo (`crate::model` describes the architectures): each stage
//! over named variables, with PyTorch's `state_dict()` names.

use super::autocast::Autocast;
use super::kernels::tape::{self, Tape};
use crate::comm::collective::Collective;
use crate::model::cnn::Cnn;
use crate::model::dropout::dropout_mask;
use crate::model::mlp::Mlp;
use crate::model::Architecture;
use crate::platform::rng::Rng;
use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var, D};
use std::collections::BTreeMap;
use std::sync::Arc;

pub type Params = BTreeMap<String, Var>;
/// Non-trainable state (BatchNorm running statistics), saved in checkpoints but never optimised.
pub type Buffers = BTreeMap<String, Tensor>;

/// How one forward pass runs, besides its parameters and input.
pub struct Pass<'a> {
    /// Training mode: dropout on, BatchNorm with batch statistics (updating the running ones).
    pub train: bool,
    /// Drives dropout masks in training mode (deterministic, seeded per step).
    pub rng: &'a mut Rng,
    /// SyncBatchNorm's group: training-mode BatchNorm reduces its statistics over these ranks.
    pub sync_batchnorm: Option<&'a Arc<dyn Collective>>,
    /// `bf16-mixed`: autocast's rounding of matrix products and convolutions.
    pub autocast: Autocast,
}

/// A model's forward pass on Candle, one stage at a time (the stages of its description).
pub trait CandleForward {
    /// Stage `k` of the forward pass; training mode updates `buffers`.
    fn forward_stage(
        &self,
        k: usize,
        p: &Params,
        buffers: &mut Buffers,
        x: &Tensor,
        pass: &mut Pass,
    ) -> Result<Tensor>;
}

impl CandleForward for Architecture {
    fn forward_stage(
        &self,
        k: usize,
        p: &Params,
        buffers: &mut Buffers,
        x: &Tensor,
        pass: &mut Pass,
    ) -> Result<Tensor> {
        match self {
            Architecture::Mlp(m) => m.forward_stage(k, p, buffers, x, pass),
            Architecture::Cnn(m) => m.forward_stage(k, p, buffers, x, pass),
            Architecture::ResNet(m) => m.forward_stage(k, p, buffers, x, pass),
            Architecture::Vit(m) => m.forward_stage(k, p, buffers, x, pass),
            Architecture::Declared(m) => m.forward_stage(k, p, buffers, x, pass),
            Architecture::Registered(m) => m.forward_stage(k, p, buffers, x, pass),
        }
    }
}

/// The whole forward pass: the stages in order.
pub fn forward(
    arch: &Architecture,
    p: &Params,
    buffers: &mut Buffers,
    x: &Tensor,
    pass: &mut Pass,
) -> Result<Tensor> {
    let mut h = x.clone();
    for k in 0..arch.stages().len() {
        h = arch.forward_stage(k, p, buffers, &h, pass)?;
    }
    Ok(h)
}

/// A training forward pass cut in two: the body (every stage before the head) recorded on trainyard's
/// tape (`kernels::tape`), the head run on Candle's graph from `leaf`, a copy of the body's output. Candle's
/// backward then covers the head alone, and `backward_into` carries the leaf's gradient through the body.
pub struct Cut {
    body: Tensor,
    leaf: Var,
    tape: Tape,
}

impl Cut {
    /// Adds the body's parameter gradients to `grads` (Candle's, from the loss over the head).
    pub fn backward_into(self, grads: &mut GradStore) -> Result<()> {
        let Some(seed) = grads.remove(self.leaf.as_tensor()) else {
            return Ok(());
        };
        let body = self.tape.backward(&self.body, seed)?;
        for id in body.get_ids().copied().collect::<Vec<_>>() {
            let g = body.get_id(id).expect("listed id").clone();
            let sum = match grads.get_id(id) {
                Some(prev) => (prev + g)?,
                None => g,
            };
            grads.insert_id(id, sum);
        }
        Ok(())
    }
}

/// `forward` for training, with the body cut from the head where the tape can carry the body's backward
/// alone (every op of the body one of the kernels'); otherwise the whole pass on Candle's graph and `None`.
pub fn forward_cut(
    arch: &Architecture,
    p: &Params,
    buffers: &mut Buffers,
    x: &Tensor,
    pass: &mut Pass,
) -> Result<(Tensor, Option<Cut>)> {
    let head = arch.stages().len().saturating_sub(1);
    if head == 0 {
        return Ok((forward(arch, p, buffers, x, pass)?, None));
    }
    let (body, tape) = tape::record(|| {
        let mut h = x.clone();
        for k in 0..head {
            h = arch.forward_stage(k, p, buffers, &h, pass)?;
        }
        Ok(h)
    })?;
    if !tape.usable(&body) {
        if let Some(op) = tape.foreign_op() {
            tracing::trace!(
                "backward on Candle's graph: {op} took a tensor from an op off the tape"
            );
        }
        return Ok((arch.forward_stage(head, p, buffers, &body, pass)?, None));
    }
    let leaf = Var::from_tensor(&body)?;
    let logits = arch.forward_stage(head, p, buffers, leaf.as_tensor(), pass)?;
    Ok((logits, Some(Cut { body, leaf, tape })))
}

fn get<'a>(p: &'a Params, name: &str) -> Result<&'a Var> {
    p.get(name)
        .ok_or_else(|| candle_core::Error::Msg(format!("missing parameter {name}")))
}

/// A parameter's tensor by name, or an error naming it.
pub fn param<'a>(p: &'a Params, name: &str) -> Result<&'a Tensor> {
    get(p, name).map(|v| v.as_tensor())
}

fn linear(p: &Params, prefix: &str, x: &Tensor, autocast: Autocast) -> Result<Tensor> {
    let w = get(p, &format!("{prefix}.weight"))?;
    let b = get(p, &format!("{prefix}.bias"))?;
    autocast.linear(x, w, b)
}

/// `relu(conv3x3(x) + bias)`, fused.
fn conv3x3_relu(p: &Params, prefix: &str, x: &Tensor, autocast: Autocast) -> Result<Tensor> {
    let w = get(p, &format!("{prefix}.weight"))?;
    let b = get(p, &format!("{prefix}.bias"))?;
    autocast.conv2d_bias_relu(x, w, b, 1, 1)
}

/// Inverted dropout with a host-generated mask, so runs are reproducible.
pub fn dropout(x: &Tensor, prob: f64, pass: &mut Pass) -> Result<Tensor> {
    if !pass.train || prob <= 0.0 {
        return Ok(x.clone());
    }
    let mask = dropout_mask(x.elem_count(), prob, pass.rng);
    tape::ops::mul_by_constant(x, &Tensor::from_vec(mask, x.shape(), x.device())?)
}

impl CandleForward for Mlp {
    fn forward_stage(
        &self,
        k: usize,
        p: &Params,
        _buffers: &mut Buffers,
        x: &Tensor,
        pass: &mut Pass,
    ) -> Result<Tensor> {
        let layers = self.depth();
        match k {
            0 => x.flatten_from(1),
            k if k <= layers => {
                let h = super::kernels::fused::relu(&linear(
                    p,
                    &format!("layers.{}", k - 1),
                    x,
                    pass.autocast,
                )?)?;
                dropout(&h, self.dropout, pass)
            }
            _ => linear(p, "head", x, pass.autocast),
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
        pass: &mut Pass,
    ) -> Result<Tensor> {
        match k {
            0 => Ok(x.clone()),
            k if k <= self.blocks() && x.rank() == 5 => {
                let prefix = format!("blocks.{}.conv", k - 1);
                let (w, b) = (
                    get(p, &format!("{prefix}.weight"))?,
                    get(p, &format!("{prefix}.bias"))?,
                );
                let isa = super::kernels::direct::active().ok_or_else(|| {
                    candle_core::Error::Msg("blocked activations without a direct path".into())
                })?;
                // Its input holds bf16s under autocast (the first block's rounded output, pooled, or a
                // block like this one); so does its output gradient, but in the last block (the next
                // block's input gradient through this one's mask, not the head's mean).
                let rounded = super::kernels::direct::Rounded {
                    input: true,
                    grad: k < self.blocks(),
                };
                let h = blocked_conv_sums((isa, pass.autocast), x, w, (1, 1), rounded)?;
                Ok(blocked_bias_relu(pass.autocast, &h, b, true)?.0)
            }
            k if k <= self.blocks() => {
                let h = conv3x3_relu(p, &format!("blocks.{}.conv", k - 1), x, pass.autocast)?;
                let h = if h.dim(2)? < 2 || h.dim(3)? < 2 {
                    h
                } else if matches!(h.device(), candle_core::Device::Cpu) {
                    super::kernels::fused::max_pool2d(&h, 2, 2, 0)?
                } else {
                    h.max_pool2d(2)?
                };
                // The first block (3 input channels) runs planar; the blocks after it blocked, where a
                // direct path runs.
                match pass
                    .autocast
                    .blocks_activations(&h)
                    .filter(|_| k < self.blocks())
                {
                    Some(isa) => super::kernels::direct::layout::to_blocked(&h, isa.lanes()),
                    None => Ok(h),
                }
            }
            _ => {
                let x = if x.rank() == 5 {
                    super::kernels::direct::layout::from_blocked(x, get(p, "head.weight")?.dim(1)?)?
                } else {
                    x.clone()
                };
                let pooled = x.mean(D::Minus1)?.mean(D::Minus1)?;
                let pooled = dropout(&pooled, self.dropout, pass)?;
                linear(p, "head", &pooled, pass.autocast)
            }
        }
    }
}

/// A convolution with a bias over blocked activations, without its bias: the f32 convolution, or under
/// bf16 autocast its unrounded f32 sums (`conv2d_bf16_sums`), for an epilogue that adds the bias and
/// rounds once, autocast's placement (`Autocast::conv2d_bias`). `rounded`: which bf16 operands arrive
/// rounded already.
pub(super) fn blocked_conv_sums(
    (isa, autocast): (super::kernels::direct::Isa, Autocast),
    x: &Tensor,
    w: &Tensor,
    geometry: (usize, usize),
    rounded: super::kernels::direct::Rounded,
) -> Result<Tensor> {
    use super::kernels::direct::conv;
    match autocast.tier.filter(|_| autocast.bf16) {
        Some(tier) => conv::conv2d_bf16_sums((isa, tier), x, w, geometry, rounded),
        None if autocast.bf16 => candle_core::bail!("blocked activations under emulated bf16"),
        None => conv::conv2d(isa, x, w, geometry.0, geometry.1),
    }
}

/// `relu(sums + b)` over `blocked_conv_sums`'s output, 2x2 max-pooled as well when `pool` and the planes
/// have a 2x2 window (returns whether it pooled); under bf16 autocast with the bias inside the one
/// rounding.
pub(super) fn blocked_bias_relu(
    autocast: Autocast,
    sums: &Tensor,
    b: &Tensor,
    pool: bool,
) -> Result<(Tensor, bool)> {
    use super::kernels::direct::{bias_relu_pool, elementwise};
    let pool = pool && sums.dim(2)? >= 2 && sums.dim(3)? >= 2;
    let y = match (pool, autocast.bf16) {
        (false, false) => elementwise::bias_relu(sums, b)?,
        (false, true) => elementwise::bias_relu_bf16(sums, b)?,
        (true, false) => bias_relu_pool::bias_relu_pool2(sums, b)?,
        (true, true) => bias_relu_pool::bias_relu_pool2_bf16(sums, b)?,
    };
    Ok((y, pool))
}
