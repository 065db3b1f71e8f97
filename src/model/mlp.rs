//! The MLP: `nn.Sequential(Flatten, Linear, ReLU, Dropout, ..., Linear)` as `layers.{i}`, head `head`.

use super::spec::{linear_spec, ParamSpec};
use super::stages::numbered_stages;
use crate::schema::ModelConfig;

fn mlp(
    cfg: &ModelConfig,
    channels: usize,
    image_size: usize,
) -> anyhow::Result<super::Architecture> {
    Ok(super::Architecture::Mlp(Mlp::new(
        cfg, channels, image_size,
    )))
}

super::zoo::register_zoo_model!(name: "mlp", order: 0, targets: [], keys: ["hidden"], dropout: true, build: mlp);

pub struct Mlp {
    /// Input features, then each hidden layer's width.
    pub dims: Vec<usize>,
    pub classes: usize,
    pub dropout: f64,
}

impl Mlp {
    pub fn new(cfg: &ModelConfig, channels: usize, image_size: usize) -> Mlp {
        let mut dims = vec![channels * image_size * image_size];
        dims.extend(cfg.hidden.clone().unwrap_or_else(|| vec![512, 256]));
        Mlp {
            dims,
            classes: cfg.num_classes,
            dropout: cfg.dropout,
        }
    }

    /// Hidden layers (Linear, ReLU, Dropout each).
    pub fn depth(&self) -> usize {
        self.dims.len() - 1
    }

    pub fn specs(&self) -> Vec<ParamSpec> {
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

    /// The flatten, each hidden layer, the head.
    pub fn stages(&self) -> Vec<Vec<String>> {
        numbered_stages("layers", self.depth(), &["head"])
    }
}
