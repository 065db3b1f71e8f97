//! `optimizer:` and `scheduler:`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerName {
    Sgd,
    Adam,
    Adamw,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerConfig {
    pub name: OptimizerName,
    pub lr: f64,
    #[serde(default)]
    pub momentum: f64,
    #[serde(default)]
    pub nesterov: bool,
    #[serde(default)]
    pub weight_decay: f64,
    #[serde(default = "default_betas")]
    pub betas: [f64; 2],
    #[serde(default = "default_eps")]
    pub eps: f64,
}

fn default_betas() -> [f64; 2] {
    [0.9, 0.999]
}
fn default_eps() -> f64 {
    1e-8
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SchedulerName {
    Onecycle,
    Cosine,
    Step,
    Constant,
    /// torch's `ReduceLROnPlateau`: the rate cut when the monitored metric stops improving.
    Plateau,
}

/// `ReduceLROnPlateau`'s `threshold_mode`: a better value beats the best by a share of it, or by an amount.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ThresholdMode {
    #[default]
    Rel,
    Abs,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Interval {
    #[default]
    Step,
    Epoch,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerConfig {
    pub name: SchedulerName,
    /// Step the schedule every optimizer step or every epoch.
    #[serde(default)]
    pub interval: Interval,
    /// onecycle: peak learning rate (PyTorch's OneCycleLR `max_lr`).
    #[serde(default)]
    pub max_lr: Option<f64>,
    #[serde(default)]
    pub pct_start: Option<f64>,
    #[serde(default)]
    pub div_factor: Option<f64>,
    #[serde(default)]
    pub final_div_factor: Option<f64>,
    /// cosine: linear warm-up length and the floor.
    #[serde(default)]
    pub warmup_epochs: Option<f64>,
    #[serde(default)]
    pub min_lr: Option<f64>,
    /// step: decay every `step_size` intervals by `gamma`.
    #[serde(default)]
    pub step_size: Option<usize>,
    #[serde(default)]
    pub gamma: Option<f64>,
    /// plateau: torch's `ReduceLROnPlateau` arguments under its names (`min_lr` above is its floor;
    /// torch's defaults when unset), checked once per validation on `monitor` (`val/loss` unless set:
    /// Lightning's `monitor` of the scheduler dict).
    #[serde(default)]
    pub monitor: Option<String>,
    #[serde(default)]
    pub mode: Option<super::Mode>,
    #[serde(default)]
    pub factor: Option<f64>,
    #[serde(default)]
    pub patience: Option<u64>,
    #[serde(default)]
    pub threshold: Option<f64>,
    #[serde(default)]
    pub threshold_mode: Option<ThresholdMode>,
    #[serde(default)]
    pub cooldown: Option<u64>,
    #[serde(default)]
    pub eps: Option<f64>,
}
