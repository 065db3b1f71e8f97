//! Hydra `_target_` nodes as Lightning + Hydra projects write them (lightning-hydra-template's `trainer/`,
//! `callbacks/`, `logger/`, `torch.optim.*`, `timm.create_model`) translated onto trainyard's schema before
//! it is typed. Keyword arguments keep their Lightning/torch names where the schema has them; a few are
//! renamed; the ones that only configure Lightning's own console are accepted as documented no-ops; any other
//! is left for the schema to refuse (naming the key, its file:line and the keys known there), or refused
//! here with the reason when trainyard cannot honour the value. A `_target_` outside the known set is an
//! error naming it; a project's own Python class cannot run here, and the error says so.
//!
//! The guide's "Coming from Lightning + Hydra" page (docs/src/lightning.md) documents every mapping below.

use super::registered::unregistered;
use super::target_names::target_text;
use crate::config::errors::{at, did_you_mean, ConfigError};
use crate::config::tree::{Map, Node, Source, Value};

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

const TRAINER_MODULES: &[&str] = &[
    "lightning.pytorch.trainer",
    "lightning.pytorch",
    "lightning",
    "pytorch_lightning.trainer",
    "pytorch_lightning",
];

fn trainer_target(node: &mut Node, target: &Node) -> Result<(), ConfigError> {
    if class_in(target_text(target), TRAINER_MODULES) != Some("Trainer") {
        return Err(unknown_target(
            "trainer",
            target,
            &[
                "lightning.pytorch.trainer.Trainer",
                "pytorch_lightning.Trainer",
            ],
        ));
    }
    let src = target.source.clone();
    let Some(map) = node.as_map_mut() else {
        return Ok(());
    };
    let s = "trainer";
    // Lightning's console and directories: the run directory is `hydra.run.dir`, the console is ours.
    for key in [
        "default_root_dir",
        "enable_progress_bar",
        "enable_model_summary",
        "num_sanity_val_steps",
        "limit_predict_batches",
        "logger",
    ] {
        map.shift_remove(key);
    }
    if map
        .get("min_epochs")
        .is_some_and(|v| matches!(v.value, Value::Null))
    {
        map.shift_remove("min_epochs");
    }
    drop_null(map, "detect_anomaly");
    if let Some(profiler) = map.get_mut("profiler") {
        profiler_target(profiler)?;
    }
    refuse_unless(map, s, "enable_checkpointing", is_true_or_null,
        "to train without checkpoints, remove the ModelCheckpoint callback (callbacks.model_checkpoint=null)")?;
    refuse_unless(
        map,
        s,
        "min_steps",
        |v| matches!(v, Value::Null | Value::Int(0 | -1)),
        "trainyard has no minimum step count; remove it",
    )?;
    refuse_unless(map, s, "inference_mode", anything, "")?;
    refuse_unless(
        map,
        s,
        "use_distributed_sampler",
        is_true_or_null,
        "trainyard always shards the data between processes; remove it",
    )?;
    refuse_unless(map, s, "barebones", is_false_or_null, "remove it")?;
    rename(map, "benchmark", "cudnn_benchmark");
    drop_null(map, "benchmark");
    drop_null(map, "cudnn_benchmark");
    drop_null(map, "limit_test_batches");
    for key in [
        "max_steps",
        "gradient_clip_val",
        "accumulate_grad_batches",
        "log_every_n_steps",
    ] {
        drop_null(map, key);
    }
    drop_null(map, "gradient_clip_algorithm");
    // Lightning's defaults for what its Trainer does not require.
    set_default(map, "accelerator", Value::Str("auto".into()), &src);
    set_default(map, "devices", Value::Str("auto".into()), &src);
    set_default(map, "precision", Value::Str("32-true".into()), &src);
    set_default(map, "max_epochs", Value::Int(1000), &src);
    let devices_one = matches!(map.get("devices").map(|n| &n.value), Some(Value::Int(1)));
    let nodes_one = map
        .get("num_nodes")
        .is_none_or(|n| matches!(n.value, Value::Int(1) | Value::Null));
    let strategy = map.get("strategy").map(|n| n.value.clone());
    let mapped = match strategy {
        None | Some(Value::Null) => Some("auto".to_string()),
        Some(Value::Str(s)) => Some(
            match s.as_str() {
                "auto" => "auto",
                "ddp"
                | "ddp_spawn"
                | "ddp_fork"
                | "ddp_notebook"
                | "ddp_find_unused_parameters_true"
                | "ddp_find_unused_parameters_false" => "ddp",
                "dp" => "dp",
                "fsdp" => "fsdp",
                "single_device" => "single",
                other => other,
            }
            .to_string(),
        ),
        _ => None,
    };
    if let Some(name) = mapped {
        let value = match name.as_str() {
            // Lightning's "auto": one process per device, DDP when there is more than one.
            "auto" if devices_one && nodes_one => "single",
            "auto" => "ddp",
            other => other,
        };
        map.insert("strategy".into(), Node::new(Value::Str(value.into()), src));
    }
    Ok(())
}

