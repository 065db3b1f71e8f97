//! The model zoo, described once for every backend: each architecture's parameters (torchvision/timm
//! names, shapes, starting values), its BatchNorm buffers and its stages. The backends' forward passes
//! (`backend::candle`, `backend::torch`) read these descriptions; neither backend reads the other.
//! Also here: host-side dropout masks shared by the backends, and matching published weights to a model.

pub mod cnn;
pub mod declared;
pub mod dropout;
pub mod init;
pub mod mlp;
pub mod pos_embed;
pub mod pretrained;
pub mod registered;
pub mod resnet;
pub mod spec;
pub mod stages;
pub mod vit;
pub mod zoo;

use crate::schema::{ModelConfig, ModelName};
use spec::ParamSpec;

/// One of the zoo's architectures, sized for the data set's images.
pub enum Architecture {
    Mlp(mlp::Mlp),
    Cnn(cnn::Cnn),
    ResNet(resnet::ResNet),
    Vit(vit::Vit),
    /// A network written in YAML (`model.name: declared`).
    Declared(declared::Declared),
    /// A model a crate registered under its `_target_` (`registry`).
    Registered(registered::Registered),
}

impl Architecture {
    /// The architecture an experiment's model names, sized for its data: square images, or a registered
    /// dataset's samples (their own shape reaches a registered model; a zoo model reads `[F]` samples as
    /// F channels of one pixel, and refuses images that are not square).
    pub fn of(exp: &crate::schema::Experiment) -> anyhow::Result<Self> {
        let (c, side) = (exp.data.channels, exp.data.image_size);
        let Some(data) = &exp.data.registered else {
            return Self::new(&exp.model, c, side);
        };
        if let [_, h, w] = data.input_shape.as_slice() {
            anyhow::ensure!(
                h == w || exp.model.name.is(ModelName::REGISTERED),
                "model={} with data: _target_ {}: its samples are {:?}, and the zoo's models take square \
                 images (C, H, H); register your own model for other shapes",
                exp.model.name,
                data.spec.target,
                data.input_shape
            );
        }
        Self::sized(&exp.model, c, side, data.input_shape.clone())
    }

    /// The architecture `cfg` names, for `channels`-channel `image_size` inputs.
    pub fn new(cfg: &ModelConfig, channels: usize, image_size: usize) -> anyhow::Result<Self> {
        Self::sized(
            cfg,
            channels,
            image_size,
            vec![channels, image_size, image_size],
        )
    }

    /// `new`, with the samples' own shape for a registered model.
    fn sized(
        cfg: &ModelConfig,
        channels: usize,
        image_size: usize,
        input_shape: Vec<usize>,
    ) -> anyhow::Result<Self> {
        Ok(match cfg.name.as_str() {
            ModelName::DECLARED => {
                let spec = cfg.declared.as_ref().ok_or_else(|| {
                    anyhow::anyhow!("model.name=declared but no model.layers were read")
                })?;
                Architecture::Declared(declared::Declared::new(
                    spec,
                    channels,
                    image_size,
                    cfg.num_classes,
                )?)
            }
            ModelName::REGISTERED => {
                let spec = cfg.registered.as_ref().ok_or_else(|| {
                    anyhow::anyhow!("model.name=registered is set by a registered model's _target_")
                })?;
                let ctx = crate::registry::ModelContext {
                    channels,
                    image_size,
                    input_shape,
                    num_classes: cfg.num_classes,
                };
                Architecture::Registered(registered::Registered::new(spec, ctx)?)
            }
            _ => zoo::build(cfg, channels, image_size)?,
        })
    }

    /// Trainable parameters, in the order the model defines them.
    pub fn specs(&self) -> Vec<ParamSpec> {
        match self {
            Architecture::Mlp(m) => m.specs(),
            Architecture::Cnn(m) => m.specs(),
            Architecture::ResNet(m) => m.specs(),
            Architecture::Vit(m) => m.specs(),
            Architecture::Declared(m) => m.specs(),
            Architecture::Registered(m) => m.specs(),
        }
    }

    /// Buffers (BatchNorm running statistics) with their starting values: (name, shape, value).
    pub fn buffers(&self) -> Vec<(String, Vec<usize>, f32)> {
        match self {
            Architecture::ResNet(m) => m.buffers(),
            Architecture::Declared(m) => m.buffers(),
            // A libtorch model's own buffers: their values are the model's, not these.
            Architecture::Registered(m) => m
                .buffer_shapes()
                .into_iter()
                .map(|(name, shape)| (name, shape, 0.0))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The forward pass's stages, each by its parameter name prefixes (`stages`).
    pub fn stages(&self) -> Vec<Vec<String>> {
        match self {
            Architecture::Mlp(m) => m.stages(),
            Architecture::Cnn(m) => m.stages(),
            Architecture::ResNet(m) => m.stages(),
            Architecture::Vit(m) => m.stages(),
            Architecture::Declared(m) => m.stages(),
            Architecture::Registered(m) => m.stages(),
        }
    }

    /// The classifier head's module names: left as initialised when pretrained weights were trained
    /// for another number of classes.
    pub fn head(&self) -> Vec<String> {
        match self {
            Architecture::ResNet(_) => vec!["fc".into()],
            Architecture::Declared(m) => m.head().into_iter().collect(),
            Architecture::Registered(m) => m.head(),
            _ => vec!["head".into()],
        }
    }
}
