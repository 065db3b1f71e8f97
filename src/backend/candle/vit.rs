//! The Vision Transformer on Candle (the architecture, with timm's names: `model::vit`).
//!
//! Softmax and LayerNorm are written from basic ops on purpose: candle-nn's fused `softmax_last_dim` and
//! `layer_norm` have no backward pass, so gradients would silently stop before them.

use super::autocast::Autocast;
use super::kernels::direct::Rounded;
use super::kernels::tape::ops;
use super::models::{param, Buffers, CandleForward, Params, Pass};
use crate::model::vit::Vit;
use candle_core::{Result, Tensor, D};

/// timm's ViT LayerNorm epsilon.
const LN_EPS: f64 = 1e-6;

fn linear(
    p: &Params,
    name: &str,
    (x, rounded): (&Tensor, Rounded),
    ac: Autocast,
) -> Result<Tensor> {
    let w = param(p, &format!("{name}.weight"))?;
    let b = param(p, &format!("{name}.bias"))?;
    ac.linear_of((x, rounded), w, b)
}

/// timm's LayerNorm (eps 1e-6) over the last dimension.
pub fn layer_norm(p: &Params, name: &str, x: &Tensor) -> Result<Tensor> {
    layer_norm_eps(p, name, x, LN_EPS)
}

/// timm's LayerNorm whose only reader is a linear layer: under bf16 autocast its output is stored rounded
/// to bf16, which that layer's cast would do anyway, so the layer reads it in place (`Rounded::input`).
/// Its gradient is unchanged: it comes from the layer's backward, rounded either way.
fn layer_norm_for_linear(p: &Params, name: &str, x: &Tensor, ac: Autocast) -> Result<Tensor> {
    layer_norm_at(p, name, x, (LN_EPS, ac.bf16))
}

/// LayerNorm over the last dimension: the row-wise kernel where it runs, basic ops (differentiable)
/// elsewhere.
pub(super) fn layer_norm_eps(p: &Params, name: &str, x: &Tensor, eps: f64) -> Result<Tensor> {
    layer_norm_at(p, name, x, (eps, false))
}

fn layer_norm_at(p: &Params, name: &str, x: &Tensor, (eps, round): (f64, bool)) -> Result<Tensor> {
    let (w, b) = (
        param(p, &format!("{name}.weight"))?,
        param(p, &format!("{name}.bias"))?,
    );
    if let Some(isa) = super::kernels::direct::active() {
        use super::kernels::direct::rowwise;
        let fused = if round {
            rowwise::layer_norm_rounded(isa, x, w, b, eps)?
        } else {
            rowwise::layer_norm(isa, x, w, b, eps)?
        };
        if let Some(y) = fused {
            return Ok(y);
        }
    }
    let mean = x.mean_keepdim(D::Minus1)?;
    let centered = x.broadcast_sub(&mean)?;
    let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = centered.broadcast_div(&(var + eps)?.sqrt()?)?;
    let y = normed.broadcast_mul(w)?.broadcast_add(b)?;
    rounded_if(y, round)
}

/// `y` rounded to bf16 (the rounding op, differentiable) when `round`.
fn rounded_if(y: Tensor, round: bool) -> Result<Tensor> {
    if round {
        Autocast::EMULATED.round(&y)
    } else {
        Ok(y)
    }
}

/// Softmax over the last dimension from basic ops (differentiable). The max is a constant shift, so
/// it is detached.
fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    if let Some(isa) = super::kernels::direct::active() {
        if let Some(y) = super::kernels::direct::rowwise::softmax_last_dim(isa, x)? {
            return Ok(y);
        }
    }
    let shifted = x.broadcast_sub(&x.max_keepdim(D::Minus1)?.detach())?;
    let e = shifted.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// GELU (erf form): one pass each way on the blocked path's CPUs, Candle's op otherwise.
pub(super) fn gelu_erf(x: &Tensor) -> Result<Tensor> {
    gelu_erf_at(x, false)
}

/// GELU whose output, and the gradient it passes back, are stored rounded to bf16 when `round`: under bf16
/// autocast, GELU of a bf16 product's result returns bf16 in PyTorch, and its input's gradient is bf16.
/// (Candle's op, where the row-wise kernel does not run, rounds its output only; no linear layer reads
/// the gradient in place there, as none runs on the bf16 kernels.)
fn gelu_erf_at(x: &Tensor, round: bool) -> Result<Tensor> {
    if let Some(isa) = super::kernels::direct::active() {
        use super::kernels::direct::rowwise;
        let fused = if round {
            rowwise::gelu_erf_rounded(isa, x)?
        } else {
            rowwise::gelu_erf(isa, x)?
        };
        if let Some(y) = fused {
            return Ok(y);
        }
    }
    rounded_if(x.gelu_erf()?, round)
}

