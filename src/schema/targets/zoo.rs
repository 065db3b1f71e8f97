//! `model: {_target_: torchvision.models.resnet50, num_classes: 10}`, as a Hydra project instantiates
//! torchvision's constructors: the `_target_`s each zoo architecture registered (`registry::ZooModel`)
//! become its `model.name`. torchvision's keyword arguments keep their meaning: `num_classes` is the
//! head's width, `weights: null` (or the older `pretrained: false`) builds from scratch, `progress` only
//! matters to a download, and `zero_init_residual` is trainyard's key too. Its ResNet variants
//! (`groups`, `width_per_group`, `replace_stride_with_dilation`, `norm_layer`) are accepted at their
//! defaults, which is what the zoo builds, and refused otherwise. `vit_b_16` and `vit_b_32` are the zoo's
//! ViT-Base at that patch size, their other arguments likewise at their defaults only.

use crate::config::errors::{at, ConfigError};
use crate::config::tree::{Map, Node, Value};

/// torchvision's ResNet arguments the zoo builds only at their defaults: (key, the default as Python
/// writes it, is this value the default?).
type AtDefault = (&'static str, &'static str, fn(&Value) -> bool);
const AT_DEFAULTS: &[AtDefault] = &[
    ("groups", "1", |v| matches!(v, Value::Int(1))),
    ("width_per_group", "64", |v| matches!(v, Value::Int(64))),
    ("norm_layer", "None (BatchNorm2d)", |v| {
        matches!(v, Value::Null)
    }),
    ("replace_stride_with_dilation", "None", |v| {
        matches!(v, Value::Null)
    }),
];

/// `node` rewritten for the zoo architecture `target` names, or `Ok(false)` when none does.
pub(super) fn torchvision(node: &mut Node, target: &Node) -> Result<bool, ConfigError> {
    let name = super::target_text(target);
    if let Some(model) = name.strip_prefix("torchvision.models.vit_") {
        return torchvision_vit(node, target, model);
    }
    let Some(zoo) = crate::registry::zoo_model_of_target(name) else {
        if let Some(other) = name.strip_prefix("torchvision.models.") {
            return Err(not_in_the_zoo(other, target));
        }
        return Ok(false);
    };
    let Some(map) = node.as_map_mut() else {
        return Ok(true);
    };
    map.shift_remove("progress");
    at_defaults_only(
        map,
        AT_DEFAULTS,
        &format!(
            "the zoo's {} is torchvision's, its variants (ResNeXt, wide ResNets, dilation, another norm \
             layer) not built here; it is built",
            zoo.name
        ),
    )?;
    legacy_pretrained(map, name, zoo.name)?;
    if let Some(w) = map.shift_remove("weights") {
        if !matches!(w.value, Value::Null) {
            return Err(ConfigError::Schema(format!(
                "Error in config key 'model.weights': {}(weights={}) downloads torchvision's weights, \
                 which trainyard does not do{}\n    Convert them to a safetensors file and give its path: \
                 model.pretrained=/path/to/{}.safetensors (torchvision's parameter names load as they are)",
                super::target_text(target),
                w.value.display_python(),
                at(&w.source),
                zoo.name
            )));
        }
    }
    map.insert(
        "name".into(),
        Node::new(Value::Str(zoo.name.into()), target.source.clone()),
    );
    Ok(true)
}

/// torchvision's older `pretrained` argument: `false` or null builds from scratch (dropped), a string is
/// trainyard's safetensors path (kept), `true` would download and is refused.
fn legacy_pretrained(map: &mut Map, call: &str, file_stem: &str) -> Result<(), ConfigError> {
    let Some(p) = map.shift_remove("pretrained") else {
        return Ok(());
    };
    match &p.value {
        Value::Bool(false) | Value::Null => Ok(()),
        Value::Str(_) => {
            map.insert("pretrained".into(), p);
            Ok(())
        }
        other => Err(ConfigError::Schema(format!(
            "Error in config key 'model.pretrained' = {}: {call}(pretrained=True) downloads torchvision's \
             weights, which trainyard does not do{}\n    Convert them to a safetensors file and give its \
             path: model.pretrained=/path/to/{file_stem}.safetensors",
            other.display_python(),
            at(&p.source),
        ))),
    }
}

/// torchvision's ViT arguments the zoo builds only at their defaults (key, the default as Python writes
/// it, is this value the default?).
const VIT_AT_DEFAULTS: &[AtDefault] = &[
    // torchvision's `dropout` acts inside every block; the zoo's `model.dropout` only before the head.
    ("dropout", "0.0", is_zero),
    ("attention_dropout", "0.0", is_zero),
    ("representation_size", "None", |v| matches!(v, Value::Null)),
    ("norm_layer", "None (LayerNorm, eps 1e-6)", |v| {
        matches!(v, Value::Null)
    }),
    ("conv_stem_configs", "None", |v| matches!(v, Value::Null)),
];

fn is_zero(v: &Value) -> bool {
    matches!(v, Value::Float(f) if *f == 0.0) || matches!(v, Value::Int(0))
}

