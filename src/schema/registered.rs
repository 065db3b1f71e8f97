//! `_target_` nodes that name what a crate registered (`registry`): a model, a dataset, a loss. Each is
//! read from the tree with its provenance (the node's other keys become the constructor's arguments, each
//! with where it was set), so a constructor's refusal — serde's unknown field or wrong type, or its own
//! check — points at the key and its file:line. A dataset and a loss are built once here, at compose
//! time: a bad argument fails before any training starts, and the run learns the samples' shapes and the
//! loss's metrics.

use crate::config::errors::{at, did_you_mean, ConfigError};
use crate::config::tree::Node;
use crate::registry::{AnyRule, DataContext, DataSplit, LrSchedule, Metric, Target, UserDataset};
use std::sync::Arc;

/// `<section>: {_target_: <registered>, ...}`: the constructor's name and its arguments (the node's other
/// keys, less trainyard's own).
#[derive(Debug, Clone, PartialEq)]
pub struct RegisteredSpec {
    pub target: String,
    pub args: serde_json::Value,
    /// `\n    (set at file:line)` of the `_target_`, or empty.
    pub origin: String,
    /// Each argument's key and where it was set (a file line or an override).
    pub arg_origins: Vec<(String, String)>,
    /// The config section it was read from (`model`, `data`, `loss`).
    pub section: String,
}

impl RegisteredSpec {
    /// Read `section`'s node when its `_target_` is one `is_registered` knows; `own` are trainyard's keys.
    fn read(
        job: &Node,
        section: &str,
        own: &[&str],
        is_registered: impl Fn(&str) -> bool,
    ) -> Option<RegisteredSpec> {
        let node = job.child(section)?;
        let name = node.child("_target_")?.as_str()?;
        if !is_registered(name) {
            return None;
        }
        Self::from_node(node, section, own)
    }

    /// `node` (a map with a string `_target_`) read as the `section` it is.
    fn from_node(node: &Node, section: &str, own: &[&str]) -> Option<RegisteredSpec> {
        let target = node.child("_target_")?;
        let name = target.as_str()?;
        let given: Vec<(&String, &Node)> = node
            .as_map()?
            .iter()
            .filter(|(k, _)| {
                !own.contains(&k.as_str()) && !matches!(k.as_str(), "_target_" | "_partial_")
            })
            .collect();
        Some(RegisteredSpec {
            target: name.to_string(),
            args: serde_json::Value::Object(
                given
                    .iter()
                    .map(|(k, v)| ((*k).clone(), v.to_json()))
                    .collect(),
            ),
            origin: at(&target.source),
            arg_origins: given
                .iter()
                .map(|(k, v)| ((*k).clone(), at(&v.source)))
                .collect(),
            section: section.to_string(),
        })
    }

    /// The constructor's refusal, at the argument serde named (or the `_target_`).
    pub fn refused(&self, error: &anyhow::Error) -> String {
        let msg = format!("{error:#}");
        let (key, origin) = self
            .arg_origins
            .iter()
            .find(|(k, _)| msg.contains(&format!("field `{k}`")))
            .map(|(k, o)| (format!("{}.{k}", self.section), o.as_str()))
            .unwrap_or_else(|| (self.section.clone(), self.origin.as_str()));
        format!(
            "Error in config key '{key}' (_target_ {}): building it failed: {msg}{origin}",
            self.target
        )
    }
}

/// A registered dataset: its spec and what its samples look like (read from the first training sample).
#[derive(Debug, Clone, PartialEq)]
pub struct RegisteredData {
    pub spec: RegisteredSpec,
    /// The training split, opened here to check it: the loader reads this one rather than build it again.
    pub train: OpenedDataset,
    /// One sample's input shape.
    pub input_shape: Vec<usize>,
    /// One sample's target shape when the targets are values; `None` when they are classes.
    pub target_shape: Option<Vec<usize>>,
    pub num_classes: Option<usize>,
}

/// A dataset a constructor built, shared (the same one is the same; its contents are not compared).
#[derive(Clone)]
pub struct OpenedDataset(pub UserDataset);

impl std::fmt::Debug for OpenedDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.0 {
            UserDataset::Map(_) => "samples",
            UserDataset::Sharded(_) => "samples in shards",
        };
        write!(f, "OpenedDataset({} {kind})", self.0.len())
    }
}

