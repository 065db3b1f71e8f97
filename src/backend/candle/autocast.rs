//! `trainer.precision=bf16-mixed` on the Candle CPU path: PyTorch autocast's numerics without its kernels.
//! Under bf16 autocast the operands and results of convolutions and matrix products are rounded to
//! bfloat16 (round-to-nearest-even), products accumulate in f32, and everything else (normalisation, softmax,
//! loss, optimizer, master weights) stays f32 — the split PyTorch's autocast makes. The cast's backward rounds
//! gradients to bf16 too, as autocast's bf16 ops do. CPUs without bf16 arithmetic gain no speed from this;
//! it reproduces the accuracy a user will see with bf16 autocast.
//!
//! Where `torch.autocast` is a thread-local switch, here the mode is a value each forward pass carries
//! (`models::Pass`), so nothing outside the call decides how it computes.

use candle_core::{DType, Result, Tensor};

/// The autocast mode of one forward pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Autocast {
    /// bf16 rounding of matrix products' and convolutions' operands and results.
    pub bf16: bool,
}

impl Autocast {
    /// No autocast: every op in f32.
    pub const OFF: Autocast = Autocast { bf16: false };

    /// `t` rounded to bf16 and back when autocast is on (differentiable); `t` itself otherwise.
    pub fn round(self, t: &Tensor) -> Result<Tensor> {
        if self.bf16 && t.dtype() == DType::F32 {
            t.to_dtype(DType::BF16)?.to_dtype(DType::F32)
        } else {
            Ok(t.clone())
        }
    }

    /// `a @ b` (batched, broadcasting) under autocast's rules.
    pub fn matmul(self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        if !self.bf16 {
            return match super::kernels::direct::active() {
                Some(isa) => super::kernels::direct::matmul::matmul(isa, a, b),
                None => a.broadcast_matmul(b),
            };
        }
        self.round(&self.round(a)?.broadcast_matmul(&self.round(b)?)?)
    }

    /// `x @ wᵀ + b` (PyTorch's `nn.Linear`): under autocast, bf16 operands (bias included), one rounding
    /// of the f32-accumulated result, as a bf16 `addmm` does.
    pub fn linear(self, x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
        if !self.bf16 {
            return match super::kernels::direct::active() {
                Some(isa) => super::kernels::direct::matmul::linear(isa, x, w, b),
                None => x.broadcast_matmul(&w.t()?)?.broadcast_add(b),
            };
        }
        self.round(
            &self
                .round(x)?
                .broadcast_matmul(&self.round(w)?.t()?)?
                .broadcast_add(&self.round(b)?)?,
        )
    }

    /// `conv2d(x, w)` (`conv::conv2d`): under autocast, bf16 operands and one rounding of the result.
    pub fn conv2d(self, x: &Tensor, w: &Tensor, stride: usize, padding: usize) -> Result<Tensor> {
        if !self.bf16 {
            return super::kernels::conv::conv2d(x, w, stride, padding);
        }
        let y = super::kernels::conv::conv2d(&self.round(x)?, &self.round(w)?, stride, padding)?;
        self.round(&y)
    }

    /// `relu(conv2d(x, w) + bias)`: the fused op, or under autocast (which rounds the conv's result) the
    /// composition of the separate ops.
    pub fn conv2d_bias_relu(
        self,
        x: &Tensor,
        w: &Tensor,
        bias: &Tensor,
        stride: usize,
        padding: usize,
    ) -> Result<Tensor> {
        if !self.bf16 {
            return super::kernels::conv_relu::conv2d_bias_relu(x, w, bias, stride, padding);
        }
        let y = self.conv2d(x, w, stride, padding)?;
        super::kernels::fused::relu(&super::kernels::fused::add_channel_bias(&y, bias)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// Round-to-nearest-even to bf16 (finite values), written out so the test does not trust Candle's cast.
    fn bf16_round(v: f32) -> f32 {
        let bits = v.to_bits();
        f32::from_bits(((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16)
    }

    #[test]
    fn matmul_rounds_operands_and_result_only_under_autocast() {
        let a = Tensor::new(&[[1.0f32 + 1.0 / 512.0, 3.0]], &Device::Cpu).unwrap();
        let b = Tensor::new(&[[1.0f32], [1.0 / 3.0]], &Device::Cpu).unwrap();
        let full = Autocast::OFF
            .matmul(&a, &b)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap()[0][0];
        assert_eq!(full, (1.0f32 + 1.0 / 512.0) + 3.0 * (1.0 / 3.0));
        let mixed = Autocast { bf16: true }
            .matmul(&a, &b)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap()[0][0];
        let expected = bf16_round(bf16_round(1.0 + 1.0 / 512.0) + 3.0 * bf16_round(1.0 / 3.0));
        assert_eq!(mixed, expected);
        assert_ne!(mixed, full);
    }

    #[test]
    fn gradients_flow_through_the_rounding() {
        let w = Var::new(&[[0.1f32, 0.2], [0.3, 0.4]], &Device::Cpu).unwrap();
        let x = Tensor::new(&[[1.0f32, 2.0]], &Device::Cpu).unwrap();
        let loss = Autocast { bf16: true }
            .matmul(&x, w.as_tensor())
            .unwrap()
            .sum_all()
            .unwrap();
        let g = loss.backward().unwrap();
        let gw = g.get(w.as_tensor()).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(gw, vec![vec![1.0, 1.0], vec![2.0, 2.0]]);
        assert_eq!(g.get(w.as_tensor()).unwrap().dtype(), DType::F32);
    }
}
