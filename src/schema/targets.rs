//! Hydra `_target_` nodes as Lightning + Hydra projects write them (lightning-hydra-template's `trainer/`,
//! `callbacks/`, `logger/`, `torch.optim.*`, `timm.create_model`) translated onto trainyard's schema before
//! it is typed. Keyword arguments keep their Lightning/torch names where the schema has them; a few are
//! renamed; the ones that only configure Lightning's own console are accepted as documented no-ops; any other
//! is left for the schema to refuse (naming the key, its file:line and the keys known there), or refused
//! here with the reason when trainyard cannot honour the value. A `_target_` outside the known set is an
//! error naming it; a project's own Python class cannot run here, and the error says so.
//!
//! Here: the walk over the job, torch's optimizers and schedules, the `model:` targets (timm's, TorchScript);
//! `lightning`: the Trainer, its profiler, callbacks and loggers; `zoo`: torchvision's constructors.
//! The guide's "Coming from Lightning + Hydra" page (docs/src/lightning.md) documents every mapping.

use super::registered::unregistered;
use super::target_names::target_text;
use crate::config::errors::{at, did_you_mean, ConfigError};
use crate::config::tree::{Map, Node, Source, Value};
use lightning::{trainer_target, translate_entries};

/// A Lightning project names no backend (its trainer is PyTorch's): on a GPU (`trainer=gpu`) it runs on
/// libtorch, trainyard's GPU backend, as the template's `python src/train.py trainer=gpu` runs on CUDA. On a
/// CPU the default backend stays. A `backend` the project sets is kept.
fn gpu_means_libtorch(job: &mut Node) {
    let Some(accelerator) = job.get("trainer.accelerator").cloned() else {
        return;
    };
    let on_gpu = accelerator
        .as_str()
        .is_some_and(|a| matches!(a.to_ascii_lowercase().as_str(), "gpu" | "cuda"));
    let root = job.as_map_mut().expect("a job is a map");
    if on_gpu && !root.contains_key("backend") {
        root.insert(
            "backend".to_string(),
            Node::new(Value::Str("tch".into()), accelerator.source.clone()),
        );
    }
}

/// Translate every known `_target_` node of a resolved job config in place.
pub fn translate(job: &mut Node) -> Result<(), ConfigError> {
    // A project of Lightning modules (the template's) has Lightning's semantics throughout: a
    // `callbacks`/`logger` entry without a `_target_` is skipped, as its `instantiate_*` skip one.
    let lightning = super::template::is_lightning_project(job);
    // First: the template's LightningModule hands its optimizer and scheduler to the run.
    super::template::lit_module(job)?;
    check_partial_flags(job)?;
    // An optimizer or a schedule is completed by the run (its parameters, its length), as Hydra's
    // partial is: `_partial_: false` would ask for it whole, which Hydra's instantiate could not do either.
    for section in ["optimizer", "scheduler"] {
        if let Some(target) = job
            .get(&format!("{section}._target_"))
            .and_then(|t| t.as_str())
        {
            super::registered::check_partial(job, section, target)?;
        }
    }
    if let Some(trainer) = job.child_mut("trainer") {
        if let Some(target) = take_target(trainer)? {
            trainer_target(trainer, &target)?;
        }
    }
    for section in ["callbacks", "logger"] {
        if let Some(node) = job.child_mut(section) {
            translate_entries(node, section, lightning)?;
        }
    }
    // An optimizer or schedule a crate registered is built by its constructor: `extract` reads it.
    if let Some(opt) = job.child_mut("optimizer") {
        if !names_registered(opt, |t| crate::registry::optimizer(t).is_some()) {
            if let Some(target) = take_target(opt)? {
                optimizer_target(opt, &target)?;
            }
        }
    }
    if let Some(sched) = job.child_mut("scheduler") {
        if !names_registered(sched, |t| crate::registry::schedule(t).is_some()) {
            if let Some(target) = take_target(sched)? {
                scheduler_target(sched, &target)?;
            }
        }
    }
    if let Some(model) = job.child_mut("model") {
        // A model a crate registered (`registry`) is built by its constructor: `extract` reads it.
        let registered = model
            .child("_target_")
            .and_then(|t| t.as_str())
            .is_some_and(crate::registry::is_model);
        if !registered {
            if let Some(target) = take_target(model)? {
                model_target(model, &target)?;
            }
        }
    }
    super::template::mnist_data_module(job)?;
    if lightning {
        gpu_means_libtorch(job);
    }
    if let Some(data) = job.child("data") {
        if let Some(t) = data.child("_target_") {
            // A dataset a crate registered is opened by its constructor: `extract` reads it.
            if crate::registry::dataset(target_text(t)).is_none() {
                let names = crate::registry::dataset_targets();
                return Err(unregistered(
                    "data",
                    t,
                    "dataset",
                    "register_dataset!",
                    &names,
                ));
            }
        }
    }
    Ok(())
}

