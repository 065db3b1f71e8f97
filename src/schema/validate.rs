//! From the resolved config tree to the typed `Experiment`: figment extracts it, and every error names the
//! dotted key, the value, where it was set (file:line or the override) and a fix; then the checks serde
//! cannot express (ranges, combinations).

use super::*;
use crate::config::errors::{at, did_you_mean, ConfigError};
use crate::config::tree::Node;
use figment::error::Kind;
use figment::providers::Serialized;
use figment::Figment;

/// Extract the typed experiment from a resolved config, or say exactly what is wrong and where.
///
/// The top-level `hydra` node (sweeper params, run directories) belongs to Hydra, not to the job, and is
/// ignored. `???` values still present are errors.
pub fn extract(config: &Node) -> Result<Experiment, ConfigError> {
    let mut job = config.clone();
    if let Some(map) = job.as_map_mut() {
        map.shift_remove("hydra");
    }
    super::targets::translate(&mut job)?;
    check_no_missing(&job)?;
    let seed_drawn = draw_null_seed(&mut job);
    let declared = declared_model(&job)?;
    let registered = super::registered::registered_model(&job);
    let data = super::registered::registered_data(&job)?;
    let loss = super::registered::registered_loss(&job)?;
    let metrics = super::metric_specs::read_metrics(&job)?;
    let optimizer = super::registered::registered_optimizer(&job)?;
    let schedule = super::registered::registered_schedule(&job)?;
    let (loggers, callbacks) = super::registered::registered_plugins(&job)?;
    let mut json = job.to_json();
    for (section, specs) in [("logger", &loggers), ("callbacks", &callbacks)] {
        if let Some(node) = json.get_mut(section).and_then(|n| n.as_object_mut()) {
            for spec in specs {
                let name = spec.section.split_once('.').map_or("", |(_, n)| n);
                node.remove(name);
            }
        }
    }
    if let (Some(d), Some(node)) = (&data, json.get_mut("data").and_then(|d| d.as_object_mut())) {
        registered_data_fields(node, d);
    }
    if let Some(root) = json.as_object_mut() {
        root.remove("loss");
        root.remove("metrics");
    }
    for (section, own, set) in [
        (
            "optimizer",
            super::registered::REGISTERED_OPTIMIZER_FIELDS,
            optimizer.is_some(),
        ),
        (
            "scheduler",
            super::registered::REGISTERED_SCHEDULER_FIELDS,
            schedule.is_some(),
        ),
    ] {
        if let (true, Some(node)) = (set, json.get_mut(section).and_then(|n| n.as_object_mut())) {
            node.retain(|k, _| own.contains(&k.as_str()));
            node.insert("name".into(), "registered".into());
        }
    }
    let data_classes = json.pointer("/data/num_classes").cloned();
    if let Some(model) = json.get_mut("model").and_then(|m| m.as_object_mut()) {
        if declared.is_some() {
            model.retain(|k, _| DECLARED_MODEL_FIELDS.contains(&k.as_str()));
        } else if registered.is_some() {
            model.retain(|k, _| super::registered::REGISTERED_MODEL_FIELDS.contains(&k.as_str()));
            model.insert("name".into(), "registered".into());
            if let (false, Some(classes)) = (model.contains_key("num_classes"), data_classes) {
                model.insert("num_classes".into(), classes);
            }
        }
    }
    let figment = Figment::from(Serialized::defaults(json));
    let mut experiment: Experiment = figment.extract().map_err(|e| describe(&job, e))?;
    experiment.seed_drawn = seed_drawn;
    experiment.model.declared = declared.map(std::sync::Arc::new);
    experiment.model.registered = registered.map(std::sync::Arc::new);
    experiment.data.registered = data.map(std::sync::Arc::new);
    experiment.loss = loss.map(std::sync::Arc::new);
    experiment.metrics = metrics;
    experiment.optimizer.registered = optimizer.map(std::sync::Arc::new);
    experiment.scheduler.registered = schedule.map(std::sync::Arc::new);
    check_registered_names(&job, &experiment)?;
    experiment.logger.registered = loggers;
    experiment.callbacks.registered = callbacks;
    if let (Some(d), None) = (&experiment.data.registered, &experiment.loss) {
        if d.target_shape.is_some() {
            return Err(ConfigError::Schema(format!(
                "data: _target_ {}: its targets are values of shape {:?}, not classes, so cross-entropy \
                 cannot score them: add a loss that reads them, e.g. +loss._target_=torch.nn.MSELoss (or \
                 your own, registered with trainyard::register_candle_loss!){}",
                d.spec.target,
                d.target_shape.as_deref().unwrap_or_default(),
                d.spec.origin
            )));
        }
    }
    if let (Some(loss), true) = (&experiment.loss, experiment.model.label_smoothing > 0.0) {
        let place = job
            .get("model.label_smoothing")
            .map(|n| at(&n.source))
            .unwrap_or_default();
        return Err(ConfigError::Schema(format!(
            "Error in config key 'model.label_smoothing': it smooths the built-in cross-entropy, which \
             loss: _target_ {} replaces{place}\n    Remove it (torch.nn.CrossEntropyLoss takes \
             loss.label_smoothing)",
            loss.spec.target
        )));
    }
    check_monitors(&job, &mut experiment)?;
    check_plateau_validates(&job, &experiment)?;
    if experiment.extras.enforce_tags && experiment.tags.is_empty() {
        let place = job.get("tags").map(|n| at(&n.source)).unwrap_or_default();
        return Err(ConfigError::Schema(format!(
            "extras.enforce_tags: this run has no tags{place}\n    The template asks for them at a \
             terminal; a trainyard run is unattended, so give them: tags=[mnist,baseline] (or \
             extras.enforce_tags=false)"
        )));
    }
    if let Some(predict) = &experiment.predict {
        check_predict(&job, &experiment, predict)?;
    }
    if !experiment.train && !experiment.test && experiment.predict.is_none() {
        let place = job.get("train").map(|n| at(&n.source)).unwrap_or_default();
        return Err(ConfigError::Schema(format!(
            "Error in config key 'train': train=false with test=false leaves nothing to do{place}\n    \
             To test a checkpoint: test=true ckpt_path=<its path> (or `train eval ckpt_path=...`)"
        )));
    }
    validate(&job, &experiment)?;
    Ok(experiment)
}