impl PartialEq for OpenedDataset {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (UserDataset::Map(a), UserDataset::Map(b)) => Arc::ptr_eq(a, b),
            (UserDataset::Sharded(a), UserDataset::Sharded(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// A registered loss: its spec and the metrics it reports.
#[derive(Debug, Clone, PartialEq)]
pub struct LossSpec {
    pub spec: RegisteredSpec,
    pub metrics: Vec<Metric>,
}

/// trainyard's own keys of a registered model's node (`num_classes` defaults to the data's); the others
/// are its constructor's arguments.
pub const REGISTERED_MODEL_FIELDS: &[&str] = &["num_classes", "pretrained", "label_smoothing"];

/// trainyard's own keys of a registered dataset's node: the loader's, and `num_classes` (the model's
/// outputs, which zoo configs read as `${data.num_classes}`; by default the dataset's classes, or its
/// targets' size).
pub const REGISTERED_DATA_FIELDS: &[&str] = &[
    "batch_size",
    "num_workers",
    "pin_memory",
    "drop_last",
    "num_classes",
    "shuffle_buffer",
    "uneven_shards",
];

/// `model: {_target_: <a registered model>, ...}`.
pub fn registered_model(job: &Node) -> Option<RegisteredSpec> {
    RegisteredSpec::read(job, "model", REGISTERED_MODEL_FIELDS, |t| {
        crate::registry::is_model(t)
    })
}

/// `data: {_target_: <a registered dataset>, ...}`: opened once (training split) to check its arguments
/// and read its first sample's shapes.
pub fn registered_data(job: &Node) -> Result<Option<RegisteredData>, ConfigError> {
    let Some(spec) = RegisteredSpec::read(job, "data", REGISTERED_DATA_FIELDS, |t| {
        crate::registry::dataset(t).is_some()
    }) else {
        return Ok(None);
    };
    let fail = |msg: String| ConfigError::Schema(msg);
    let entry = crate::registry::dataset(&spec.target).expect("read checked it is registered");
    let seed = job
        .child("seed")
        .and_then(|s| s.to_json().as_u64())
        .unwrap_or(0);
    let ctx = DataContext {
        split: DataSplit::Train,
        seed,
    };
    let set = (entry.build)(&spec.args, &ctx).map_err(|e| fail(spec.refused(&e)))?;
    if set.is_empty() {
        return Err(fail(format!(
            "Error in config key 'data' (_target_ {}): the training split has no samples{}",
            spec.target, spec.origin
        )));
    }
    let first = set.first().map_err(|e| {
        fail(format!(
            "data: _target_ {}: reading sample 0: {e:#}{}",
            spec.target, spec.origin
        ))
    })?;
    let numel: usize = first.shape.iter().product();
    if numel != first.input.len() || first.shape.is_empty() {
        return Err(fail(format!(
            "data: _target_ {}: sample 0 has {} input values but its shape {:?} holds {numel}{}",
            spec.target,
            first.input.len(),
            first.shape,
            spec.origin
        )));
    }
    let (target_shape, num_classes) = match &first.target {
        Target::Class(_) => match set.num_classes() {
            Some(n) => {
                check_classes(job, n, &spec)?;
                (None, Some(n))
            }
            None => {
                return Err(fail(format!(
                "data: _target_ {}: its samples' targets are classes, but its num_classes() says \
                     None; return Some(classes) from its num_classes(){}",
                spec.target, spec.origin
            )))
            }
        },
        Target::Values { shape, values } => {
            if shape.iter().product::<usize>() != values.len() {
                return Err(fail(format!(
                    "data: _target_ {}: sample 0's target has {} values but its shape {shape:?} holds {}{}",
                    spec.target,
                    values.len(),
                    shape.iter().product::<usize>(),
                    spec.origin
                )));
            }
            if let Some(n) = set.num_classes() {
                check_classes(job, n, &spec)?;
            }
            (Some(shape.clone()), set.num_classes())
        }
    };
    Ok(Some(RegisteredData {
        input_shape: first.shape,
        target_shape,
        num_classes,
        spec,
        train: OpenedDataset(set),
    }))
}

/// `data.num_classes`, when set beside a dataset that counts its classes, is that count.
fn check_classes(job: &Node, classes: usize, spec: &RegisteredSpec) -> Result<(), ConfigError> {
    let Some(node) = job.get("data.num_classes") else {
        return Ok(());
    };
    match node.to_json().as_u64() {
        Some(n) if n as usize == classes => Ok(()),
        _ => Err(ConfigError::Schema(format!(
            "Error in config key 'data.num_classes': {} says its samples have {classes} classes, the config \
             says {}{}\n    Set data.num_classes={classes}, or leave it out (it defaults to the dataset's)",
            spec.target,
            node.to_json(),
            at(&node.source)
        ))),
    }
}

/// `loss: {_target_: <a registered loss>, ...}`: built once to check its arguments and learn its metrics.
pub fn registered_loss(job: &Node) -> Result<Option<LossSpec>, ConfigError> {
    let Some(node) = job.child("loss") else {
        return Ok(None);
    };
    if matches!(node.value, crate::config::tree::Value::Null) {
        return Ok(None);
    }
    let Some(target) = node.child("_target_").and_then(|t| t.as_str()) else {
        return Err(ConfigError::Schema(format!(
            "Error in config key 'loss': a loss is a node with a _target_ (loss: {{_target_: \
             torch.nn.MSELoss}}){}",
            at(&node.source)
        )));
    };
    let Some(spec) = RegisteredSpec::read(job, "loss", &[], crate::registry::is_loss) else {
        let known = crate::registry::loss_targets();
        let hint = did_you_mean(target, known.iter().copied())
            .map(|s| format!("\n    Did you mean '{s}'?"))
            .unwrap_or_else(|| format!("\n    Registered losses: {}", known.join(", ")));
        let place = node
            .child("_target_")
            .map(|t| at(&t.source))
            .unwrap_or_default();
        return Err(ConfigError::Schema(format!(
            "Error in config key 'loss._target_': no loss is registered as '{target}'{place}{hint}\n    \
             A loss written in Rust is registered with trainyard::register_candle_loss! (or \
             register_tch_loss!)"
        )));
    };
    let metrics = crate::registry::loss_metrics(&spec.target, &spec.args)
        .map_err(|e| ConfigError::Schema(spec.refused(&e)))?;
    let mut seen: Vec<&str> = vec!["loss"];
    for m in &metrics {
        let ok = !m.name.is_empty()
            && m.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok || seen.contains(&m.name.as_str()) {
            return Err(ConfigError::Schema(format!(
                "loss: _target_ {} reports a metric named '{}': metric names are distinct, not 'loss', \
                 and made of letters, digits and _{}",
                spec.target, m.name, spec.origin
            )));
        }
        seen.push(&m.name);
    }
    if metrics.len() > crate::registry::MAX_METRICS {
        return Err(ConfigError::Schema(format!(
            "loss: _target_ {} reports {} metrics; a run records at most {}{}",
            spec.target,
            metrics.len(),
            crate::registry::MAX_METRICS,
            spec.origin
        )));
    }
    Ok(Some(LossSpec { spec, metrics }))
}

/// A registered optimizer: its spec and its rule, built once at compose time (its arguments checked) and
/// handed each parameter at every step.
#[derive(Clone)]
pub struct RegisteredOptimizer {
    pub spec: RegisteredSpec,
    pub rule: Arc<dyn AnyRule>,
    /// The state slots its rule keeps per parameter.
    pub slots: Vec<&'static str>,
}

impl std::fmt::Debug for RegisteredOptimizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RegisteredOptimizer({}, slots {:?})",
            self.spec.target, self.slots
        )
    }
}