const CALLBACK_MODULES: &[&str] = &["lightning.pytorch.callbacks", "pytorch_lightning.callbacks"];
const LOGGER_MODULES: &[&str] = &["lightning.pytorch.loggers", "pytorch_lightning.loggers"];

/// `trainer.profiler` as a Lightning profiler object: SimpleProfiler's arguments become the schema's map
/// (`name: simple`), PassThroughProfiler (Lightning's "no profiling") becomes null; the Python-only
/// profilers are refused by name. A string (`simple`, `advanced`, ...) is left to the schema.
fn profiler_target(node: &mut Node) -> Result<(), ConfigError> {
    let Some(target) = take_target(node)? else {
        return Ok(());
    };
    let modules = [
        "lightning.pytorch.profilers",
        "pytorch_lightning.profilers",
        "pytorch_lightning.profiler",
    ];
    let src = target.source.clone();
    let reason = match class_in(target_text(&target), &modules) {
        Some("SimpleProfiler") => {
            if let Some(map) = node.as_map_mut() {
                map.insert("name".into(), Node::new(Value::Str("simple".into()), src));
            }
            return Ok(());
        }
        Some("PassThroughProfiler") => {
            *node = Node::new(Value::Null, src);
            return Ok(());
        }
        Some("AdvancedProfiler") => "it runs Python's cProfile, and there is no Python here",
        Some("PyTorchProfiler") => "it traces PyTorch's operators from Python",
        Some("XLAProfiler") => "XLA (TPU) is not supported",
        _ => {
            return Err(unknown_target(
                "trainer.profiler",
                &target,
                &["SimpleProfiler", "PassThroughProfiler"],
            ))
        }
    };
    Err(ConfigError::Schema(format!(
        "trainer.profiler: _target_ {} is not available: {reason}; use \
         lightning.pytorch.profilers.SimpleProfiler (or profiler: simple){}",
        target_text(&target),
        at(&target.source)
    )))
}

/// `callbacks:` / `logger:` entries with a `_target_`, each moved to trainyard's key for it; in a
/// `lightning` project, one without is skipped (as the template's experiment configs rely on: their
/// `logger.wandb.tags` means nothing until `logger=wandb` adds the logger).
fn translate_entries(node: &mut Node, section: &str, lightning: bool) -> Result<(), ConfigError> {
    let Some(map) = node.as_map_mut() else {
        return Ok(());
    };
    let entries: Vec<String> = map.keys().cloned().collect();
    let mut out = Map::new();
    for name in entries {
        let mut entry = map.shift_remove(&name).expect("key listed above");
        let Some(target) = take_target(&mut entry)? else {
            if lightning && entry.as_map().is_some() {
                tracing::debug!("{section}.{name}: no _target_, skipped as Lightning skips it");
            } else {
                out.insert(name, entry);
            }
            continue;
        };
        // A user's crate registered it (`register_logger!`, `register_callback!`): kept under its own
        // name with its `_target_`, for `registered::registered_plugins` to read.
        if is_registered_plugin(section, target_text(&target)) {
            if let Some(m) = entry.as_map_mut() {
                m.insert("_target_".to_string(), target);
            }
            out.insert(name, entry);
            continue;
        }
        let key = match section {
            "callbacks" => callback_target(&mut entry, &target)?,
            _ => logger_target(&mut entry, &target)?,
        };
        let Some(key) = key else { continue };
        if out.contains_key(key) {
            return Err(ConfigError::Schema(format!(
                "{section}.{name}: a second {} ({key} is already configured){}",
                target_text(&target),
                at(&target.source)
            )));
        }
        out.insert(key.to_string(), entry);
    }
    *map = out;
    Ok(())
}

