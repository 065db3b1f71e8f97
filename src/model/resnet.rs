//! ResNet-18/34/50/101/152 as torchvision builds them: parameter names (`conv1`, `bn1`,
//! `layer{1..4}.{i}.*`, `downsample.{0,1}`, `fc`), shapes, initialisation (kaiming fan-out convs, BatchNorm
//! gamma 1 or 0 with `zero_init_residual`), BatchNorm buffers and the block layout both backends' forward
//! passes follow. `cifar_stem`: a 3x3 stride-1 first conv and no max-pool, for 32x32 images.

use super::spec::{Init, ParamSpec};
use crate::schema::ModelConfig;

pub struct ResNet {
    bottleneck: bool,
    blocks: [usize; 4],
    in_channels: usize,
    classes: usize,
    cifar_stem: bool,
    zero_init_residual: bool,
}

/// One of torchvision's depths: basic blocks (18, 34) or bottlenecks (50 and deeper), and its blocks per
/// stage, registered under its name and torchvision's `_target_`.
macro_rules! resnet {
    ($name:literal, $target:literal, $order:literal, $bottleneck:literal, $blocks:expr) => {
        super::zoo::register_zoo_model!(name: $name, order: $order, targets: [$target],
            keys: ["cifar_stem", "zero_init_residual"], dropout: false,
            build: |cfg, c, _| Ok(super::Architecture::ResNet(ResNet::new(cfg, c, $bottleneck, $blocks))));
    };
}

resnet!(
    "resnet18",
    "torchvision.models.resnet18",
    20,
    false,
    [2, 2, 2, 2]
);
resnet!(
    "resnet34",
    "torchvision.models.resnet34",
    21,
    false,
    [3, 4, 6, 3]
);
resnet!(
    "resnet50",
    "torchvision.models.resnet50",
    22,
    true,
    [3, 4, 6, 3]
);
resnet!(
    "resnet101",
    "torchvision.models.resnet101",
    23,
    true,
    [3, 4, 23, 3]
);
resnet!(
    "resnet152",
    "torchvision.models.resnet152",
    24,
    true,
    [3, 8, 36, 3]
);

impl ResNet {
    pub fn new(
        cfg: &ModelConfig,
        in_channels: usize,
        bottleneck: bool,
        blocks: [usize; 4],
    ) -> Self {
        ResNet {
            bottleneck,
            blocks,
            in_channels,
            classes: cfg.num_classes,
            cifar_stem: cfg.cifar_stem,
            zero_init_residual: cfg.zero_init_residual,
        }
    }

    /// Bottleneck blocks (ResNet-50 and deeper) or basic blocks.
    pub fn bottleneck(&self) -> bool {
        self.bottleneck
    }

    /// The CIFAR stem: 3x3 stride-1 first conv and no max-pool.
    pub fn cifar_stem(&self) -> bool {
        self.cifar_stem
    }

    pub fn expansion(&self) -> usize {
        if self.bottleneck {
            4
        } else {
            1
        }
    }

    /// FSDP units in forward order: the stem (`conv1`, `bn1`), each residual block, the head (`fc`).
    pub fn stages(&self) -> Vec<Vec<String>> {
        let mut stages = vec![vec!["conv1".to_string(), "bn1".to_string()]];
        stages.extend(self.layout().into_iter().map(|(name, ..)| vec![name]));
        stages.push(vec!["fc".to_string()]);
        stages
    }

    /// Every block: (name prefix, in channels, width, stride).
    /// Every residual block: (name, input channels, width, stride).
    pub fn layout(&self) -> Vec<(String, usize, usize, usize)> {
        let mut out = Vec::new();
        let mut c_in = 64;
        for (layer, &n) in self.blocks.iter().enumerate() {
            let width = 64 << layer;
            for i in 0..n {
                let stride = if i == 0 && layer > 0 { 2 } else { 1 };
                out.push((format!("layer{}.{i}", layer + 1), c_in, width, stride));
                c_in = width * self.expansion();
            }
        }
        out
    }