/// `torchvision.models.vit_b_16` and `vit_b_32`: the zoo's ViT-Base at that patch size. torchvision's
/// ViT is timm's architecture (pre-norm blocks, a class token, learned position embeddings, LayerNorm
/// with eps 1e-6, GELU MLPs); the zoo builds it with timm's names and initialisation. `model` is the
/// name after `vit_`.
fn torchvision_vit(node: &mut Node, target: &Node, model: &str) -> Result<bool, ConfigError> {
    let patch = match model {
        "b_16" => 16,
        "b_32" => 32,
        "l_16" | "l_32" | "h_14" => {
            return Err(ConfigError::Schema(format!(
                "model: _target_ torchvision.models.vit_{model}: the zoo's ViTs are tiny, small and base \
                 (timm's); ViT-L and ViT-H are not built here{}\n    Use torchvision.models.vit_b_16 or \
                 vit_b_32, or timm.create_model with model_name vit_{{tiny,small,base}}_patch{{16,32}}_224",
                at(&target.source)
            )))
        }
        _ => return Err(not_in_the_zoo(&format!("vit_{model}"), target)),
    };
    let Some(map) = node.as_map_mut() else {
        return Ok(true);
    };
    map.shift_remove("progress");
    if let Some(w) = map.shift_remove("weights") {
        if !matches!(w.value, Value::Null) {
            return Err(ConfigError::Schema(format!(
                "Error in config key 'model.weights': vit_{model}(weights={}) downloads torchvision's \
                 weights, which trainyard does not do{}\n    Start from timm's ViT-B/{patch} weights as a \
                 safetensors file: model.pretrained=/path/to/vit_base_patch{patch}.safetensors",
                w.value.display_python(),
                at(&w.source)
            )));
        }
    }
    legacy_pretrained(
        map,
        &format!("torchvision.models.vit_{model}"),
        &format!("vit_base_patch{patch}"),
    )?;
    at_defaults_only(map, VIT_AT_DEFAULTS, "the zoo's ViT is built")?;
    // trainyard's keys the target fixes (torchvision's `patch_size` too: "multiple values" in Python).
    for (key, fixed) in [
        ("variant", Value::Str("base".into())),
        ("patch_size", Value::Int(patch)),
    ] {
        if let Some(v) = map.get(key).filter(|v| v.value != fixed) {
            return Err(ConfigError::Schema(format!(
                "Error in config key 'model.{key}' = {}: torchvision.models.vit_{model} is ViT-B/{patch}, \
                 so {key} is {}{}\n    Remove it, or use model=vit_b32 with model.variant and \
                 model.patch_size of your choice",
                v.value.display_python(),
                fixed.display_python(),
                at(&v.source)
            )));
        }
    }
    let source = target.source.clone();
    map.insert(
        "name".into(),
        Node::new(Value::Str("vit".into()), source.clone()),
    );
    map.insert(
        "variant".into(),
        Node::new(Value::Str("base".into()), source.clone()),
    );
    map.insert(
        "patch_size".into(),
        Node::new(Value::Int(patch), source.clone()),
    );
    // torchvision's default image size.
    map.entry("image_size".to_string())
        .or_insert_with(|| Node::new(Value::Int(224), source));
    Ok(true)
}

/// Removes `defaults`' keys from `map`, refusing any set to another value than its default: `built`
/// says what the zoo builds ("the zoo's ViT is built"), followed by "with <key>=<default>".
fn at_defaults_only(map: &mut Map, defaults: &[AtDefault], built: &str) -> Result<(), ConfigError> {
    for (key, default, is_default) in defaults {
        let Some(v) = map.shift_remove(*key) else {
            continue;
        };
        if !is_default(&v.value) {
            return Err(ConfigError::Schema(format!(
                "Error in config key 'model.{key}' = {}: {built} with {key}={default}{}\n    \
                 Remove it, or write the network as a declared model (model.layers) or in Rust",
                v.value.display_python(),
                at(&v.source)
            )));
        }
    }
    Ok(())
}

/// `torchvision.models.<other>`, which no zoo architecture registered: what the zoo has instead.
fn not_in_the_zoo(other: &str, target: &Node) -> ConfigError {
    let targets: Vec<&str> = crate::registry::zoo_models()
        .iter()
        .flat_map(|m| m.targets.iter().copied())
        .collect();
    let short: Vec<&str> = targets
        .iter()
        .filter_map(|t| t.strip_prefix("torchvision.models."))
        .collect();
    let hint = crate::config::errors::did_you_mean(other, short.iter().copied())
        .map(|m| format!("\n    Did you mean 'torchvision.models.{m}'?"))
        .unwrap_or_default();
    ConfigError::Schema(format!(
        "model: _target_ torchvision.models.{other} is not one of the zoo's architectures{}\n    \
         The zoo builds {} (also as model=vit_b32: model.name=vit, model.variant, model.patch_size). \
         Another network: declare it in YAML (model.layers) or register it from Rust{hint}",
        at(&target.source),
        targets.join(", ")
    ))
}