/// Every node with a `_target_` takes `_partial_` as a boolean or not at all (Hydra's `instantiate`: "_partial_
/// flag must be a bool"); the error names the key and its line.
fn check_partial_flags(job: &Node) -> Result<(), ConfigError> {
    let mut first = None;
    job.walk(&mut String::new(), &mut |path, node| {
        if let (None, Some(_), Some(flag)) =
            (&first, node.child("_target_"), node.child("_partial_"))
        {
            if !matches!(flag.value, Value::Bool(_)) {
                first = Some(ConfigError::Schema(format!(
                    "Error in config key '{path}._partial_': expected true or false, got {}{}",
                    flag.value.display_python(),
                    at(&flag.source)
                )));
            }
        }
    });
    first.map_or(Ok(()), Err)
}

/// Does `node`'s `_target_` name something `is_registered` knows?
fn names_registered(node: &Node, is_registered: impl Fn(&str) -> bool) -> bool {
    node.child("_target_")
        .and_then(|t| t.as_str())
        .is_some_and(is_registered)
}

/// A `_target_` read and removed (with `_partial_`, which only matters to Python), or `None`.
fn take_target(node: &mut Node) -> Result<Option<Node>, ConfigError> {
    let Some(map) = node.as_map_mut() else {
        return Ok(None);
    };
    let Some(target) = map.shift_remove("_target_") else {
        return Ok(None);
    };
    map.shift_remove("_partial_");
    match &target.value {
        Value::Str(_) => Ok(Some(target)),
        other => Err(ConfigError::Schema(format!(
            "_target_ must name a class, got {}{}",
            other.display_python(),
            at(&target.source)
        ))),
    }
}

/// The class name of a target, when its module is one of `modules` (`lightning.pytorch.callbacks`, …).
fn class_in<'a>(target: &'a str, modules: &[&str]) -> Option<&'a str> {
    let (module, class) = target.rsplit_once('.')?;
    modules
        .iter()
        .any(|m| module == *m || module.starts_with(&format!("{m}.")))
        .then_some(class)
}

fn unknown_target(section: &str, target: &Node, known: &[&str]) -> ConfigError {
    let registered = match section {
        "callbacks" => crate::registry::callback_targets(),
        "logger" => crate::registry::logger_targets(),
        "optimizer" => crate::registry::optimizer_targets(),
        "scheduler" => crate::registry::schedule_targets(),
        _ => Vec::new(),
    };
    let (macro_name, trait_name) = match section {
        "callbacks" => ("register_callback!", "Callback"),
        "optimizer" => ("register_optimizer!", "OptimizerRule"),
        "scheduler" => ("register_schedule!", "LrSchedule"),
        _ => ("register_logger!", "MetricSink"),
    };
    let own = match (section, registered.is_empty()) {
        ("callbacks" | "logger" | "optimizer" | "scheduler", true) => format!(
            "\n    Your own, written in Rust: implement trainyard::registry::{trait_name} and register it \
             with trainyard::{macro_name}(\"my_project.Name\", constructor)"
        ),
        ("callbacks" | "logger" | "optimizer" | "scheduler", false) => {
            let hint = did_you_mean(target_text(target), registered.iter().copied())
                .map(|s| format!(" Did you mean '{s}'?"))
                .unwrap_or_default();
            format!(
                "\n    Registered by this program: {}.{hint}",
                registered.join(", ")
            )
        }
        _ => String::new(),
    };
    let modules = match section {
        "optimizer" | "scheduler" => "",
        _ => " (module lightning.pytorch.*, or pytorch_lightning.*)",
    };
    ConfigError::Schema(format!(
        "{section}: _target_ {} is not one trainyard knows.\n    Known here{modules}: {}{own}{}",
        target_text(target),
        known.join(", "),
        at(&target.source)
    ))
}