/// `train predict`: trains nothing, and writes a format it knows.
fn check_predict(
    job: &Node,
    e: &Experiment,
    predict: &crate::schema::PredictConfig,
) -> Result<(), ConfigError> {
    if e.train {
        let place = job.get("train").map(|n| at(&n.source)).unwrap_or_default();
        return Err(ConfigError::Schema(format!(
            "Error in config key 'predict': predicting trains nothing, but train=true{place}\n    \
             Run `train predict ckpt_path=<checkpoint> ...` (it sets train=false)"
        )));
    }
    let lower = predict.output.to_ascii_lowercase();
    if !lower.ends_with(".csv") && !lower.ends_with(".parquet") {
        let place = job
            .get("predict.output")
            .map(|n| at(&n.source))
            .unwrap_or_default();
        return Err(ConfigError::Schema(format!(
            "Error in config key 'predict.output': '{}' is neither .csv nor .parquet{place}\n    \
             Name the file with one of them: predict.output=predictions.parquet",
            predict.output
        )));
    }
    Ok(())
}

/// `name: registered` is what `extract` writes for a registered `_target_`; written by hand, without one,
/// there is nothing to build.
fn check_registered_names(job: &Node, e: &Experiment) -> Result<(), ConfigError> {
    let unset = [
        (
            "model",
            e.model.name.is(ModelName::REGISTERED) && e.model.registered.is_none(),
        ),
        (
            "optimizer",
            e.optimizer.name == OptimizerName::Registered && e.optimizer.registered.is_none(),
        ),
        (
            "scheduler",
            e.scheduler.name == SchedulerName::Registered && e.scheduler.registered.is_none(),
        ),
    ];
    match unset.iter().find(|(_, unset)| *unset) {
        Some((section, _)) => {
            let place = job
                .get(&format!("{section}.name"))
                .map(|n| at(&n.source))
                .unwrap_or_default();
            Err(ConfigError::Schema(format!(
                "Error in config key '{section}.name': 'registered' stands for a {section} a crate registered, which a node names with its _target_{place}\n    Write {section}: {{_target_: my_project.Name, ...}} instead of {section}.name=registered"
            )))
        }
        None => Ok(()),
    }
}