/// Is `target` a logger (`section` `logger`) or a callback a crate registered?
pub(super) fn is_registered_plugin(section: &str, target: &str) -> bool {
    match section {
        "callbacks" => crate::registry::callback(target).is_some(),
        _ => crate::registry::logger(target).is_some(),
    }
}

/// One callback: its trainyard key (`None` when it is Lightning's console only).
fn callback_target(entry: &mut Node, target: &Node) -> Result<Option<&'static str>, ConfigError> {
    const KNOWN: [&str; 10] = [
        "ModelCheckpoint",
        "EarlyStopping",
        "ModelSummary",
        "RichModelSummary",
        "LearningRateMonitor",
        "DeviceStatsMonitor",
        "Timer",
        "BatchSizeFinder",
        "RichProgressBar",
        "TQDMProgressBar",
    ];
    let class = class_in(target_text(target), CALLBACK_MODULES);
    let Some(map) = entry.as_map_mut() else {
        return Ok(None);
    };
    let key = match class {
        Some("ModelCheckpoint") => {
            let s = "callbacks.model_checkpoint";
            map.shift_remove("verbose");
            refuse_unless(map, s, "auto_insert_metric_name", is_false_or_null,
                "trainyard formats `filename` as written (`epoch_{epoch:03d}` → epoch_007) and does not insert `epoch=`; set it to False")?;
            refuse_unless(
                map,
                s,
                "save_weights_only",
                is_false_or_null,
                "checkpoints hold the optimizer state too (exact resume); remove it",
            )?;
            for k in [
                "every_n_train_steps",
                "train_time_interval",
                "save_on_train_epoch_end",
                "enable_version_counter",
            ] {
                refuse_unless(
                    map,
                    s,
                    k,
                    |v| matches!(v, Value::Null | Value::Bool(true)),
                    "checkpoints are taken after each validation only; remove it",
                )?;
            }
            if map.get("save_last").is_some_and(|n| is_null(&n.value)) {
                map.insert(
                    "save_last".into(),
                    Node::new(Value::Bool(false), target.source.clone()),
                );
            }
            drop_null(map, "every_n_epochs");
            drop_null(map, "filename");
            set_default(
                map,
                "dirpath",
                Value::Str("checkpoints".into()),
                &target.source,
            );
            "model_checkpoint"
        }
        Some("EarlyStopping") => {
            let s = "callbacks.early_stopping";
            for k in ["verbose", "strict", "check_finite", "log_rank_zero_only"] {
                map.shift_remove(k);
            }
            for k in [
                "stopping_threshold",
                "divergence_threshold",
                "check_on_train_epoch_end",
            ] {
                refuse_unless(map, s, k, is_null, "not available here; remove it")?;
            }
            "early_stopping"
        }
        Some("ModelSummary" | "RichModelSummary") => {
            // Lightning's -1 is "every depth".
            if let Some(n) = map.get_mut("max_depth") {
                if matches!(n.value, Value::Int(i) if i < 0) {
                    n.value = Value::Int(100);
                }
            }
            "model_summary"
        }
        Some("LearningRateMonitor") => {
            let s = "callbacks.lr_monitor";
            drop_null(map, "logging_interval");
            for k in ["log_momentum", "log_weight_decay"] {
                refuse_unless(
                    map,
                    s,
                    k,
                    is_false_or_null,
                    "only the learning rate is logged; remove it",
                )?;
            }
            "lr_monitor"
        }
        Some("DeviceStatsMonitor") => {
            map.shift_remove("cpu_stats");
            "device_stats"
        }
        Some("Timer") => {
            refuse_unless(
                map,
                "callbacks.timer",
                "duration",
                is_null,
                "give the limit as max_time: \"DD:HH:MM:SS\"",
            )?;
            "timer"
        }
        Some("BatchSizeFinder") => "batch_size_finder",
        // The console shows a progress line of its own.
        Some("RichProgressBar" | "TQDMProgressBar") => return Ok(None),
        _ => {
            return Err(unknown_target(
                "callbacks",
                target,
                &KNOWN
                    .map(|c| c.to_string())
                    .join(", ")
                    .split("\0")
                    .collect::<Vec<_>>(),
            ))
        }
    };
    Ok(Some(key))
}

