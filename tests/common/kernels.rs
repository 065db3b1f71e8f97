//! Inputs and comparisons of the kernel tests (`direct_conv`, `direct_matmul`, `transformer_kernels`).

use candle_core::{Device, Tensor};

/// `len` values uniform in [-1, 1), the same for the same seed (xorshift).
pub fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// `values` times `scale`.
pub fn scaled(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    values(len, seed).into_iter().map(|v| v * scale).collect()
}

/// A CPU tensor of `values`.
pub fn tensor(shape: &[usize], seed: u64) -> Tensor {
    Tensor::from_vec(values(shape.iter().product(), seed), shape, &Device::Cpu).unwrap()
}

/// The largest |a − b|.
pub fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}
