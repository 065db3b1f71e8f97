//! Multi-head self-attention as one Candle op over the qkv linear layer's output (kernels:
//! `trainyard_conv::attention`), with its backward: no permutes, copies or padded slice gradients. Under
//! bf16 autocast the kernel rounds where autocast's two bf16 products would (`Precision::Bf16`).

use crate::backend::candle::kernels::cpu::{f32_slice as slice, with_f32};
use crate::backend::candle::kernels::tape;
use crate::tensor::candle_cpu::is_cpu_f32;
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
pub use trainyard_conv::attention::Precision;
use trainyard_conv::attention::{backward_at, forward_at, Heads};
use trainyard_conv::Isa;

struct Attention {
    isa: Isa,
    heads: usize,
    scale: f32,
    precision: Precision,
}

impl Attention {
    fn sizes(&self, shape: &Shape) -> Result<Heads> {
        let (batch, n, three_d) = shape.dims3()?;
        if three_d % (3 * self.heads) != 0 {
            candle_core::bail!(
                "attention: qkv {shape:?} is not 3 × {} heads wide",
                self.heads
            );
        }
        Ok(Heads {
            batch,
            n,
            heads: self.heads,
            head_dim: three_d / (3 * self.heads),
        })
    }
}

impl CustomOp1 for Attention {
    fn name(&self) -> &'static str {
        "trainyard-attention"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let h = self.sizes(l.shape())?;
        let out = forward_at(self.isa, self.precision, slice(s, l)?, h, self.scale);
        Ok((
            CpuStorage::F32(out),
            Shape::from((h.batch, h.n, h.heads * h.head_dim)),
        ))
    }

    fn bwd(&self, qkv: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let h = self.sizes(qkv.shape())?;
        let d = with_f32(qkv, |q| {
            with_f32(grad, |g| {
                Ok(backward_at(self.isa, self.precision, q, g, h, self.scale))
            })
        })?;
        Ok(Some(Tensor::from_vec(d, qkv.shape(), qkv.device())?))
    }
}

/// `softmax(q·kᵀ·scale)·v` per head of `qkv` (B, N, 3·D: q, k, v side by side), as (B, N, D); `None`
/// unless f32 on the CPU.
pub fn self_attention(isa: Isa, qkv: &Tensor, heads: usize, scale: f64) -> Result<Option<Tensor>> {
    self_attention_at(isa, Precision::F32, qkv, heads, scale)
}

/// `self_attention` at `precision`: under `Bf16`, bf16 autocast's attention of a `qkv` that holds bf16
/// values (autocast's qkv linear layer rounds its output).
pub fn self_attention_at(
    isa: Isa,
    precision: Precision,
    qkv: &Tensor,
    heads: usize,
    scale: f64,
) -> Result<Option<Tensor>> {
    if !is_cpu_f32(qkv) || qkv.rank() != 3 {
        return Ok(None);
    }
    let op = Attention {
        isa,
        heads,
        scale: scale as f32,
        precision,
    };
    Ok(Some(tape::op1(&qkv.contiguous()?, op)?))
}
