//! The model layer's half of a zoo architecture's registration (`register_zoo_model!`): its constructor,
//! found by `model.name`. The other half (`registry::ZooModel`: the name, its `_target_`s and its keys)
//! is what the config layer checks a config against; one macro call in the architecture's file writes
//! both, so a name the config accepts always has a constructor.

use super::Architecture;
use crate::schema::ModelConfig;

/// Builds an architecture for `channels`-channel square images of side `image_size`.
pub type ZooBuild = fn(&ModelConfig, usize, usize) -> anyhow::Result<Architecture>;

#[non_exhaustive]
pub struct ZooBuilder {
    pub name: &'static str,
    pub build: ZooBuild,
}

inventory::collect!(ZooBuilder);

/// The architecture `cfg.name` names, built.
pub fn build(
    cfg: &ModelConfig,
    channels: usize,
    image_size: usize,
) -> anyhow::Result<Architecture> {
    let name = cfg.name.as_str();
    let builder = inventory::iter::<ZooBuilder>
        .into_iter()
        .find(|b| b.name == name)
        .ok_or_else(|| anyhow::anyhow!("model.name={name}: no zoo architecture has this name"))?;
    (builder.build)(cfg, channels, image_size)
}

/// Register a zoo architecture: its `model.name`, listing order, `_target_`s, own keys and constructor.
macro_rules! register_zoo_model {
    (name: $name:literal, order: $order:literal, targets: [$($target:literal),*], keys: [$($key:literal),*], dropout: $dropout:literal, build: $build:expr $(,)?) => {
        ::inventory::submit! {
            $crate::registry::ZooModel {
                name: $name,
                order: $order,
                targets: &[$($target),*],
                keys: &[$($key),*],
                dropout: $dropout,
            }
        }
        ::inventory::submit! {
            $crate::model::zoo::ZooBuilder { name: $name, build: $build }
        }
    };
}
pub(crate) use register_zoo_model;

#[cfg(test)]
mod tests {
    /// Every name the config layer accepts has a constructor, and no two architectures share a name.
    #[test]
    fn every_registered_name_builds() {
        let names: Vec<&str> = crate::registry::zoo_models()
            .iter()
            .map(|m| m.name)
            .collect();
        let builders: Vec<&str> = inventory::iter::<super::ZooBuilder>
            .into_iter()
            .map(|b| b.name)
            .collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "{names:?}");
        for n in &names {
            assert!(builders.contains(n), "{n} has no constructor");
        }
        let mut targets: Vec<&str> = crate::registry::zoo_models()
            .iter()
            .flat_map(|m| m.targets.iter().copied())
            .collect();
        let count = targets.len();
        targets.sort_unstable();
        targets.dedup();
        assert_eq!(targets.len(), count, "a _target_ names one architecture");
        assert_eq!(
            names,
            [
                "mlp",
                "cnn",
                "resnet18",
                "resnet34",
                "resnet50",
                "resnet101",
                "resnet152",
                "vit"
            ]
        );
    }
}
