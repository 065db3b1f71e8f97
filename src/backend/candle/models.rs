//! The Candle model zoo (so far: mlp, cnn). Each model declares its parameters (name, shape, fan-in) and a
//! forward pass over named variables; names follow PyTorch's `state_dict()` of the equivalent module.

use crate::rng::Rng;
use crate::schema::{ModelConfig, ModelName};
use candle_core::{DType, Result, Tensor, Var, D};
use std::collections::BTreeMap;

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
    pub fn initial_value(&self, seed: u64) -> crate::backend::HostTensor {
        use crate::backend::init;
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
        }
    }
}

pub type Params = BTreeMap<String, Var>;
/// Non-trainable state (BatchNorm running statistics), saved in checkpoints but never optimised.
pub type Buffers = BTreeMap<String, Tensor>;

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
}

pub trait CandleModel: Send {
    fn specs(&self) -> Vec<ParamSpec>;
    /// Buffers with their initial values (name, shape, value).
    fn buffers(&self) -> Vec<(String, Vec<usize>, f32)> {
        Vec::new()
    }
    /// The forward pass's stages (FSDP units, `backend::units`): each stage's parameter name prefixes.
    fn stages(&self) -> Vec<Vec<String>>;
    /// Stage `k` of the forward pass. `rng` drives dropout masks in train mode (deterministic, seeded per
    /// step); train mode updates `buffers`.
    fn forward_stage(
        &self,
        k: usize,
        p: &Params,
        buffers: &mut Buffers,
        x: &Tensor,
        train: bool,
        rng: &mut Rng,
    ) -> Result<Tensor>;
    /// The whole forward pass: the stages in order.
    fn forward(
        &self,
        p: &Params,
        buffers: &mut Buffers,
        x: &Tensor,
        train: bool,
        rng: &mut Rng,
    ) -> Result<Tensor> {
        let mut h = x.clone();
        for k in 0..self.stages().len() {
            h = self.forward_stage(k, p, buffers, &h, train, rng)?;
        }
        Ok(h)
    }
}

fn get<'a>(p: &'a Params, name: &str) -> Result<&'a Var> {
    p.get(name)
        .ok_or_else(|| candle_core::Error::Msg(format!("missing parameter {name}")))
}

/// A parameter's tensor by name, or an error naming it.
pub fn param<'a>(p: &'a Params, name: &str) -> Result<&'a Tensor> {
    get(p, name).map(|v| v.as_tensor())
}

fn linear(p: &Params, prefix: &str, x: &Tensor) -> Result<Tensor> {
    let w = get(p, &format!("{prefix}.weight"))?;
    let b = get(p, &format!("{prefix}.bias"))?;
    super::autocast::linear(x, w, b)
}

/// `relu(conv3x3(x) + bias)`, fused.
fn conv3x3_relu(p: &Params, prefix: &str, x: &Tensor) -> Result<Tensor> {
    let w = get(p, &format!("{prefix}.weight"))?;
    let b = get(p, &format!("{prefix}.bias"))?;
    super::conv_relu::conv2d_bias_relu(x, w, b, 1, 1)
}

/// Inverted dropout with a host-generated mask, so runs are reproducible.
pub fn dropout(x: &Tensor, prob: f64, train: bool, rng: &mut Rng) -> Result<Tensor> {
    if !train || prob <= 0.0 {
        return Ok(x.clone());
    }
    let mask = dropout_mask(x.elem_count(), prob, rng);
    x.mul(&Tensor::from_vec(mask, x.shape(), x.device())?)
}

/// Inverted-dropout multipliers (0 or 1/keep) drawn on the host from the step's seeded generator: every
/// backend draws the same mask, so runs agree across backends.
pub fn dropout_mask(n: usize, prob: f64, rng: &mut Rng) -> Vec<f32> {
    let keep = 1.0 - prob;
    (0..n)
        .map(|_| {
            if rng.next_f64() < keep {
                (1.0 / keep) as f32
            } else {
                0.0
            }
        })
        .collect()
}

