//! `model:`: which architecture, its size and its classifier head.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ModelName {
    Mlp,
    Cnn,
    Resnet18,
    Resnet34,
    Resnet50,
    Resnet101,
    Resnet152,
    Vit,
    /// A network written in YAML as torch.nn layers (`model.layers`; `schema::declared`).
    Declared,
    /// A model a crate registered under its `_target_` (`registry`); set by `schema::extract`.
    Registered,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum VitVariant {
    Tiny,
    Small,
    Base,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The architecture: a zoo model (torchvision's/timm's names) or one set for you (`declared`,
    /// `registered`).
    pub name: ModelName,
    /// Outputs of the classifier head (usually `${data.num_classes}`).
    pub num_classes: usize,
    /// mlp: hidden layer widths.
    #[serde(default)]
    pub hidden: Option<Vec<usize>>,
    /// cnn: channels of each conv block.
    #[serde(default)]
    pub channels: Option<Vec<usize>>,
    /// Dropout before the classifier head (mlp, cnn, vit).
    #[serde(default)]
    pub dropout: f64,
    /// resnet: 3x3 stride-1 stem without max-pool, for 32x32 images.
    #[serde(default)]
    pub cifar_stem: bool,
    /// resnet: each residual block's last BatchNorm starts at zero (torchvision's `zero_init_residual`).
    #[serde(default)]
    pub zero_init_residual: bool,
    /// vit: tiny | small | base.
    #[serde(default)]
    pub variant: Option<VitVariant>,
    /// vit: side of a square patch (16 or 32 for the published weights); must divide the image size.
    #[serde(default)]
    pub patch_size: Option<usize>,
    /// vit: input resolution (position embeddings are interpolated when loading other sizes).
    #[serde(default)]
    pub image_size: Option<usize>,
    /// A safetensors file with torchvision/timm parameter names.
    #[serde(default)]
    pub pretrained: Option<String>,
    /// Cross-entropy label smoothing in [0, 1), as `nn.CrossEntropyLoss(label_smoothing=...)`.
    #[serde(default)]
    pub label_smoothing: f64,
    /// `declared`: the layers, read from `model.layers`/`model.blocks` with their provenance (not serde's:
    /// `schema::extract` fills it).
    #[serde(skip)]
    pub declared: Option<std::sync::Arc<super::declared::DeclaredSpec>>,
    /// `registered`: the `_target_` and its arguments (`schema::extract` fills it).
    #[serde(skip)]
    pub registered: Option<std::sync::Arc<super::RegisteredSpec>>,
}
