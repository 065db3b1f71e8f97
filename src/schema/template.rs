//! lightning-hydra-template's own Python modules, read as the trainyard pieces they amount to, so its
//! `configs/` train unchanged: `src.models.mnist_module.MNISTLitModule` is its `net` (a declared model;
//! `SimpleDenseNet` is Linear-BatchNorm1d-ReLU three times and a head) with the `optimizer` and
//! `scheduler` its `configure_optimizers` builds (the run's own `optimizer:`/`scheduler:`, translated as
//! torch's next). Its `compile` flag asks torch.compile to speed the model up; trainyard's kernels need
//! no such step, so it is read and dropped.

use super::targets::target_text;
use crate::config::errors::{at, ConfigError};
use crate::config::tree::{Map, Node, Value};

pub(super) const LIT_MODULE: &str = "src.models.mnist_module.MNISTLitModule";
const DENSE_NET: &str = "src.models.components.simple_dense_net.SimpleDenseNet";

/// `model: {_target_: MNISTLitModule, ...}` in `job`, rewritten in place; false when it is not one.
pub(super) fn lit_module(job: &mut Node) -> Result<bool, ConfigError> {
    let Some(model) = job.child_mut("model") else {
        return Ok(false);
    };
    let Some(target) = model.child("_target_").cloned() else {
        return Ok(false);
    };
    if target_text(&target) != LIT_MODULE {
        return Ok(false);
    }
    let src = target.source.clone();
    let map = model.as_map_mut().expect("a node with a _target_ is a map");
    let moved: Vec<(&str, Node)> = ["optimizer", "scheduler"]
        .into_iter()
        .filter_map(|k| map.shift_remove(k).map(|n| (k, n)))
        .collect();
    let net = map.shift_remove("net").ok_or_else(|| {
        ConfigError::Schema(format!("model: {LIT_MODULE} needs its net{}", at(&src)))
    })?;
    for key in map.keys().cloned().collect::<Vec<_>>() {
        if !matches!(key.as_str(), "_target_" | "compile") {
            return Err(ConfigError::Schema(format!(
                "Error in config key 'model.{key}': {LIT_MODULE} takes net, optimizer, scheduler and \
                 compile{}",
                at(&map[&key].source)
            )));
        }
    }
    *model = dense_net(&net)?;
    let root = job.as_map_mut().expect("a job is a map");
    for (key, mut node) in moved {
        if let Some(own) = root.get(key).filter(|n| !matches!(n.value, Value::Null)) {
            return Err(ConfigError::Schema(format!(
                "Error in config key '{key}': {LIT_MODULE} builds its own {key} (model.{key}), so this one \
                 would be ignored; remove it (~{key} on the command line, or {key}: null) and set \
                 model.{key}.* instead{}",
                at(&own.source)
            )));
        }
        if key == "scheduler" {
            node = epoch_scheduler(node);
        }
        root.insert(key.to_string(), node);
    }
    Ok(true)
}

/// The module's scheduler as its `configure_optimizers` returns it: stepped once per epoch
/// (`"interval": "epoch"`); none (`scheduler: null`) is a constant rate.
fn epoch_scheduler(mut node: Node) -> Node {
    let src = node.source.clone();
    match node.as_map_mut() {
        Some(map) => {
            map.entry("interval".to_string())
                .or_insert_with(|| Node::new(Value::Str("epoch".into()), src));
        }
        None => {
            let mut map = Map::new();
            map.insert(
                "name".into(),
                Node::new(Value::Str("constant".into()), src.clone()),
            );
            node = Node::new(Value::Map(map), src);
        }
    }
    node
}

/// `SimpleDenseNet(input_size, lin1_size, lin2_size, lin3_size, output_size)` as a declared model.
fn dense_net(net: &Node) -> Result<Node, ConfigError> {
    let target = net.child("_target_");
    let src = target
        .map(|t| t.source.clone())
        .unwrap_or_else(|| net.source.clone());
    if target.map(target_text) != Some(DENSE_NET) {
        return Err(ConfigError::Schema(format!(
            "Error in config key 'model.net': {LIT_MODULE}'s net is {DENSE_NET} here (or declare the \
             network: model.name=declared with model.layers){}",
            at(&src)
        )));
    }
    let size = |key: &str| -> Result<i64, ConfigError> {
        match net.child(key).map(|n| &n.value) {
            Some(Value::Int(v)) if *v > 0 => Ok(*v),
            _ => Err(ConfigError::Schema(format!(
                "Error in config key 'model.net.{key}': SimpleDenseNet needs it as a positive integer{}",
                at(net.child(key).map_or(&src, |n| &n.source))
            ))),
        }
    };
    const SIZES: [&str; 5] = [
        "input_size",
        "lin1_size",
        "lin2_size",
        "lin3_size",
        "output_size",
    ];
    for (key, node) in net.as_map().into_iter().flatten() {
        if key != "_target_" && !SIZES.contains(&key.as_str()) {
            return Err(ConfigError::Schema(format!(
                "Error in config key 'model.net.{key}': SimpleDenseNet takes {} only{}",
                SIZES.join(", "),
                at(&node.source)
            )));
        }
    }
    let (input, out) = (size("input_size")?, size("output_size")?);
    let node = |v: Value| Node::new(v, src.clone());
    let layer = |kind: &str, args: &[(&str, i64)]| {
        let mut m = Map::new();
        m.insert("type".into(), node(Value::Str(kind.into())));
        for (k, v) in args {
            m.insert((*k).into(), node(Value::Int(*v)));
        }
        node(Value::Map(m))
    };
    // forward(x): x.view(batch, -1), then the Sequential.
    let mut layers = vec![layer("Flatten", &[])];
    let mut width = input;
    for key in ["lin1_size", "lin2_size", "lin3_size"] {
        let next = size(key)?;
        layers.push(layer(
            "Linear",
            &[("in_features", width), ("out_features", next)],
        ));
        layers.push(layer("BatchNorm1d", &[("num_features", next)]));
        layers.push(layer("ReLU", &[]));
        width = next;
    }
    layers.push(layer(
        "Linear",
        &[("in_features", width), ("out_features", out)],
    ));
    let mut m = Map::new();
    m.insert("name".into(), node(Value::Str("declared".into())));
    m.insert("num_classes".into(), node(Value::Int(out)));
    m.insert("layers".into(), node(Value::List(layers)));
    Ok(Node::new(Value::Map(m), net.source.clone()))
}
