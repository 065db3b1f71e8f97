//! `trainer.precision=bf16-mixed` on the Candle CPU path: PyTorch autocast's numerics without its kernels.
//! Inside an autocast scope the operands and results of convolutions and matrix products are rounded to
//! bfloat16 (round-to-nearest-even), products accumulate in f32, and everything else (normalisation, softmax,
//! loss, optimizer, master weights) stays f32 — the split PyTorch's autocast makes. The cast's backward rounds
//! gradients to bf16 too, as autocast's bf16 ops do. CPUs without bf16 arithmetic gain no speed from this;
//! it reproduces the accuracy a user will see with bf16 autocast.
//!
//! The switch is thread-local (as `torch.autocast` is): the engine opens a scope around each forward pass.

use candle_core::{DType, Result, Tensor};
use std::cell::Cell;

thread_local! {
    static BF16: Cell<bool> = const { Cell::new(false) };
}

/// Restores the previous autocast state when dropped.
#[must_use = "autocast ends when the guard is dropped"]
pub struct Scope(bool);

/// Enter (or, with `false`, leave) bf16 autocast until the returned scope is dropped.
pub fn bf16(enabled: bool) -> Scope {
    Scope(BF16.with(|c| c.replace(enabled)))
}

impl Drop for Scope {
    fn drop(&mut self) {
        BF16.with(|c| c.set(self.0));
    }
}

pub fn enabled() -> bool {
    BF16.with(|c| c.get())
}

/// `t` rounded to bf16 and back when autocast is on (differentiable); `t` itself otherwise.
pub fn round(t: &Tensor) -> Result<Tensor> {
    if enabled() && t.dtype() == DType::F32 {
        t.to_dtype(DType::BF16)?.to_dtype(DType::F32)
    } else {
        Ok(t.clone())
    }
}

/// `a @ b` (batched, broadcasting) under autocast's rules.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if !enabled() {
        return a.broadcast_matmul(b);
    }
    round(&round(a)?.broadcast_matmul(&round(b)?)?)
}

/// `x @ wᵀ + b` (PyTorch's `nn.Linear`): under autocast, bf16 operands (bias included), one rounding of the
/// f32-accumulated result, as a bf16 `addmm` does.
pub fn linear(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    if !enabled() {
        return x.broadcast_matmul(&w.t()?)?.broadcast_add(b);
    }
    round(
        &round(x)?
            .broadcast_matmul(&round(w)?.t()?)?
            .broadcast_add(&round(b)?)?,
    )
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
    fn matmul_rounds_operands_and_result_only_inside_the_scope() {
        let a = Tensor::new(&[[1.0f32 + 1.0 / 512.0, 3.0]], &Device::Cpu).unwrap();
        let b = Tensor::new(&[[1.0f32], [1.0 / 3.0]], &Device::Cpu).unwrap();
        let full = matmul(&a, &b).unwrap().to_vec2::<f32>().unwrap()[0][0];
        assert_eq!(full, (1.0f32 + 1.0 / 512.0) + 3.0 * (1.0 / 3.0));
        let mixed = {
            let _scope = bf16(true);
            matmul(&a, &b).unwrap().to_vec2::<f32>().unwrap()[0][0]
        };
        let expected = bf16_round(bf16_round(1.0 + 1.0 / 512.0) + 3.0 * bf16_round(1.0 / 3.0));
        assert_eq!(mixed, expected);
        assert_ne!(mixed, full);
        assert!(!enabled(), "the scope restores the previous state");
    }

    #[test]
    fn gradients_flow_through_the_rounding() {
        let w = Var::new(&[[0.1f32, 0.2], [0.3, 0.4]], &Device::Cpu).unwrap();
        let x = Tensor::new(&[[1.0f32, 2.0]], &Device::Cpu).unwrap();
        let _scope = bf16(true);
        let loss = matmul(&x, w.as_tensor()).unwrap().sum_all().unwrap();
        let g = loss.backward().unwrap();
        let gw = g.get(w.as_tensor()).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(gw, vec![vec![1.0, 1.0], vec![2.0, 2.0]]);
        assert_eq!(g.get(w.as_tensor()).unwrap().dtype(), DType::F32);
    }
}
