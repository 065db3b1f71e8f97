//! Deterministic parameter initialisation on the host, with PyTorch's default rules, so a seed gives the
//! same starting weights in every backend and every process (no broadcast needed to agree).

use crate::platform::rng::Rng;
use crate::tensor::HostTensor;

/// `nn.Conv2d` / `nn.Linear` default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias
/// (kaiming_uniform with a = sqrt(5)).
pub fn pytorch_default(shape: &[usize], fan_in: usize, seed: u64, name: &str) -> HostTensor {
    let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
    uniform(shape, bound, seed, name)
}

pub fn uniform(shape: &[usize], bound: f64, seed: u64, name: &str) -> HostTensor {
    let mut rng = Rng::keyed(&[seed, name_key(name)]);
    let n: usize = shape.iter().product();
    HostTensor {
        shape: shape.to_vec(),
        data: (0..n).map(|_| rng.uniform(-bound, bound) as f32).collect(),
    }
}

/// N(0, std²), keyed like `uniform`.
pub fn normal(shape: &[usize], std: f64, seed: u64, name: &str) -> HostTensor {
    let mut rng = Rng::keyed(&[seed, name_key(name)]);
    let n: usize = shape.iter().product();
    HostTensor {
        shape: shape.to_vec(),
        data: (0..n).map(|_| (rng.normal() * std) as f32).collect(),
    }
}

pub fn constant(shape: &[usize], value: f32) -> HostTensor {
    HostTensor {
        shape: shape.to_vec(),
        data: vec![value; shape.iter().product()],
    }
}

/// Keyed by the parameter's name, so adding a layer does not change the others' initial values.
fn name_key(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01B3)
    })
}