impl PartialEq for RegisteredOptimizer {
    fn eq(&self, other: &Self) -> bool {
        self.spec == other.spec && Arc::ptr_eq(&self.rule, &other.rule)
    }
}

/// A registered learning-rate schedule, built once at compose time.
#[derive(Clone)]
pub struct RegisteredSchedule {
    pub spec: RegisteredSpec,
    pub schedule: Arc<dyn LrSchedule>,
}

impl std::fmt::Debug for RegisteredSchedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RegisteredSchedule({})", self.spec.target)
    }
}

impl PartialEq for RegisteredSchedule {
    fn eq(&self, other: &Self) -> bool {
        self.spec == other.spec && Arc::ptr_eq(&self.schedule, &other.schedule)
    }
}

/// trainyard's own key of a registered optimizer's node: the rate the schedule starts from.
pub const REGISTERED_OPTIMIZER_FIELDS: &[&str] = &["lr"];

/// trainyard's own key of a registered schedule's node: Lightning's `interval` (step or epoch).
pub const REGISTERED_SCHEDULER_FIELDS: &[&str] = &["interval"];

/// `_partial_` on an optimizer or a schedule: Hydra's partial, completed later with what only the run has
/// (the parameters, the run's length), so `true` or absent; `false` would ask for it whole now.
pub(super) fn check_partial(job: &Node, section: &str, target: &str) -> Result<(), ConfigError> {
    let Some(node) = job.get(&format!("{section}._partial_")) else {
        return Ok(());
    };
    match node.value {
        crate::config::tree::Value::Bool(true) => Ok(()),
        crate::config::tree::Value::Bool(false) => Err(ConfigError::Schema(format!(
            "Error in config key '{section}._partial_': _target_ {} is completed later with what only the run has ({}), as Hydra's partial is; it cannot be built whole{}\n    Make it true where it is set, or leave it out",
            target,
            match section {
                "optimizer" => "the model's parameters",
                _ => "the optimizer and the run's length",
            },
            at(&node.source)
        ))),
        ref other => Err(ConfigError::Schema(format!(
            "Error in config key '{section}._partial_': expected true or false, got {}{}",
            other.display_python(),
            at(&node.source)
        ))),
    }
}

