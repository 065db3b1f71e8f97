//! Candle ops over `trainyard_conv::rowwise`: LayerNorm, softmax and GELU over the last dimension, each
//! with its own one-pass backward (candle-nn's fused `layer_norm` and `softmax_last_dim` have none, and
//! the basic-op versions take many passes).

use crate::backend::candle::kernels::cpu::{f32_slice as slice, with_f32};
use crate::backend::candle::kernels::tape;
use crate::tensor::candle_cpu::is_cpu_f32;
use candle_core::{CpuStorage, CustomOp1, CustomOp3, Layout, Result, Shape, Tensor, D};
use trainyard_conv::rowwise;
use trainyard_conv::Isa;

struct LayerNorm {
    isa: Isa,
    eps: f32,
    /// The output stored rounded to bf16 (`layer_norm_rounded`). The backward reads the input, so it is
    /// the same either way.
    round: bool,
}

impl CustomOp3 for LayerNorm {
    fn name(&self) -> &'static str {
        "trainyard-layer-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, w, b) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let y = if self.round {
            rowwise::layer_norm_bf16(self.isa, x, w, b, self.eps)
        } else {
            rowwise::layer_norm(self.isa, x, w, b, self.eps)
        };
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, db) = with_f32(x, |xv| {
            with_f32(w, |wv| {
                with_f32(grad, |g| {
                    Ok(rowwise::layer_norm_backward(self.isa, xv, wv, g, self.eps))
                })
            })
        })?;
        let dev = x.device();
        Ok((
            Some(Tensor::from_vec(dx, x.shape(), dev)?),
            Some(Tensor::from_vec(dw, w.shape(), dev)?),
            Some(Tensor::from_vec(db, b.shape(), dev)?),
        ))
    }
}

struct Softmax {
    isa: Isa,
}

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "trainyard-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let dim = *l.dims().last().unwrap_or(&1);
        Ok((
            CpuStorage::F32(rowwise::softmax(self.isa, slice(s, l)?, dim)),
            l.shape().clone(),
        ))
    }

    fn bwd(&self, x: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let dim = x.dim(D::Minus1)?;
        let dx = with_f32(res, |y| {
            with_f32(grad, |g| Ok(rowwise::softmax_backward(self.isa, y, g, dim)))
        })?;
        Ok(Some(Tensor::from_vec(dx, x.shape(), x.device())?))
    }
}

struct Gelu {
    isa: Isa,
    /// The output and the gradient it passes back stored rounded to bf16 (`gelu_erf_rounded`).
    round: bool,
}

impl CustomOp1 for Gelu {
    fn name(&self) -> &'static str {
        "trainyard-gelu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        Ok((
            CpuStorage::F32(if self.round {
                rowwise::gelu_bf16(self.isa, slice(s, l)?)
            } else {
                rowwise::gelu(self.isa, slice(s, l)?)
            }),
            l.shape().clone(),
        ))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let dx = with_f32(x, |xv| {
            with_f32(grad, |g| {
                Ok(if self.round {
                    rowwise::gelu_backward_bf16(self.isa, xv, g)
                } else {
                    rowwise::gelu_backward(self.isa, xv, g)
                })
            })
        })?;
        Ok(Some(Tensor::from_vec(dx, x.shape(), x.device())?))
    }
}

/// LayerNorm over the last dimension with weight `w` and bias `b` (f32 CPU tensors; `None` otherwise, so
/// the caller composes it from basic ops).
pub fn layer_norm(
    isa: Isa,
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    eps: f64,
) -> Result<Option<Tensor>> {
    layer_norm_to(isa, x, (w, b), eps, false)
}

/// `layer_norm` with its output stored rounded to bf16 (kept as f32): under bf16 autocast, for a
/// LayerNorm whose only reader is a bf16 product, which would round it anyway and then reads it in place.
/// Its gradient is the same as `layer_norm`'s.
pub fn layer_norm_rounded(
    isa: Isa,
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    eps: f64,
) -> Result<Option<Tensor>> {
    layer_norm_to(isa, x, (w, b), eps, true)
}

fn layer_norm_to(
    isa: Isa,
    x: &Tensor,
    (w, b): (&Tensor, &Tensor),
    eps: f64,
    round: bool,
) -> Result<Option<Tensor>> {
    if !(is_cpu_f32(x) && is_cpu_f32(w) && is_cpu_f32(b))
        || w.rank() != 1
        || x.dim(D::Minus1)? != w.dim(0)?
    {
        return Ok(None);
    }
    let op = LayerNorm {
        isa,
        eps: eps as f32,
        round,
    };
    Ok(Some(tape::op3(&x.contiguous()?, w, b, op)?))
}

/// Softmax over the last dimension (`None` unless f32 on the CPU).
pub fn softmax_last_dim(isa: Isa, x: &Tensor) -> Result<Option<Tensor>> {
    if !is_cpu_f32(x) {
        return Ok(None);
    }
    Ok(Some(tape::op1(&x.contiguous()?, Softmax { isa })?))
}

/// GELU, erf form (`None` unless f32 on the CPU).
pub fn gelu_erf(isa: Isa, x: &Tensor) -> Result<Option<Tensor>> {
    gelu_erf_to(isa, x, false)
}

/// `gelu_erf` with its output, and the gradient it passes back, stored rounded to bf16 (kept as f32):
/// GELU under bf16 autocast, whose input is a bf16 product's result, so its output and that input's
/// gradient are bf16 too, as in PyTorch.
pub fn gelu_erf_rounded(isa: Isa, x: &Tensor) -> Result<Option<Tensor>> {
    gelu_erf_to(isa, x, true)
}

fn gelu_erf_to(isa: Isa, x: &Tensor, round: bool) -> Result<Option<Tensor>> {
    if !is_cpu_f32(x) {
        return Ok(None);
    }
    Ok(Some(tape::op1(&x.contiguous()?, Gelu { isa, round })?))
}
