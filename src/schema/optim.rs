//! `optimizer:` and `scheduler:`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerName {
    Sgd,
    Adam,
    Adamw,
    /// An optimizer a crate registered under its `_target_` (`registry::register_optimizer!`); set by
    /// `schema::extract`.
    Registered,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OptimizerConfig {
    /// torch.optim's optimizer: `sgd`, `adam`, `adamw`; `registered` is set for you when the node names
    /// a registered `_target_`.
    pub name: OptimizerName,
    /// The learning rate (the schedule's base).
    pub lr: f64,
    /// sgd: momentum.
    #[serde(default)]
    pub momentum: f64,
    /// sgd: Nesterov momentum.
    #[serde(default)]
    pub nesterov: bool,
    /// L2 penalty (sgd, adam) or decoupled decay (adamw), as torch.optim applies it.
    #[serde(default)]
    pub weight_decay: f64,
    /// adam/adamw: the running averages' coefficients.
    #[serde(default = "default_betas")]
    pub betas: [f64; 2],
    /// adam/adamw: added to the denominator for stability.
    #[serde(default = "default_eps")]
    pub eps: f64,
    /// `registered`: the `_target_`, its arguments and its rule (`schema::extract` fills it).
    #[serde(skip)]
    pub registered: Option<std::sync::Arc<super::RegisteredOptimizer>>,
}

fn default_betas() -> [f64; 2] {
    [0.9, 0.999]
}
fn default_eps() -> f64 {
    1e-8
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SchedulerName {
    Onecycle,
    Cosine,
    Step,
    Constant,
    /// torch's `ReduceLROnPlateau`: the rate cut when the monitored metric stops improving.
    Plateau,
    /// A schedule a crate registered under its `_target_` (`registry::register_schedule!`); set by
    /// `schema::extract`.
    Registered,
}

/// `ReduceLROnPlateau`'s `threshold_mode`: a better value beats the best by a share of it, or by an amount.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ThresholdMode {
    #[default]
    Rel,
    Abs,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Interval {
    #[default]
    Step,
    Epoch,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SchedulerConfig {
    /// The schedule: `constant`, `onecycle` (OneCycleLR), `cosine` (with warm-up), `step` (StepLR),
    /// `plateau` (ReduceLROnPlateau); `registered` is set for you when the node names a registered
    /// `_target_`.
    pub name: SchedulerName,
    /// Step the schedule every optimizer step or every epoch.
    #[serde(default)]
    pub interval: Interval,
    /// onecycle: peak learning rate (PyTorch's OneCycleLR `max_lr`).
    #[serde(default)]
    pub max_lr: Option<f64>,
    /// onecycle: the share of steps spent rising to `max_lr`.
    #[serde(default)]
    pub pct_start: Option<f64>,
    /// onecycle: the starting rate is `max_lr / div_factor`.
    #[serde(default)]
    pub div_factor: Option<f64>,
    /// onecycle: the final rate is the starting rate `/ final_div_factor`.
    #[serde(default)]
    pub final_div_factor: Option<f64>,
    /// cosine: linear warm-up length and the floor.
    #[serde(default)]
    pub warmup_epochs: Option<f64>,
    /// cosine: the floor the rate decays to; plateau: the floor of the reductions.
    #[serde(default)]
    pub min_lr: Option<f64>,
    /// step: decay every `step_size` intervals by `gamma`.
    #[serde(default)]
    pub step_size: Option<usize>,
    /// step: the factor applied every `step_size` intervals.
    #[serde(default)]
    pub gamma: Option<f64>,
    /// plateau: torch's `ReduceLROnPlateau` arguments under its names (`min_lr` above is its floor;
    /// torch's defaults when unset), checked once per validation on `monitor` (`val/loss` unless set:
    /// Lightning's `monitor` of the scheduler dict).
    #[serde(default)]
    pub monitor: Option<String>,
    /// plateau: `min` when a smaller `monitor` is better, `max` when larger is.
    #[serde(default)]
    pub mode: Option<super::Mode>,
    /// plateau: the factor the rate is multiplied by at each reduction.
    #[serde(default)]
    pub factor: Option<f64>,
    /// plateau: checks without improvement before a reduction.
    #[serde(default)]
    pub patience: Option<u64>,
    /// plateau: the least change that counts as an improvement.
    #[serde(default)]
    pub threshold: Option<f64>,
    /// plateau: `rel` (a share of the best) or `abs` threshold.
    #[serde(default)]
    pub threshold_mode: Option<ThresholdMode>,
    /// plateau: checks to wait after a reduction before counting again.
    #[serde(default)]
    pub cooldown: Option<u64>,
    /// plateau: a reduction smaller than this is skipped.
    #[serde(default)]
    pub eps: Option<f64>,
    /// `registered`: the `_target_`, its arguments and the schedule (`schema::extract` fills it).
    #[serde(skip)]
    pub registered: Option<std::sync::Arc<super::RegisteredSchedule>>,
}