/// `seed: null` or no `seed` (Lightning's "do not seed"; the template's eval.yaml has none): a seed is
/// drawn for this run, so it is still one seed that the run's ranks share (`trainer::fit` hands rank 0's
/// to all) and the log names; false when one was given.
fn draw_null_seed(job: &mut Node) -> bool {
    use crate::config::tree::Value;
    // Below 2^32: exact as the f64 the ranks agree on it through.
    let drawn = Value::Int(i64::from(rand::random::<u32>()));
    match job.child_mut("seed") {
        Some(seed) if matches!(seed.value, Value::Null) => seed.value = drawn,
        Some(_) => return false,
        None => {
            let source = job.source.clone();
            let Some(root) = job.as_map_mut() else {
                return false;
            };
            root.insert("seed".into(), Node::new(drawn, source));
        }
    }
    true
}

/// ReduceLROnPlateau steps on validations: a run that never validates would keep its rate without a word
/// (Lightning stops: "ReduceLROnPlateau conditioned on metric ... which is not available").
fn check_plateau_validates(job: &Node, e: &Experiment) -> Result<(), ConfigError> {
    let never = matches!(e.trainer.limit_val_batches, super::Limit::Batches(0))
        || matches!(e.trainer.limit_val_batches, super::Limit::Fraction(f) if f == 0.0);
    let plateau = e.scheduler.name == super::SchedulerName::Plateau;
    if let Some(interval) = job
        .get("scheduler.interval")
        .filter(|n| plateau && n.as_str() == Some("step"))
    {
        return Err(ConfigError::Schema(format!(
            "Error in config key 'scheduler.interval': scheduler=plateau is stepped once per validation, on \
             its metric, not every step{}\n    Remove scheduler.interval (or set it to epoch)",
            at(&interval.source)
        )));
    }
    if plateau && never {
        let place = job
            .get("trainer.limit_val_batches")
            .map(|n| at(&n.source))
            .unwrap_or_default();
        return Err(ConfigError::Schema(format!(
            "Error in config key 'trainer.limit_val_batches': scheduler=plateau steps on each validation's \
             {}, and this run never validates{place}\n    Let it validate, or choose another scheduler",
            e.scheduler.monitor.as_deref().unwrap_or("val/loss")
        )));
    }
    Ok(())
}

/// The `ModelConfig` fields a declared model reads; its other keys are its layers, its blocks, or free
/// variables its layers interpolate (`${model.width}`).
const DECLARED_MODEL_FIELDS: &[&str] = &[
    "name",
    "num_classes",
    "dropout",
    "pretrained",
    "label_smoothing",
];

