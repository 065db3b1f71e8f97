//! `model: {_target_: torchvision.models.resnet50, num_classes: 10}`, as a Hydra project instantiates
//! torchvision's constructors: the `_target_`s each zoo architecture registered (`registry::ZooModel`)
//! become its `model.name`. torchvision's keyword arguments keep their meaning: `num_classes` is the
//! head's width, `weights: null` builds from scratch, and `progress` only matters to a download.

use crate::config::errors::{at, ConfigError};
use crate::config::tree::{Node, Value};

/// `node` rewritten for the zoo architecture `target` names, or `Ok(false)` when none does.
pub(super) fn torchvision(node: &mut Node, target: &Node) -> Result<bool, ConfigError> {
    let Some(zoo) = crate::registry::zoo_model_of_target(super::target_text(target)) else {
        return Ok(false);
    };
    let Some(map) = node.as_map_mut() else {
        return Ok(true);
    };
    map.shift_remove("progress");
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