/// Multi-head self-attention of block `name` (`vit.heads` heads).
fn attention(vit: &Vit, p: &Params, name: &str, x: &Tensor, ac: Autocast) -> Result<Tensor> {
    let (b, n, d) = x.dims3()?;
    let hd = d / vit.heads;
    // `x`: the LayerNorm rounded for this layer; the attention, its only reader, passes back bf16s.
    let both = Rounded {
        input: true,
        grad: true,
    };
    let qkv = linear(p, &format!("{name}.qkv"), (x, both), ac)?;
    // Its output, the attention's, is rounded as the second bf16 product's is; its gradient comes from
    // the residual add.
    let input = Rounded {
        input: true,
        grad: false,
    };
    let scale = 1.0 / (hd as f64).sqrt();
    if let Some(isa) = super::kernels::direct::active() {
        // Under autocast the fused op rounds where the composed one below would (`qkv` is rounded: the
        // linear layer's bf16 result).
        use super::kernels::direct::attention::{self_attention_at, Precision};
        let precision = if ac.bf16 {
            Precision::Bf16
        } else {
            Precision::F32
        };
        if let Some(out) = self_attention_at(isa, precision, &qkv, vit.heads, scale)? {
            return linear(p, &format!("{name}.proj"), (&out, input), ac);
        }
    }
    let qkv = qkv
        .reshape((b, n, 3, vit.heads, hd))?
        .permute((2, 0, 3, 1, 4))?;
    let q = qkv.get(0)?.contiguous()?;
    let k = qkv.get(1)?.contiguous()?;
    let v = qkv.get(2)?.contiguous()?;
    let scores = (ac.matmul(&q, &k.t()?.contiguous()?)? * scale)?;
    let attn = softmax_last_dim(&scores)?;
    let out = ac.matmul(&attn, &v)?.transpose(1, 2)?.reshape((b, n, d))?;
    linear(p, &format!("{name}.proj"), (&out, input), ac)
}

impl CandleForward for Vit {
    fn forward_stage(
        &self,
        k: usize,
        p: &Params,
        _b: &mut Buffers,
        x: &Tensor,
        pass: &mut Pass,
    ) -> Result<Tensor> {
        if k == 0 {
            let batch = x.dim(0)?;
            let w = param(p, "patch_embed.proj.weight")?;
            let bias = param(p, "patch_embed.proj.bias")?;
            let patches = pass.autocast.conv2d_bias(x, w, bias, self.patch, 0)?;
            // Candle's ops through `ops`, so the body stays on the backward tape.
            // (B, D, g, g) -> (B, g*g, D)
            let cells = patches.dim(2)? * patches.dim(3)?;
            let tokens = ops::transpose(&ops::reshape(&patches, (batch, self.dim, cells))?, 1, 2)?;
            let cls = ops::broadcast_as(param(p, "cls_token")?, (batch, 1, self.dim))?;
            let h = ops::broadcast_add(&ops::cat(&[&cls, &tokens], 1)?, param(p, "pos_embed")?)?;
            return super::models::dropout(&h, self.dropout, pass);
        }
        if k > self.depth {
            let h = layer_norm(p, "norm", x)?;
            // timm's default global_pool='token': the class token.
            let cls = h.narrow(1, 0, 1)?.squeeze(1)?;
            return linear(p, "head", (&cls, Rounded::NONE), pass.autocast);
        }
        let blk = format!("blocks.{}", k - 1);
        let ac = pass.autocast;
        let a = attention(
            self,
            p,
            &format!("{blk}.attn"),
            &layer_norm_for_linear(p, &format!("{blk}.norm1"), x, ac)?,
            ac,
        )?;
        let h = ops::broadcast_add(x, &super::models::dropout(&a, self.dropout, pass)?)?;
        let normed = layer_norm_for_linear(p, &format!("{blk}.norm2"), &h, ac)?;
        // Its input rounded for it; GELU, its only reader, passes back bf16s.
        let both = Rounded {
            input: true,
            grad: true,
        };
        let m = linear(p, &format!("{blk}.mlp.fc1"), (&normed, both), ac)?;
        let m = gelu_erf_at(&m, ac.bf16)?;
        // GELU's bf16s, unless dropout scaled what it kept; the gradient comes from the residual add.
        let fc2 = Rounded {
            input: !(pass.train && self.dropout > 0.0),
            grad: false,
        };
        let m = super::models::dropout(&m, self.dropout, pass)?;
        let m = linear(p, &format!("{blk}.mlp.fc2"), (&m, fc2), ac)?;
        ops::broadcast_add(&h, &super::models::dropout(&m, self.dropout, pass)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn softmax_and_layer_norm_have_gradients() {
        let x = Var::from_tensor(
            &Tensor::new(&[[1f32, 2.0, 3.0], [0.5, -1.0, 2.0]], &Device::Cpu).unwrap(),
        )
        .unwrap();
        let probe = Tensor::new(&[[1f32, -2.0, 0.5], [3.0, 1.0, -1.0]], &Device::Cpu).unwrap();
        let s = softmax_last_dim(&x).unwrap();
        let reference = candle_nn::ops::softmax_last_dim(&x).unwrap();
        let diff = crate::backend::candle::kernels::cpu::max_abs_diff(&s, &reference);
        assert!(diff < 1e-6);
        let g = (s * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let gx = g.get(&x).unwrap().to_vec2::<f32>().unwrap();
        // d/dx_i sum_j p_j s_j = s_i (p_i - sum_j p_j s_j)
        let sv = reference.to_vec2::<f32>().unwrap();
        let pv = probe.to_vec2::<f32>().unwrap();
        for r in 0..2 {
            let dot: f32 = (0..3).map(|j| sv[r][j] * pv[r][j]).sum();
            for i in 0..3 {
                assert!((gx[r][i] - sv[r][i] * (pv[r][i] - dot)).abs() < 1e-5);
            }
        }
    }
}
