//! Inputs and comparisons of the kernel tests (`direct_conv`, `direct_matmul`, `transformer_kernels`).

use candle_core::{Device, Tensor, Var};

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

/// The gradients of `sum(a · probe)` and `sum(b · probe)` exist for each of `vars` and agree within `tol`, with
/// the same shape.
pub fn assert_same_gradients((a, b): (&Tensor, &Tensor), probe: &Tensor, vars: &[&Var], tol: f32) {
    let grads = |t: &Tensor| (t * probe).unwrap().sum_all().unwrap().backward().unwrap();
    let (g1, g2) = (grads(a), grads(b));
    for v in vars {
        let (x, y) = (g1.get(v.as_tensor()), g2.get(v.as_tensor()));
        let (x, y) = (x.expect("our gradient"), y.expect("the reference gradient"));
        assert_eq!(x.dims(), y.dims(), "gradient shapes of {:?}", v.dims());
        let d = max_diff(x, y);
        assert!(d < tol, "gradient of {:?} differs by {d}", v.dims());
    }
}
