//! What the hand-written CPU kernels share: reading a tensor's f32 data in place, and the check that a
//! tensor is one they handle (everything else goes to Candle's own ops). The helpers live in
//! `tensor::candle_cpu`, below the optimizer rules that use them too.

pub use crate::tensor::candle_cpu::{f32_slice, is_cpu_f32, with_f32};
#[cfg(test)]
use candle_core::{Device, Tensor};

/// A deterministic test tensor with values uniform in [lo, hi).
#[cfg(test)]
pub fn seeded(shape: &[usize], seed: u64, lo: f32, hi: f32) -> Tensor {
    let mut rng = crate::rng::Rng::new(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| lo + rng.next_f64() as f32 * (hi - lo))
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}