/// ModelCheckpoint's and EarlyStopping's `monitor` name a metric the run records (Lightning stops with
/// "could not find the monitored key" at its first check; we do before training). lightning-hydra-template's
/// `val/acc` is top-1 (`val/acc1`).
fn check_monitors(job: &Node, e: &mut Experiment) -> Result<(), ConfigError> {
    let metrics = RunMetrics::of(e);
    let known = metrics.names();
    let classification = metrics.is_topk_classification();
    let c = &mut e.callbacks;
    let plateau = e.scheduler.name == super::SchedulerName::Plateau;
    let monitors = [
        (
            "callbacks.model_checkpoint.monitor",
            c.model_checkpoint.as_mut().and_then(|m| m.monitor.as_mut()),
        ),
        (
            "callbacks.early_stopping.monitor",
            c.early_stopping.as_mut().map(|s| &mut s.monitor),
        ),
        (
            "scheduler.monitor",
            e.scheduler.monitor.as_mut().filter(|_| plateau),
        ),
    ];
    for (key, monitor) in monitors {
        let Some(name) = monitor else { continue };
        if classification && !known.contains(name) {
            if let Some(top1) = name
                .strip_prefix("val/acc")
                .filter(|r| r.is_empty() || *r == "_best")
            {
                *name = format!("val/acc1{top1}");
            }
        }
        if known.contains(name) {
            continue;
        }
        let place = job.get(key).map(|n| at(&n.source)).unwrap_or_default();
        let hint = did_you_mean(name, known.iter().map(String::as_str))
            .map(|s| format!("\n    Did you mean '{s}'?"))
            .unwrap_or_default();
        return Err(ConfigError::Schema(format!(
            "Error in config key '{key}': the run records no metric '{name}'{place}{hint}\n    It records: {}",
            known.join(", ")
        )));
    }
    Ok(())
}

/// A registered dataset's node as `DataConfig` reads it: the loader's keys, and what the samples say
/// (channels and side for `[C, H, H]` inputs; classes, or the `model.num_classes` outputs default of 1).
fn registered_data_fields(
    node: &mut serde_json::Map<String, serde_json::Value>,
    d: &RegisteredData,
) {
    node.retain(|k, _| super::registered::REGISTERED_DATA_FIELDS.contains(&k.as_str()));
    node.insert("name".into(), "registered".into());
    // As the loader lays the samples out: square images as C x H x H, any other shape flattened.
    let (channels, side) = match d.input_shape.as_slice() {
        [c, h, w] if h == w => (*c, *h),
        [c, _, _] => (*c, 1), // not square: registered models only (`Architecture::of`)
        shape => (shape.iter().product(), 1),
    };
    node.insert("channels".into(), channels.into());
    node.insert("image_size".into(), side.into());
    let outputs = d
        .num_classes
        .or_else(|| d.target_shape.as_ref().map(|s| s.iter().product()))
        .unwrap_or(1);
    node.entry("num_classes").or_insert(outputs.into());
}

/// `model.name: declared`: its layers read from the tree (with provenance). A free key one typo away from
/// `layers`/`blocks` is taken for a typo, not a variable.
fn declared_model(job: &Node) -> Result<Option<super::declared::DeclaredSpec>, ConfigError> {
    let Some(model) = job.child("model") else {
        return Ok(None);
    };
    if model.child("name").and_then(|n| n.as_str()) != Some("declared") {
        return Ok(None);
    }
    for (key, node) in model.as_map().into_iter().flatten() {
        let typo = super::declared::DECLARED_KEYS
            .iter()
            .find(|known| **known != key && strsim::damerau_levenshtein(key, known) <= 1);
        if let Some(known) = typo {
            return Err(ConfigError::Schema(format!(
                "Error in config key 'model.{key}': a declared model has no key '{key}'{}\n    Did you mean \
                 'model.{known}'?",
                at(&node.source)
            )));
        }
    }
    super::declared::parse(model).map(Some)
}

fn check_no_missing(config: &Node) -> Result<(), ConfigError> {
    let mut missing = None;
    let mut path = String::new();
    config.walk(&mut path, &mut |p, n| {
        if missing.is_none() && n.is_missing() {
            missing = Some((p.to_string(), n.source.clone()));
        }
    });
    match missing {
        Some((key, source)) => Err(ConfigError::Schema(format!(
            "Missing mandatory value: {key}{}\n    Set it with {key}=<value>",
            at(&source)
        ))),
        None => Ok(()),
    }
}

