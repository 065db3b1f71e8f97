//! Lightning's own `_target_`s: the `Trainer` (with its profiler) and the `callbacks:` / `logger:` entries,
//! each moved onto trainyard's key for it with Lightning's arguments kept, ignored or refused by name.

use super::*;

const TRAINER_MODULES: &[&str] = &[
    "lightning.pytorch.trainer",
    "lightning.pytorch",
    "lightning",
    "pytorch_lightning.trainer",
    "pytorch_lightning",
];

pub(super) fn trainer_target(node: &mut Node, target: &Node) -> Result<(), ConfigError> {
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
pub(super) fn translate_entries(
    node: &mut Node,
    section: &str,
    lightning: bool,
) -> Result<(), ConfigError> {
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
fn is_registered_plugin(section: &str, target: &str) -> bool {
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