/// One logger: its trainyard key.
fn logger_target(entry: &mut Node, target: &Node) -> Result<Option<&'static str>, ConfigError> {
    let class = class_in(target_text(target), LOGGER_MODULES);
    let Some(map) = entry.as_map_mut() else {
        return Ok(None);
    };
    let key = match class {
        Some("CSVLogger") => {
            let s = "logger.csv";
            // metrics.csv is written in the run directory.
            for k in ["save_dir", "name", "version"] {
                map.shift_remove(k);
            }
            refuse_prefix(map, s)?;
            rename(map, "flush_logs_every_n_steps", "flush_every_n_steps");
            "csv"
        }
        Some("TensorBoardLogger") => {
            let s = "logger.tensorboard";
            rename(map, "save_dir", "dir");
            for k in ["name", "version", "default_hp_metric", "sub_dir"] {
                map.shift_remove(k);
            }
            refuse_unless(
                map,
                s,
                "log_graph",
                is_false_or_null,
                "the model graph is not written; remove it",
            )?;
            refuse_prefix(map, s)?;
            "tensorboard"
        }
        Some("WandbLogger") => {
            let s = "logger.wandb";
            refuse_unless(map, s, "anonymous", is_false_or_null, "anonymous runs need W&B's server at log time; the run is written offline and uploaded with `wandb sync` under your account; remove it")?;
            refuse_prefix(map, s)?;
            "wandb"
        }
        Some("MLFlowLogger") => {
            let s = "logger.mlflow";
            refuse_prefix(map, s)?;
            refuse_unless(
                map,
                s,
                "artifact_location",
                is_null,
                "artifacts go where the tracking server keeps them; remove it",
            )?;
            refuse_unless(
                map,
                s,
                "run_id",
                empty_or_null,
                "a run is not resumed on the server; remove it",
            )?;
            // Only a tracking server is written to: the local ./mlruns directory is not.
            map.shift_remove("save_dir");
            map.shift_remove("synchronous");
            "mlflow"
        }
        Some(other @ ("CometLogger" | "NeptuneLogger")) => {
            return Err(ConfigError::Schema(format!(
                "logger: {other} ({}) is not supported. \
                 Log with logger=csv, tensorboard, wandb or mlflow{}",
                target_text(target),
                at(&target.source)
            )))
        }
        _ if target_text(target).starts_with("aim.") => {
            return Err(ConfigError::Schema(format!(
                "logger: {} is not supported; log with logger=csv or logger=tensorboard{}",
                target_text(target),
                at(&target.source)
            )))
        }
        _ => {
            return Err(unknown_target(
                "logger",
                target,
                &[
                    "lightning.pytorch.loggers.csv_logs.CSVLogger",
                    "lightning.pytorch.loggers.tensorboard.TensorBoardLogger",
                    "lightning.pytorch.loggers.wandb.WandbLogger",
                    "lightning.pytorch.loggers.mlflow.MLFlowLogger",
                ],
            ))
        }
    };
    Ok(Some(key))
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

#[cfg(test)]
mod tests;
mod zoo;
