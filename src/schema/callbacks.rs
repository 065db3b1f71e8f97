//! `callbacks:`: ModelCheckpoint, EarlyStopping, LearningRateMonitor, DeviceStatsMonitor, Timer,
//! BatchSizeFinder, ModelSummary.

use super::{BatchScaleMode, Interval};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Min,
    Max,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelCheckpoint {
    /// A directory or `s3://bucket/prefix`.
    pub dirpath: String,
    /// The checkpoint file's name, Lightning's template: `{epoch:03d}`, `{step}`, `{val/acc1:.3f}`
    /// (`.safetensors` is added).
    #[serde(default = "default_ckpt_name")]
    pub filename: String,
    /// The metric that ranks checkpoints (`val/acc1`, `val/loss`, ...); unset: the latest are kept.
    #[serde(default)]
    pub monitor: Option<String>,
    /// `max` when a larger `monitor` is better, `min` when smaller is.
    #[serde(default = "min_mode")]
    pub mode: Mode,
    /// How many of the best checkpoints are kept; -1 keeps every one, 0 none (Lightning's).
    #[serde(default = "one_i64")]
    pub save_top_k: i64,
    /// Also write `last.safetensors` at every save (what `ckpt_path=last` resumes from).
    #[serde(default)]
    pub save_last: bool,
    /// Save after every this many training epochs.
    #[serde(default = "super::one_u64")]
    pub every_n_epochs: u64,
}

fn default_ckpt_name() -> String {
    "epoch_{epoch:03d}".into()
}
fn min_mode() -> Mode {
    Mode::Min
}
fn one_i64() -> i64 {
    1
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EarlyStopping {
    /// The metric watched (`val/loss`, `val/acc1`, or a registered loss's metric).
    pub monitor: String,
    /// `min` when a smaller `monitor` is better, `max` when larger is.
    #[serde(default = "min_mode")]
    pub mode: Mode,
    /// Validation checks without an improvement before the run stops.
    #[serde(default = "three_u64")]
    pub patience: u64,
    /// The least change of `monitor` that counts as an improvement.
    #[serde(default)]
    pub min_delta: f64,
}

fn three_u64() -> u64 {
    3
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LrMonitor {
    /// Log the learning rate at every optimizer `step` (also on epoch rows) or only per `epoch`.
    #[serde(default)]
    pub logging_interval: Interval,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceStats {
    /// Sampling period of the stats thread.
    #[serde(default = "default_sample_ms")]
    pub sample_every_ms: u64,
}

fn default_sample_ms() -> u64 {
    500
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Timer {
    /// `DD:HH:MM:SS`.
    pub max_time: String,
    /// Check after every optimizer step (Lightning's default) or only at epoch ends.
    #[serde(default)]
    pub interval: Interval,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchSizeFinder {
    /// `power` doubles the batch size until a step fails; `binsearch` then narrows between the last that
    /// fit and the first that did not.
    #[serde(default = "power_mode")]
    pub mode: BatchScaleMode,
    /// The first batch size tried.
    #[serde(default = "two")]
    pub init_val: usize,
    /// Training steps run at each size tried.
    #[serde(default = "three_u64")]
    pub steps_per_trial: u64,
    /// The most sizes tried.
    #[serde(default = "twenty_five")]
    pub max_trials: u64,
    /// The largest batch size tried; unset: no limit.
    #[serde(default)]
    pub max_val: Option<usize>,
    /// The share taken off the largest size that fit, kept as headroom (Lightning's `margin`).
    #[serde(default = "default_margin")]
    pub margin: f64,
    /// CPU only: a memory budget in bytes standing in for device memory.
    #[serde(default)]
    pub max_memory: Option<u64>,
    /// Train with the batch size found (Lightning's behaviour); `false` only measures and records it.
    #[serde(default = "yes")]
    pub fit_after: bool,
}

fn yes() -> bool {
    true
}

fn power_mode() -> BatchScaleMode {
    BatchScaleMode::Power
}
fn two() -> usize {
    2
}
fn twenty_five() -> u64 {
    25
}
fn default_margin() -> f64 {
    0.05
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelSummary {
    /// Module depth of the summary printed before training.
    #[serde(default = "super::one_u64")]
    pub max_depth: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CallbacksConfig {
    /// Lightning's `ModelCheckpoint`: when checkpoints are written, which are kept, where (a directory or
    /// `s3://`).
    #[serde(default)]
    pub model_checkpoint: Option<ModelCheckpoint>,
    /// Lightning's `EarlyStopping`: stop when `monitor` stops improving.
    #[serde(default)]
    pub early_stopping: Option<EarlyStopping>,
    /// Lightning's `LearningRateMonitor`: the learning rate as the `lr` column.
    #[serde(default)]
    pub lr_monitor: Option<LrMonitor>,
    /// Lightning's `DeviceStatsMonitor`: GPU memory and utilisation, host memory, on epoch rows.
    #[serde(default)]
    pub device_stats: Option<DeviceStats>,
    /// Lightning's `Timer`: stop after `max_time` of training.
    #[serde(default)]
    pub timer: Option<Timer>,
    /// Lightning's `BatchSizeFinder`: the largest batch size that fits, found before training.
    #[serde(default)]
    pub batch_size_finder: Option<BatchSizeFinder>,
    /// Lightning's `ModelSummary`: the module table and parameter counts before training.
    #[serde(default)]
    pub model_summary: Option<ModelSummary>,
    /// Callbacks a crate registered (`register_callback!`), as `callbacks.<name>` names them.
    #[serde(skip)]
    pub registered: Vec<super::registered::RegisteredSpec>,
}
