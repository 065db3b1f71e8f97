//! The small CNN: conv blocks `blocks.{i}.conv` (3x3, ReLU, 2x2 max-pool), global average pooling, linear
//! `head`.

use super::spec::{linear_spec, Init, ParamSpec};
use super::stages::numbered_stages;
use crate::schema::ModelConfig;

fn cnn(cfg: &ModelConfig, channels: usize, _: usize) -> anyhow::Result<super::Architecture> {
    Ok(super::Architecture::Cnn(Cnn::new(cfg, channels)))
}

super::zoo::register_zoo_model!(name: "cnn", order: 10, targets: [], keys: ["channels"], dropout: true, build: cnn);

pub struct Cnn {
    pub in_channels: usize,
    /// Each block's output channels.
    pub channels: Vec<usize>,
    pub classes: usize,
    pub dropout: f64,
}

impl Cnn {
    pub fn new(cfg: &ModelConfig, in_channels: usize) -> Cnn {
        Cnn {
            in_channels,
            channels: cfg.channels.clone().unwrap_or_else(|| vec![32, 64, 128]),
            classes: cfg.num_classes,
            dropout: cfg.dropout,
        }
    }

    pub fn blocks(&self) -> usize {
        self.channels.len()
    }

    pub fn specs(&self) -> Vec<ParamSpec> {
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

    /// The input, each conv block, the head.
    pub fn stages(&self) -> Vec<Vec<String>> {
        numbered_stages("blocks", self.blocks(), &["head"])
    }
}
