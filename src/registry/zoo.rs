//! trainyard's own architectures, registered where each is defined (`model::zoo`) as a crate registers
//! its model: the `model.name` that picks it, the `_target_`s that build it in a Hydra config
//! (torchvision's constructors), and the `model.*` keys only it reads. The config layer checks names and
//! keys against this table; the model layer builds from its own half of the registration. Adding an
//! architecture is its file plus its `register_zoo_model!`: the names accepted, the keys checked and the
//! reference come from the registrations (a few checks still name the architecture they are about:
//! `vit`'s patch size, `mlp`'s widths, timm's model names).

/// One zoo architecture as a config may name it (written by `register_zoo_model!` only, with its
/// constructor: another crate registers a model with `register_candle_model!`).
#[derive(Debug)]
#[non_exhaustive]
pub struct ZooModel {
    /// `model.name` (`resnet18`).
    pub name: &'static str,
    /// Where it is listed among the others (the reference, "expected one of").
    pub order: u32,
    /// The `_target_`s that build it (`torchvision.models.resnet18`).
    pub targets: &'static [&'static str],
    /// The `model.*` keys that only some architectures read, among them this one (`num_classes`,
    /// `pretrained` and `label_smoothing` are every architecture's).
    pub keys: &'static [&'static str],
    /// Does it put `model.dropout` before its head? (torchvision's ResNets have none: a dropout set on
    /// one is refused rather than ignored.)
    pub dropout: bool,
}

inventory::collect!(ZooModel);

/// Every zoo architecture, in listing order.
pub fn zoo_models() -> Vec<&'static ZooModel> {
    let mut all: Vec<&'static ZooModel> = inventory::iter::<ZooModel>.into_iter().collect();
    all.sort_by_key(|m| (m.order, m.name));
    all
}

/// The architecture `model.name` names.
pub fn zoo_model(name: &str) -> Option<&'static ZooModel> {
    inventory::iter::<ZooModel>
        .into_iter()
        .find(|m| m.name == name)
}

/// The architecture a `_target_` builds (`torchvision.models.resnet50`).
pub fn zoo_model_of_target(target: &str) -> Option<&'static ZooModel> {
    inventory::iter::<ZooModel>
        .into_iter()
        .find(|m| m.targets.contains(&target))
}