/// The node an error is about: the node at `path`, else its deepest ancestor below the root.
fn locate<'a>(config: &'a Node, path: &[String]) -> Option<&'a Node> {
    (1..=path.len())
        .rev()
        .find_map(|n| config.get(&path[..n].join(".")))
}

/// A value as the user wrote it, on one line: ` = 64`, ` = {"size": 32}`.
fn shown(node: Option<&Node>) -> String {
    let Some(node) = node else {
        return String::new();
    };
    let text = match node.to_json() {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    };
    let text = if text.chars().count() > 80 {
        format!("{}...", text.chars().take(77).collect::<String>())
    } else {
        text
    };
    format!(" = {text}")
}

/// Turn a figment error into ours: key path, value, source, fix.
fn describe(config: &Node, error: figment::Error) -> ConfigError {
    let key = error.path.join(".");
    let node = locate(config, &error.path);
    let place = node.map(|n| at(&n.source)).unwrap_or_default();
    let exact = config.get(&key).filter(|_| !key.is_empty());
    let shown = shown(exact);
    let msg = match &error.kind {
        Kind::UnknownField(field, expected) => {
            // figment's path ends with the unknown key itself; be robust if it does not.
            let parent = match error.path.last() {
                Some(last) if last == field => error.path[..error.path.len() - 1].join("."),
                _ => key.clone(),
            };
            let full = if parent.is_empty() {
                field.clone()
            } else {
                format!("{parent}.{field}")
            };
            let node = config.get(&full);
            let place = node.map(|n| at(&n.source)).unwrap_or_default();
            let mut m = format!("Error in config key '{full}': unknown key{place}");
            match did_you_mean(field, expected.iter().copied()) {
                Some(s) => {
                    let fix = if parent.is_empty() {
                        s
                    } else {
                        format!("{parent}.{s}")
                    };
                    m.push_str(&format!("\n    Did you mean '{fix}'?"));
                }
                None => m.push_str(&format!("\n    Known keys here: {}", expected.join(", "))),
            }
            m
        }
        Kind::UnknownVariant(variant, expected) => {
            let mut m =
                format!("Error in config key '{key}': '{variant}' is not a valid choice{place}");
            if let Some(s) = did_you_mean(variant, expected.iter().copied()) {
                m.push_str(&format!("\n    Did you mean '{s}'?"));
            }
            m.push_str(&format!("\n    Valid choices: {}", expected.join(", ")));
            m
        }
        Kind::MissingField(field) => {
            let full = if key.is_empty() {
                field.to_string()
            } else {
                format!("{key}.{field}")
            };
            format!(
                "Error in config key '{full}': missing{}\n    Set it in the config group or with +{full}=<value>",
                if key.is_empty() { String::new() } else { node.map(|n| at(&n.source)).unwrap_or_default() }
            )
        }
        Kind::InvalidType(actual, expected) => format!(
            "Error in config key '{key}'{shown}: expected {expected}, found {actual}{place}"
        ),
        Kind::InvalidValue(actual, expected) => format!(
            "Error in config key '{key}'{shown}: expected {expected}, found {actual}{place}"
        ),
        Kind::InvalidLength(len, expected) => format!(
            "Error in config key '{key}'{shown}: expected {expected}, found {len} items{place}"
        ),
        Kind::Message(text) => format!("Error in config key '{key}'{shown}: {text}{place}"),
        other => format!("Error in config key '{key}'{shown}: {other}{place}"),
    };
    ConfigError::Schema(msg)
}