/// `section`'s node when its `_target_` is registered (`is_registered`), with its `_partial_` checked: an
/// optimizer's or a schedule's.
fn partial_spec(
    job: &Node,
    section: &str,
    own: &[&str],
    is_registered: impl Fn(&str) -> bool,
) -> Result<Option<RegisteredSpec>, ConfigError> {
    let Some(spec) = RegisteredSpec::read(job, section, own, is_registered) else {
        return Ok(None);
    };
    check_partial(job, section, &spec.target)?;
    Ok(Some(spec))
}

/// `optimizer: {_target_: <a registered optimizer>, _partial_: true, lr: ..., ...}`: its rule built once
/// (arguments checked) and its slots checked.
pub fn registered_optimizer(job: &Node) -> Result<Option<RegisteredOptimizer>, ConfigError> {
    let Some(spec) = partial_spec(job, "optimizer", REGISTERED_OPTIMIZER_FIELDS, |t| {
        crate::registry::optimizer(t).is_some()
    })?
    else {
        return Ok(None);
    };
    let entry = crate::registry::optimizer(&spec.target).expect("read checked it is registered");
    let rule = (entry.build)(&spec.args).map_err(|e| ConfigError::Schema(spec.refused(&e)))?;
    let slots = rule.slot_names();
    for (i, slot) in slots.iter().enumerate() {
        let ok = !slot.is_empty() && slot.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok || slots[..i].contains(slot) {
            return Err(ConfigError::Schema(format!(
                "optimizer: _target_ {} keeps a state slot named '{slot}': slot names are distinct and made of letters, digits and _{}",
                spec.target, spec.origin
            )));
        }
    }
    Ok(Some(RegisteredOptimizer { spec, rule, slots }))
}

/// `scheduler: {_target_: <a registered schedule>, _partial_: true, ...}`: built once (arguments checked).
pub fn registered_schedule(job: &Node) -> Result<Option<RegisteredSchedule>, ConfigError> {
    let Some(spec) = partial_spec(job, "scheduler", REGISTERED_SCHEDULER_FIELDS, |t| {
        crate::registry::schedule(t).is_some()
    })?
    else {
        return Ok(None);
    };
    let entry = crate::registry::schedule(&spec.target).expect("read checked it is registered");
    let schedule = (entry.build)(&spec.args).map_err(|e| ConfigError::Schema(spec.refused(&e)))?;
    Ok(Some(RegisteredSchedule { spec, schedule }))
}

/// A `_target_` at `section` that nothing registered: the project's own Python code, or a typo among the
/// names `registered` lists (`what`, registered with `register`).
pub(super) fn unregistered(
    section: &str,
    target: &Node,
    what: &str,
    register: &str,
    registered: &[&str],
) -> ConfigError {
    let text = super::target_names::target_text(target);
    // A near miss of a registered name is a typo: said first, before anything about Python code.
    if let Some(s) = did_you_mean(text, registered.iter().copied()) {
        return ConfigError::Schema(format!(
            "{section}: _target_ {text} is not registered by this program. Did you mean '{s}'?{}\n    \
             Registered {what}s: {}\n    (a {what} written in Rust is registered under its _target_ with \
             trainyard::{register})",
            crate::config::errors::at(&target.source),
            registered.join(", ")
        ));
    }
    let mut e = super::target_names::user_code(section, target).to_string();
    e.push_str(&format!(
        "\n    A {what} written in Rust is registered under its _target_ with trainyard::{register} in your \
         crate (see examples/own-model)"
    ));
    if !registered.is_empty() {
        e.push_str(&format!(
            "\n    Registered {what}s: {}",
            registered.join(", ")
        ));
    }
    ConfigError::Schema(e)
}

/// The loggers and callbacks a crate registered, as the config names them (`logger.<name>`,
/// `callbacks.<name>` with a registered `_target_`), their arguments checked against the types their
/// constructors take: a bad one fails here, at its key and file:line, before anything runs.
pub fn registered_plugins(
    job: &Node,
) -> Result<(Vec<RegisteredSpec>, Vec<RegisteredSpec>), ConfigError> {
    let read = |section: &str| -> Result<Vec<RegisteredSpec>, ConfigError> {
        let Some(map) = job.child(section).and_then(Node::as_map) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for (name, node) in map {
            let Some(target) = node.child("_target_").and_then(Node::as_str) else {
                continue;
            };
            let check = match section {
                "callbacks" => crate::registry::callback(target).map(|e| e.check),
                _ => crate::registry::logger(target).map(|e| e.check),
            };
            let Some(check) = check else { continue };
            let spec = RegisteredSpec::from_node(node, &format!("{section}.{name}"), &[])
                .expect("a map with a string _target_");
            check(&spec.args).map_err(|e| ConfigError::Schema(spec.refused(&e)))?;
            out.push(spec);
        }
        Ok(out)
    };
    Ok((read("logger")?, read("callbacks")?))
}
