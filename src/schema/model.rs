//! `model:`: which architecture, its size and its classifier head.

use serde::{Deserialize, Serialize};

/// `model.name`: one of the zoo's architectures (each registered where it is defined:
/// `registry::zoo_models`), or a name trainyard sets for you (`declared`, `registered`). Not a closed
/// enum: the names come from the registrations, and an unknown one is refused with the closest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct ModelName(String);

impl ModelName {
    /// A network written in YAML as torch.nn layers (`model.layers`; `schema::declared`).
    pub const DECLARED: &'static str = "declared";
    /// A model a crate registered under its `_target_` (`registry`); set by `schema::extract`.
    pub const REGISTERED: &'static str = "registered";

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is(&self, name: &str) -> bool {
        self.0 == name
    }

    /// Every name `model.name` accepts: the zoo's, then trainyard's own.
    pub fn known() -> Vec<&'static str> {
        let mut names: Vec<&'static str> = crate::registry::zoo_models()
            .iter()
            .map(|m| m.name)
            .collect();
        names.extend([Self::DECLARED, Self::REGISTERED]);
        names
    }
}

impl std::fmt::Display for ModelName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ModelName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        let known = Self::known();
        if known.contains(&name.as_str()) {
            return Ok(ModelName(name));
        }
        let hint = crate::config::errors::did_you_mean(&name, known.iter().copied())
            .map(|m| format!(" (did you mean '{m}'?)"))
            .unwrap_or_default();
        Err(serde::de::Error::custom(format!(
            "unknown model '{name}'{hint}; expected one of {}",
            known.join(", ")
        )))
    }
}

impl schemars::JsonSchema for ModelName {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ModelName".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "enum": Self::known() })
    }
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