fn linear_spec(name: &str, inp: usize, out: usize) -> Vec<ParamSpec> {
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

/// `nn.Sequential(Flatten, Linear, ReLU, Dropout, ..., Linear)` as `layers.{i}`, head `head`.
pub struct Mlp {
    dims: Vec<usize>,
    classes: usize,
    dropout: f64,
}

impl CandleModel for Mlp {
    fn specs(&self) -> Vec<ParamSpec> {
        let mut out = Vec::new();
        for (i, w) in self.dims.windows(2).enumerate() {
            out.extend(linear_spec(&format!("layers.{i}"), w[0], w[1]));
        }
        out.extend(linear_spec(
            "head",
            *self.dims.last().unwrap_or(&1),
            self.classes,
        ));
        out
    }

    fn stages(&self) -> Vec<Vec<String>> {
        crate::backend::units::numbered_stages("layers", self.dims.len() - 1, &["head"])
    }

    fn forward_stage(
        &self,
        k: usize,
        p: &Params,
        _buffers: &mut Buffers,
        x: &Tensor,
        train: bool,
        rng: &mut Rng,
    ) -> Result<Tensor> {
        let layers = self.dims.len() - 1;
        match k {
            0 => x.flatten_from(1),
            k if k <= layers => {
                let h = super::fused::relu(&linear(p, &format!("layers.{}", k - 1), x)?)?;
                dropout(&h, self.dropout, train, rng)
            }
            _ => linear(p, "head", x),
        }
    }
}

/// Conv blocks `blocks.{i}.conv` (3x3, ReLU, 2x2 max-pool), global average pooling, linear `head`.
pub struct Cnn {
    in_channels: usize,
    channels: Vec<usize>,
    classes: usize,
    dropout: f64,
}

impl CandleModel for Cnn {
    fn specs(&self) -> Vec<ParamSpec> {
        let mut out = Vec::new();
        let mut c_in = self.in_channels;
        for (i, &c) in self.channels.iter().enumerate() {
            let fan_in = c_in * 9;
            out.push(ParamSpec {
                name: format!("blocks.{i}.conv.weight"),
                shape: vec![c, c_in, 3, 3],
                fan_in,
                init: Init::Default,
            });
            out.push(ParamSpec {
                name: format!("blocks.{i}.conv.bias"),
                shape: vec![c],
                fan_in,
                init: Init::Default,
            });
            c_in = c;
        }
        out.extend(linear_spec("head", c_in, self.classes));
        out
    }

    fn stages(&self) -> Vec<Vec<String>> {
        crate::backend::units::numbered_stages("blocks", self.channels.len(), &["head"])
    }

    fn forward_stage(
        &self,
        k: usize,
        p: &Params,
        _buffers: &mut Buffers,
        x: &Tensor,
        train: bool,
        rng: &mut Rng,
    ) -> Result<Tensor> {
        match k {
            0 => Ok(x.clone()),
            k if k <= self.channels.len() => {
                let h = conv3x3_relu(p, &format!("blocks.{}.conv", k - 1), x)?;
                if h.dim(2)? < 2 || h.dim(3)? < 2 {
                    Ok(h)
                } else if matches!(h.device(), candle_core::Device::Cpu) {
                    super::fused::max_pool2d(&h, 2, 2, 0)
                } else {
                    h.max_pool2d(2)
                }
            }
            _ => {
                let pooled = x.mean(D::Minus1)?.mean(D::Minus1)?;
                let pooled = dropout(&pooled, self.dropout, train, rng)?;
                linear(p, "head", &pooled)
            }
        }
    }
}

/// Build a zoo model for `channels`-channel `image_size` inputs.
pub fn build(
    cfg: &ModelConfig,
    channels: usize,
    image_size: usize,
) -> anyhow::Result<Box<dyn CandleModel>> {
    Ok(match cfg.name {
        ModelName::Mlp => {
            let mut dims = vec![channels * image_size * image_size];
            dims.extend(cfg.hidden.clone().unwrap_or_else(|| vec![512, 256]));
            Box::new(Mlp {
                dims,
                classes: cfg.num_classes,
                dropout: cfg.dropout,
            })
        }
        ModelName::Cnn => Box::new(Cnn {
            in_channels: channels,
            channels: cfg.channels.clone().unwrap_or_else(|| vec![32, 64, 128]),
            classes: cfg.num_classes,
            dropout: cfg.dropout,
        }),
        ModelName::Resnet18
        | ModelName::Resnet34
        | ModelName::Resnet50
        | ModelName::Resnet101
        | ModelName::Resnet152 => Box::new(super::resnet::ResNet::new(cfg, channels)),
        ModelName::Vit => Box::new(super::vit::Vit::new(cfg, channels, image_size)?),
    })
}

/// The float type parameters are kept in.
pub const PARAM_DTYPE: DType = DType::F32;