/// Refuse `key` unless its value is one of the accepted no-op values (checked with `ok`), with the reason.
fn refuse_unless(
    map: &mut Map,
    section: &str,
    key: &str,
    ok: fn(&Value) -> bool,
    why: &str,
) -> Result<(), ConfigError> {
    if let Some(node) = map.get(key) {
        if !ok(&node.value) {
            return Err(ConfigError::Schema(format!(
                "{section}.{key}={}: {why}{}",
                node.value.display_python(),
                at(&node.source)
            )));
        }
        map.shift_remove(key);
    }
    Ok(())
}

/// A logger's `prefix`: metric names keep trainyard's own (`train/`, `val/`), so only an empty one passes.
fn refuse_prefix(map: &mut Map, section: &str) -> Result<(), ConfigError> {
    refuse_unless(
        map,
        section,
        "prefix",
        empty_or_null,
        "metric names keep trainyard's `train/`, `val/` prefixes; remove it",
    )
}

fn is_null(v: &Value) -> bool {
    matches!(v, Value::Null)
}
fn is_false_or_null(v: &Value) -> bool {
    matches!(v, Value::Null | Value::Bool(false))
}
fn is_true_or_null(v: &Value) -> bool {
    matches!(v, Value::Null | Value::Bool(true))
}
fn anything(_: &Value) -> bool {
    true
}
fn empty_or_null(v: &Value) -> bool {
    matches!(v, Value::Null) || matches!(v, Value::Str(s) if s.is_empty())
}

fn rename(map: &mut Map, from: &str, to: &str) {
    if let Some(v) = map.shift_remove(from) {
        map.insert(to.to_string(), v);
    }
}

/// Drop `key` when it is null (Lightning's "use the default"), so the schema's default applies.
fn drop_null(map: &mut Map, key: &str) {
    if map.get(key).is_some_and(|n| is_null(&n.value)) {
        map.shift_remove(key);
    }
}

fn set_default(map: &mut Map, key: &str, value: Value, source: &Source) {
    if map.get(key).is_none_or(|n| is_null(&n.value)) {
        map.insert(key.to_string(), Node::new(value, source.clone()));
    }
}

fn optimizer_target(node: &mut Node, target: &Node) -> Result<(), ConfigError> {
    let name = match class_in(target_text(target), &["torch.optim"]) {
        Some("SGD") => "sgd",
        Some("Adam") => "adam",
        Some("AdamW") => "adamw",
        _ => {
            return Err(unknown_target(
                "optimizer",
                target,
                &["torch.optim.SGD", "torch.optim.Adam", "torch.optim.AdamW"],
            ))
        }
    };
    if let Some(map) = node.as_map_mut() {
        refuse_unless(
            map,
            "optimizer",
            "amsgrad",
            is_false_or_null,
            "AMSGrad is not available; remove it",
        )?;
        for k in [
            "foreach",
            "fused",
            "capturable",
            "differentiable",
            "maximize",
            "dampening",
        ] {
            refuse_unless(
                map,
                "optimizer",
                k,
                |v| matches!(v, Value::Null | Value::Bool(false) | Value::Int(0)),
                "not available here; remove it",
            )?;
        }
        map.insert(
            "name".into(),
            Node::new(Value::Str(name.into()), target.source.clone()),
        );
    }
    Ok(())
}

fn scheduler_target(node: &mut Node, target: &Node) -> Result<(), ConfigError> {
    let class = class_in(target_text(target), &["torch.optim.lr_scheduler"]);
    let Some(map) = node.as_map_mut() else {
        return Ok(());
    };
    let name = match class {
        Some("OneCycleLR") => {
            // The total step count comes from the run; torch needs it spelled out.
            for k in [
                "total_steps",
                "epochs",
                "steps_per_epoch",
                "anneal_strategy",
                "three_phase",
                "cycle_momentum",
                "base_momentum",
                "max_momentum",
            ] {
                map.shift_remove(k);
            }
            "onecycle"
        }
        Some("CosineAnnealingLR") => {
            map.shift_remove("T_max");
            rename(map, "eta_min", "min_lr");
            "cosine"
        }
        Some("StepLR") => "step",
        Some("ReduceLROnPlateau") => {
            // Lightning reads the monitored metric from the LightningModule's scheduler dict; the
            // template's is `val/loss`, the default here (`scheduler.monitor`).
            if map
                .get("min_lr")
                .is_some_and(|v| matches!(v.value, Value::List(_)))
            {
                return Err(ConfigError::Schema(format!(
                    "scheduler.min_lr: one floor per parameter group; trainyard has one group, give a number{}",
                    at(&target.source)
                )));
            }
            "plateau"
        }
        Some("ConstantLR")
            if map.get("factor").is_none_or(|n| {
                matches!(n.value, Value::Float(f) if f == 1.0) || matches!(n.value, Value::Int(1))
            }) =>
        {
            map.shift_remove("factor");
            map.shift_remove("total_iters");
            "constant"
        }
        _ => {
            return Err(unknown_target(
                "scheduler",
                target,
                &[
                    "torch.optim.lr_scheduler.OneCycleLR",
                    "torch.optim.lr_scheduler.CosineAnnealingLR",
                    "torch.optim.lr_scheduler.StepLR",
                    "torch.optim.lr_scheduler.ConstantLR (factor 1)",
                    "torch.optim.lr_scheduler.ReduceLROnPlateau",
                ],
            ))
        }
    };
    map.shift_remove("last_epoch");
    map.shift_remove("verbose");
    map.insert(
        "name".into(),
        Node::new(Value::Str(name.into()), target.source.clone()),
    );
    Ok(())
}