/// Keys of `model` that only some models read: (key, the `model.name`s that use it), from the zoo's
/// registrations (`registry::ZooModel::keys`).
fn model_only() -> Vec<(&'static str, Vec<&'static str>)> {
    let mut table: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
    for m in crate::registry::zoo_models() {
        for &key in m.keys {
            match table.iter_mut().find(|(k, _)| *k == key) {
                Some((_, users)) => users.push(m.name),
                None => table.push((key, vec![m.name])),
            }
        }
    }
    table
}
const DATA_ONLY: &[(&str, &[&str])] = &[
    ("train_size", &["synthetic"]),
    ("val_size", &["synthetic"]),
    ("image_column", &["parquet"]),
    ("train_urls", &["webdataset"]),
    ("val_urls", &["webdataset"]),
    ("test_urls", &["webdataset"]),
    ("stream_shards", &["webdataset"]),
];
const OPTIMIZER_ONLY: &[(&str, &[&str])] = &[
    ("momentum", &["sgd"]),
    ("nesterov", &["sgd"]),
    ("betas", &["adam", "adamw"]),
    ("eps", &["adam", "adamw"]),
];
const SCHEDULER_ONLY: &[(&str, &[&str])] = &[
    ("max_lr", &["onecycle"]),
    ("pct_start", &["onecycle"]),
    ("div_factor", &["onecycle"]),
    ("final_div_factor", &["onecycle"]),
    ("warmup_epochs", &["cosine"]),
    ("min_lr", &["cosine", "plateau"]),
    ("step_size", &["step"]),
    ("gamma", &["step"]),
    ("monitor", &["plateau"]),
    ("mode", &["plateau"]),
    ("factor", &["plateau"]),
    ("patience", &["plateau"]),
    ("threshold", &["plateau"]),
    ("threshold_mode", &["plateau"]),
    ("cooldown", &["plateau"]),
    ("eps", &["plateau"]),
];

/// A key set (not null) in `section` that its chosen `name` does not read is a mistake, typically left over
/// from a config written for another model, optimizer or schedule: say so rather than silently ignore it.
fn check_applies(
    config: &Node,
    section: &str,
    table: &[(&str, &[&str])],
) -> Result<(), ConfigError> {
    let Some(name) = config
        .get(&format!("{section}.name"))
        .and_then(|n| n.as_str())
    else {
        return Ok(());
    };
    for (key, users) in table {
        let full = format!("{section}.{key}");
        let Some(node) = config.get(&full) else {
            continue;
        };
        if matches!(node.value, crate::config::tree::Value::Null) || users.contains(&name) {
            continue;
        }
        return Err(ConfigError::Schema(format!(
            "Error in config key '{full}'{}: {section} '{name}' does not use this key (only {} do){}\n    \
             Remove it, or set it to null",
            shown(Some(node)),
            users.join(", "),
            at(&node.source)
        )));
    }
    Ok(())
}

