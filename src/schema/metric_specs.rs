//! `metrics:`: the stateful metrics a run computes, by name, each a `_target_` node as Hydra's
//! `instantiate` reads it — torchmetrics' classes (`torchmetrics.F1Score`, `torchmetrics.R2Score`, ...)
//! or a crate's own (`register_metric!`) — plus trainyard's own key `on_step` (also log each training
//! step's value, as Lightning's `self.log(..., on_step=True)`). Each is built once here, so a bad
//! argument or an unknown `_target_` is refused before the run with its key and file:line.
//!
//! ```yaml
//! metrics:
//!   f1: {_target_: torchmetrics.F1Score, task: multiclass, num_classes: 10, average: macro}
//!   r2: {_target_: torchmetrics.R2Score}
//! ```
//! A multiclass metric without `num_classes` takes the data's (`data.num_classes`).

use crate::config::errors::{at, did_you_mean, ConfigError};
use crate::config::tree::{Node, Value};

/// trainyard's own keys of a `metrics.<name>` node; the others are the metric's arguments.
const OWN_KEYS: &[&str] = &["on_step"];

/// One configured metric.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricSpec {
    /// Its name in the config and in the logged keys (`val/<name>`).
    pub name: String,
    pub target: String,
    pub args: serde_json::Value,
    /// Also logged each training step (`train/<name>_step`), over that step's batch.
    pub on_step: bool,
    pub higher_is_better: bool,
    /// It computes one number (a monitor or a search can read it); otherwise per class or a matrix.
    pub scalar: bool,
    /// `\n    (set at file:line)` of its `_target_`.
    pub origin: String,
}

impl MetricSpec {
    /// A fresh instance (every phase and rank has its own).
    pub fn build(&self) -> anyhow::Result<Box<dyn crate::metrics::Metric>> {
        let build = crate::registry::metric(&self.target)
            .ok_or_else(|| anyhow::anyhow!("metrics.{}: no metric '{}'", self.name, self.target))?;
        build(&self.args)
    }
}

/// The `metrics:` section of a job's config as composed (before typing): the data's classes (an integer
/// `data.num_classes`) fill a multiclass metric's missing `num_classes`.
pub fn read_metrics(job: &Node) -> Result<Vec<MetricSpec>, ConfigError> {
    let classes = job.get("data.num_classes").and_then(|n| match n.value {
        Value::Int(i) => u64::try_from(i).ok(),
        _ => None,
    });
    read(job, classes)
}

/// The `metrics:` section, read and each metric built once; `data_classes` fills a multiclass metric's
/// missing `num_classes`.
pub fn read(job: &Node, data_classes: Option<u64>) -> Result<Vec<MetricSpec>, ConfigError> {
    let Some(section) = job.child("metrics") else {
        return Ok(Vec::new());
    };
    if matches!(section.value, Value::Null) {
        return Ok(Vec::new());
    }
    let Some(map) = section.as_map() else {
        return Err(ConfigError::Schema(format!(
            "Error in config key 'metrics': expected a mapping of name: {{_target_: ..., ...}}, got {}{}",
            section.type_name(),
            at(&section.source)
        )));
    };
    let mut out = Vec::new();
    for (name, node) in map {
        if matches!(node.value, Value::Null) {
            continue; // `metrics.f1: null` turns a preset's metric off
        }
        let key = format!("metrics.{name}");
        let ok_name = !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !matches!(name.as_str(), "loss" | "acc" | "acc1" | "acc5");
        if !ok_name {
            return Err(ConfigError::Schema(format!(
                "Error in config key '{key}': a metric's name is letters, digits and _, and not one the run \
                 records already (loss, acc, acc1, acc5){}",
                at(&node.source)
            )));
        }
        let Some(target) = node.child("_target_").and_then(Node::as_str) else {
            return Err(ConfigError::Schema(format!(
                "Error in config key '{key}': a metric is a node with a _target_ (torchmetrics.F1Score, \
                 torchmetrics.R2Score, or one your crate registered with trainyard::register_metric!){}",
                at(&node.source)
            )));
        };
        let origin = at(&node.child("_target_").expect("read above").source);
        let Some(build) = crate::registry::metric(target) else {
            let known = crate::registry::metric_targets();
            let hint = did_you_mean(target, known.iter().copied())
                .map(|s| format!(" Did you mean '{s}'?"))
                .unwrap_or_default();
            return Err(ConfigError::Schema(format!(
                "Error in config key '{key}._target_': no metric '{target}'.{hint}{origin}\n    Metrics this \
                 program builds: {}\n    Your own: implement trainyard::metrics::Metric and register it with \
                 trainyard::register_metric!(\"my_project.Metric\", constructor)",
                known.join(", ")
            )));
        };
        let on_step = match node.child("on_step") {
            None => false,
            Some(n) => match n.value {
                Value::Bool(b) => b,
                _ => {
                    return Err(ConfigError::Schema(format!(
                        "Error in config key '{key}.on_step': expected true or false{}",
                        at(&n.source)
                    )))
                }
            },
        };
        let mut args = serde_json::Map::new();
        for (k, v) in node.as_map().expect("a node with a child is a map") {
            if k != "_target_" && k != "_partial_" && !OWN_KEYS.contains(&k.as_str()) {
                args.insert(k.clone(), v.to_json());
            }
        }
        let multiclass = args.get("task").and_then(|t| t.as_str()) == Some("multiclass")
            || target.contains(".Multiclass")
            || target.ends_with("DiceScore");
        if let (true, false, Some(c)) = (multiclass, args.contains_key("num_classes"), data_classes)
        {
            args.insert("num_classes".into(), c.into());
        }
        let args = serde_json::Value::Object(args);
        let metric = build(&args).map_err(|e| {
            ConfigError::Schema(format!(
                "Error in config key '{key}': _target_ {target} refused its arguments: {e:#}{origin}"
            ))
        })?;
        out.push(MetricSpec {
            name: name.clone(),
            target: target.to_string(),
            args,
            on_step,
            higher_is_better: metric.higher_is_better(),
            scalar: metric.is_scalar(),
            origin,
        });
    }
    Ok(out)
}
