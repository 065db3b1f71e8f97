//! lightning-hydra-template's own Python modules, read as the trainyard pieces they amount to, so its
//! `configs/` train unchanged: `src.models.mnist_module.MNISTLitModule` is its `net` (a declared model;
//! `SimpleDenseNet` is Linear-BatchNorm1d-ReLU three times and a head) with the `optimizer` and
//! `scheduler` its `configure_optimizers` builds (the run's own `optimizer:`/`scheduler:`, translated as
//! torch's next). Its `compile` flag asks torch.compile to speed the model up; trainyard's kernels need
//! no such step, so it is read and dropped. Its metrics keep the module's names (`train/acc`, `val/acc`,
//! `val/acc_best`, `test/acc`: `accuracy_names: acc`).
//!
//! `src.data.mnist_datamodule.MNISTDataModule` is MNIST from torchvision's folder under `data_dir`, its
//! train and test files pooled and cut by `train_val_test_split` as its `random_split` with seed 42 cuts
//! them, normalised as its transforms do, `batch_size` divided among the devices as it divides it.

use super::target_names::target_text;
use super::AccuracyNames;
use crate::config::errors::{at, ConfigError};
use crate::config::tree::{Map, Node, Value};

pub(super) const LIT_MODULE: &str = "src.models.mnist_module.MNISTLitModule";
const DENSE_NET: &str = "src.models.components.simple_dense_net.SimpleDenseNet";
pub(super) const DATA_MODULE: &str = "src.data.mnist_datamodule.MNISTDataModule";

/// `job`'s `section` node and its `_target_`, when that target is `target`.
fn section_of<'a>(job: &'a mut Node, section: &str, target: &str) -> Option<(&'a mut Node, Node)> {
    let node = job.child_mut(section)?;
    let found = node.child("_target_").cloned()?;
    (target_text(&found) == target).then_some((node, found))
}

/// `model: {_target_: MNISTLitModule, ...}` in `job`, rewritten in place; false when it is not one.
pub(super) fn lit_module(job: &mut Node) -> Result<bool, ConfigError> {
    let Some((model, target)) = section_of(job, "model", LIT_MODULE) else {
        return Ok(false);
    };
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
    root.entry("accuracy_names".to_string())
        .or_insert_with(|| Node::new(Value::Str("acc".into()), src.clone()));
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

/// `data: {_target_: MNISTDataModule, ...}` in `job`, rewritten in place as the data config it amounts
/// to; false when it is not one.
pub(super) fn mnist_data_module(job: &mut Node) -> Result<bool, ConfigError> {
    let Some((data, target)) = section_of(job, "data", DATA_MODULE) else {
        return Ok(false);
    };
    let src = target.source.clone();
    let node = |v: Value| Node::new(v, src.clone());
    let map = data.as_map_mut().expect("a node with a _target_ is a map");
    map.shift_remove("_target_");
    const KEYS: [&str; 5] = [
        "data_dir",
        "batch_size",
        "train_val_test_split",
        "num_workers",
        "pin_memory",
    ];
    for (key, value) in map.iter() {
        if !KEYS.contains(&key.as_str()) {
            return Err(ConfigError::Schema(format!(
                "Error in config key 'data.{key}': {DATA_MODULE} takes {}{}",
                KEYS.join(", "),
                at(&value.source)
            )));
        }
    }
    let mut out = Map::new();
    out.insert("name".into(), node(Value::Str("mnist".into())));
    if let Some(dir) = map.shift_remove("data_dir") {
        out.insert("root".into(), dir);
    }
    // Its prepare_data downloads MNIST when it is not there (torchvision's `download=True`).
    out.insert("download".into(), node(Value::Bool(true)));
    out.insert("num_classes".into(), node(Value::Int(10)));
    out.insert("image_size".into(), node(Value::Int(28)));
    out.insert("channels".into(), node(Value::Int(1)));
    // Defaults of its __init__: batch_size 64, (55_000, 5_000, 10_000), 0 workers, no pinning.
    let batch = map
        .shift_remove("batch_size")
        .unwrap_or_else(|| node(Value::Int(64)));
    out.insert("batch_size".into(), batch);
    out.insert("batch_size_is_global".into(), node(Value::Bool(true)));
    let split = map.shift_remove("train_val_test_split").unwrap_or_else(|| {
        node(Value::List(
            [55_000, 5_000, 10_000]
                .into_iter()
                .map(|n| node(Value::Int(n)))
                .collect(),
        ))
    });
    out.insert("train_val_test_split".into(), split);
    out.insert(
        "num_workers".into(),
        map.shift_remove("num_workers")
            .unwrap_or_else(|| node(Value::Int(0))),
    );
    out.insert(
        "pin_memory".into(),
        map.shift_remove("pin_memory")
            .unwrap_or_else(|| node(Value::Bool(false))),
    );
    // transforms.Compose([ToTensor(), Normalize((0.1307,), (0.3081,))]) for every split.
    let normalize = || {
        let mut args = Map::new();
        args.insert(
            "mean".into(),
            node(Value::List(vec![node(Value::Float(0.1307))])),
        );
        args.insert(
            "std".into(),
            node(Value::List(vec![node(Value::Float(0.3081))])),
        );
        let mut step = Map::new();
        step.insert("normalize".into(), node(Value::Map(args)));
        node(Value::List(vec![node(Value::Map(step))]))
    };
    out.insert("train_transforms".into(), normalize());
    out.insert("val_transforms".into(), normalize());
    *data = Node::new(Value::Map(out), data.source.clone());
    Ok(true)
}

/// How a job config's run names its accuracies, read before it is typed (a search checks its
/// `optimized_metric` against them): `accuracy_names` when set, else `acc` for the template's module.
pub fn accuracy_names_of(job: &Node) -> AccuracyNames {
    match job.child("accuracy_names").and_then(|n| n.as_str()) {
        Some("acc") => AccuracyNames::Acc,
        Some(_) => AccuracyNames::Acc1Acc5,
        None => match job
            .get("model._target_")
            .is_some_and(|t| target_text(t) == LIT_MODULE)
        {
            true => AccuracyNames::Acc,
            false => AccuracyNames::Acc1Acc5,
        },
    }
}

/// Is `job` a project of the template's Lightning modules (its LightningModule or DataModule named)?
pub(super) fn is_lightning_project(job: &Node) -> bool {
    let named = |path: &str, target: &str| job.get(path).is_some_and(|t| target_text(t) == target);
    named("model._target_", LIT_MODULE) || named("data._target_", DATA_MODULE)
}