/// Checks serde cannot express: fields that only make sense for some models or strategies.
fn validate(config: &Node, e: &Experiment) -> Result<(), ConfigError> {
    let fail = |key: &str, msg: String| {
        let place = config.get(key).map(|n| at(&n.source)).unwrap_or_default();
        Err(ConfigError::Schema(format!(
            "Error in config key '{key}': {msg}{place}"
        )))
    };
    let m = &e.model;
    // A declared model's other keys are free variables (`${model.width}`), whatever their names.
    let model_only = match m.name.is(ModelName::DECLARED) {
        true => Vec::new(),
        false => model_only(),
    };
    let model_only: Vec<(&str, &[&str])> =
        model_only.iter().map(|(k, u)| (*k, u.as_slice())).collect();
    for (section, table) in [
        ("model", model_only.as_slice()),
        ("optimizer", OPTIMIZER_ONLY),
        ("scheduler", SCHEDULER_ONLY),
        ("data", DATA_ONLY),
    ] {
        check_applies(config, section, table)?;
    }
    if let Some(zoo) = crate::registry::zoo_model(m.name.as_str()) {
        if !zoo.dropout && m.dropout != 0.0 {
            return fail(
                "model.dropout",
                format!(
                    "{} has no dropout before its head (as torchvision builds it), so {} would be \
                     ignored; remove it (architectures with one: {})",
                    m.name,
                    m.dropout,
                    crate::registry::zoo_models()
                        .iter()
                        .filter(|z| z.dropout)
                        .map(|z| z.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
    }
    if m.name.is("vit") {
        if m.variant.is_none() {
            return fail(
                "model.variant",
                "a vit needs a variant: tiny, small or base".into(),
            );
        }
        let image = m.image_size.unwrap_or(e.data.image_size);
        match m.patch_size {
            Some(p) if p > 0 && image.is_multiple_of(p) => {}
            Some(p) => {
                return fail(
                    "model.patch_size",
                    format!(
                        "patch size {p} must divide the image size {image} (e.g. 4 or 8 for 32px CIFAR images, \
                         16 or 32 for 224px)"
                    ),
                )
            }
            None => {
                return fail(
                    "model.patch_size",
                    "a vit needs patch_size (16 or 32 for the published weights)".into(),
                )
            }
        }
    }
    let gs = &e.trainer.grad_scaler;
    for (key, ok, rule) in [
        (
            "init_scale",
            gs.init_scale > 0.0,
            "must be > 0 (default 65536.0)",
        ),
        (
            "growth_factor",
            gs.growth_factor > 1.0,
            "must be > 1 (default 2.0)",
        ),
        (
            "backoff_factor",
            gs.backoff_factor > 0.0 && gs.backoff_factor < 1.0,
            "must be in (0, 1) (default 0.5)",
        ),
        (
            "growth_interval",
            gs.growth_interval >= 1,
            "must be at least 1 (default 2000)",
        ),
    ] {
        if !ok {
            return fail(&format!("trainer.grad_scaler.{key}"), rule.into());
        }
    }
    if !(0.0..1.0).contains(&m.label_smoothing) {
        return fail(
            "model.label_smoothing",
            format!("{} is outside [0, 1): use e.g. 0.1", m.label_smoothing),
        );
    }
    if m.name.is("mlp") && m.hidden.as_ref().is_none_or(|h| h.contains(&0)) {
        return fail(
            "model.hidden",
            "an mlp needs hidden: a list of layer widths, each at least 1 (e.g. [512, 256])".into(),
        );
    }
    if m.channels
        .as_ref()
        .is_some_and(|c| c.is_empty() || c.contains(&0))
    {
        return fail(
            "model.channels",
            "channels must be a non-empty list of widths, each at least 1".into(),
        );
    }
    if e.optimizer.nesterov && e.optimizer.momentum <= 0.0 {
        return fail(
            "optimizer.nesterov",
            "Nesterov momentum needs momentum > 0; set optimizer.momentum=0.9 or optimizer.nesterov=false"
                .into(),
        );
    }
    if m.num_classes != e.data.num_classes {
        return fail(
            "model.num_classes",
            format!(
                "the model predicts {} classes but the data set has {}; set model.num_classes=${{data.num_classes}}",
                m.num_classes, e.data.num_classes
            ),
        );
    }
    if !(0.0..1.0).contains(&m.dropout) {
        return fail(
            "model.dropout",
            format!("dropout must be in [0, 1), got {}", m.dropout),
        );
    }
    if e.data.batch_size == 0 {
        return fail("data.batch_size", "batch size must be at least 1".into());
    }
    if e.optimizer.lr <= 0.0 {
        return fail(
            "optimizer.lr",
            format!("learning rate must be positive, got {}", e.optimizer.lr),
        );
    }
    let t = &e.trainer;
    if t.strategy == Strategy::Fsdp && t.fsdp.is_none() {
        return fail(
            "trainer.fsdp",
            "strategy fsdp needs trainer.fsdp.{sharding_strategy,state_dict_type}".into(),
        );
    }
    if t.strategy == Strategy::Single
        && (t.num_nodes > 1 || matches!(t.devices, Devices::Count(n) if n > 1))
    {
        return fail(
            "trainer.strategy",
            "strategy single runs one process on one device; use trainer=ddp (or dp) for more devices or nodes".into(),
        );
    }
    if t.num_nodes == 0 {
        return fail("trainer.num_nodes", "num_nodes must be at least 1".into());
    }
    Ok(())
}