    /// Parameters in torchvision's order and names.
    pub fn specs(&self) -> Vec<ParamSpec> {
        let mut out = Vec::new();
        let k = if self.cifar_stem { 3 } else { 7 };
        conv_spec(&mut out, "conv1", 64, self.in_channels, k);
        bn_spec(&mut out, "bn1", 64, 1.0);
        let last_gamma = if self.zero_init_residual { 0.0 } else { 1.0 };
        for (name, c_in, width, stride) in self.layout() {
            let c_out = width * self.expansion();
            if self.bottleneck {
                conv_spec(&mut out, &format!("{name}.conv1"), width, c_in, 1);
                bn_spec(&mut out, &format!("{name}.bn1"), width, 1.0);
                conv_spec(&mut out, &format!("{name}.conv2"), width, width, 3);
                bn_spec(&mut out, &format!("{name}.bn2"), width, 1.0);
                conv_spec(&mut out, &format!("{name}.conv3"), c_out, width, 1);
                bn_spec(&mut out, &format!("{name}.bn3"), c_out, last_gamma);
            } else {
                conv_spec(&mut out, &format!("{name}.conv1"), width, c_in, 3);
                bn_spec(&mut out, &format!("{name}.bn1"), width, 1.0);
                conv_spec(&mut out, &format!("{name}.conv2"), width, width, 3);
                bn_spec(&mut out, &format!("{name}.bn2"), width, last_gamma);
            }
            if stride != 1 || c_in != c_out {
                conv_spec(&mut out, &format!("{name}.downsample.0"), c_out, c_in, 1);
                bn_spec(&mut out, &format!("{name}.downsample.1"), c_out, 1.0);
            }
        }
        let features = 512 * self.expansion();
        out.push(ParamSpec {
            name: "fc.weight".into(),
            shape: vec![self.classes, features],
            fan_in: features,
            init: Init::Default,
        });
        out.push(ParamSpec {
            name: "fc.bias".into(),
            shape: vec![self.classes],
            fan_in: features,
            init: Init::Default,
        });
        out
    }

    /// BatchNorm running statistics with their starting values (name, shape, value).
    pub fn buffers(&self) -> Vec<(String, Vec<usize>, f32)> {
        let mut out = Vec::new();
        for spec in self.specs() {
            if let Some(bn) = spec.name.strip_suffix(".bias") {
                let is_bn = bn.ends_with("bn1")
                    || bn.ends_with("bn2")
                    || bn.ends_with("bn3")
                    || bn.ends_with("downsample.1");
                if is_bn {
                    bn_buffers(&mut out, bn, spec.shape[0]);
                }
            }
        }
        out
    }
}

fn conv_spec(out: &mut Vec<ParamSpec>, name: &str, c_out: usize, c_in: usize, k: usize) {
    out.push(ParamSpec {
        name: format!("{name}.weight"),
        shape: vec![c_out, c_in, k, k],
        fan_in: c_in * k * k,
        init: Init::KaimingNormalFanOut(c_out * k * k),
    });
}

fn bn_spec(out: &mut Vec<ParamSpec>, name: &str, c: usize, gamma: f32) {
    out.push(ParamSpec {
        name: format!("{name}.weight"),
        shape: vec![c],
        fan_in: c,
        init: Init::Constant(gamma),
    });
    out.push(ParamSpec {
        name: format!("{name}.bias"),
        shape: vec![c],
        fan_in: c,
        init: Init::Constant(0.0),
    });
}

fn bn_buffers(out: &mut Vec<(String, Vec<usize>, f32)>, name: &str, c: usize) {
    out.push((format!("{name}.running_mean"), vec![c], 0.0));
    out.push((format!("{name}.running_var"), vec![c], 1.0));
    out.push((format!("{name}.num_batches_tracked"), vec![], 0.0));
}