/// `timm.create_model` for the architectures trainyard builds; anything else at `model:` is the project's
/// own LightningModule.
fn model_target(node: &mut Node, target: &Node) -> Result<(), ConfigError> {
    if target_text(target) == crate::registry::TORCHSCRIPT {
        return Err(ConfigError::Schema(format!(
            "model: _target_ {} (model=torchscript) trains on libtorch, which this build lacks: \
             eval \"$(scripts/install-libtorch.sh)\" and rebuild with --features torch{}",
            crate::registry::TORCHSCRIPT,
            at(&target.source)
        )));
    }
    if zoo::torchvision(node, target)? {
        return Ok(());
    }
    if target_text(target) != "timm.create_model" {
        let mut names = crate::registry::model_targets();
        names.extend(
            crate::registry::zoo_models()
                .iter()
                .flat_map(|m| m.targets.iter().copied()),
        );
        return Err(unregistered(
            "model",
            target,
            "model",
            "register_candle_model! (or register_tch_model!)",
            &names,
        ));
    }
    let Some(map) = node.as_map_mut() else {
        return Ok(());
    };
    let Some(name) = map.shift_remove("model_name") else {
        return Err(ConfigError::Schema(format!(
            "model: timm.create_model needs model_name{}",
            at(&target.source)
        )));
    };
    let timm = name.value.display_python();
    let (ours, variant, patch) = match timm.as_str() {
        "resnet18" | "resnet34" | "resnet50" | "resnet101" | "resnet152" => {
            (timm.as_str(), None, None)
        }
        "vit_tiny_patch16_224" => ("vit", Some("tiny"), Some(16)),
        "vit_small_patch16_224" => ("vit", Some("small"), Some(16)),
        "vit_small_patch32_224" => ("vit", Some("small"), Some(32)),
        "vit_base_patch16_224" => ("vit", Some("base"), Some(16)),
        "vit_base_patch32_224" => ("vit", Some("base"), Some(32)),
        _ => {
            return Err(ConfigError::Schema(format!(
                "model: timm model '{timm}' is not one trainyard builds (resnet18/34/50/101/152, \
                 vit_{{tiny,small,base}}_patch{{16,32}}_224){}",
                at(&name.source)
            )))
        }
    };
    if let Some(p) = map.shift_remove("pretrained") {
        if p.value == Value::Bool(true) {
            return Err(ConfigError::Schema(format!(
                "model.pretrained=True: trainyard does not download timm weights; convert them to a \
                 safetensors file and give its path (model.pretrained=/path/to/weights.safetensors){}",
                at(&p.source)
            )));
        }
        if let Value::Str(_) = p.value {
            map.insert("pretrained".into(), p);
        }
    }
    rename(map, "drop_rate", "dropout");
    let src = target.source.clone();
    map.insert(
        "name".into(),
        Node::new(Value::Str(ours.into()), src.clone()),
    );
    if let Some(v) = variant {
        map.insert(
            "variant".into(),
            Node::new(Value::Str(v.into()), src.clone()),
        );
    }
    if let Some(p) = patch {
        map.insert("patch_size".into(), Node::new(Value::Int(p), src.clone()));
        map.entry("image_size".to_string())
            .or_insert_with(|| Node::new(Value::Int(224), src));
    }
    Ok(())
}

mod lightning;
#[cfg(test)]
mod tests;
mod zoo;
