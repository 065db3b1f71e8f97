//! What a model parameter is before any backend holds it: its torchvision/timm name, shape, fan-in and
//! starting rule. The value is drawn on the host from the seed and the name, so every backend and every
//! rank starts from the same weights.

use super::init;
use crate::tensor::HostTensor;

/// A parameter to create: its name, shape and fan-in (for PyTorch's default init).
#[derive(Debug, Clone)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub fan_in: usize,
    pub init: Init,
}

impl ParamSpec {
    /// The parameter's starting value, drawn on the host from the seed and its name, so every backend
    /// (and every rank) starts from the same weights.
    pub fn initial_value(&self, seed: u64) -> HostTensor {
        match self.init {
            Init::Default => init::pytorch_default(&self.shape, self.fan_in, seed, &self.name),
            Init::KaimingNormalFanOut(fan_out) => init::normal(
                &self.shape,
                (2.0 / fan_out.max(1) as f64).sqrt(),
                seed,
                &self.name,
            ),
            Init::Constant(v) => init::constant(&self.shape, v),
            Init::Normal(std) => init::normal(&self.shape, std, seed, &self.name),
            Init::NormalMean(mean, std) => {
                let mut t = init::normal(&self.shape, std, seed, &self.name);
                t.data.iter_mut().for_each(|v| *v += mean as f32);
                t
            }
            Init::Uniform(lo, hi) => {
                let mut t = init::uniform(&self.shape, (hi - lo) / 2.0, seed, &self.name);
                let mid = ((hi + lo) / 2.0) as f32;
                t.data.iter_mut().for_each(|v| *v += mid);
                t
            }
        }
    }
}

/// How a parameter starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// PyTorch's `nn.Linear`/`nn.Conv2d` default: U(±1/sqrt(fan_in)).
    Default,
    /// torchvision ResNet convs: kaiming_normal_(mode="fan_out", nonlinearity="relu"): N(0, 2/fan_out).
    KaimingNormalFanOut(usize),
    Constant(f32),
    /// N(0, std²) (timm's trunc_normal_ at ±2 absolute, which for small std never truncates).
    Normal(f64),
    /// N(mean, std²) (candle-nn's `Init::Randn`).
    NormalMean(f64, f64),
    /// U(lo, hi) (candle-nn's `Init::Uniform`, and its uniform Kaiming).
    Uniform(f64, f64),
}

pub fn linear_spec(name: &str, inp: usize, out: usize) -> Vec<ParamSpec> {
    vec![
        ParamSpec {
            name: format!("{name}.weight"),
            shape: vec![out, inp],
            fan_in: inp,
            init: Init::Default,
        },
        ParamSpec {
            name: format!("{name}.bias"),
            shape: vec![out],
            fan_in: inp,
            init: Init::Default,
        },
    ]
}
