//! `callbacks:`: ModelCheckpoint, EarlyStopping, LearningRateMonitor, DeviceStatsMonitor, Timer,
//! BatchSizeFinder, ModelSummary.

use super::{BatchScaleMode, Interval};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Min,
    Max,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelCheckpoint {
    /// A directory or `s3://bucket/prefix`.
    pub dirpath: String,
    #[serde(default = "default_ckpt_name")]
    pub filename: String,
    #[serde(default)]
    pub monitor: Option<String>,
    #[serde(default = "min_mode")]
    pub mode: Mode,
    #[serde(default = "one_i64")]
    pub save_top_k: i64,
    #[serde(default)]
    pub save_last: bool,
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

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EarlyStopping {
    pub monitor: String,
    #[serde(default = "min_mode")]
    pub mode: Mode,
    #[serde(default = "three_u64")]
    pub patience: u64,
    #[serde(default)]
    pub min_delta: f64,
}

fn three_u64() -> u64 {
    3
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LrMonitor {
    #[serde(default)]
    pub logging_interval: Interval,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceStats {
    /// Sampling period of the stats thread.
    #[serde(default = "default_sample_ms")]
    pub sample_every_ms: u64,
}

fn default_sample_ms() -> u64 {
    500
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Timer {
    /// `DD:HH:MM:SS`.
    pub max_time: String,
    /// Check after every optimizer step (Lightning's default) or only at epoch ends.
    #[serde(default)]
    pub interval: Interval,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSizeFinder {
    #[serde(default = "power_mode")]
    pub mode: BatchScaleMode,
    #[serde(default = "two")]
    pub init_val: usize,
    #[serde(default = "three_u64")]
    pub steps_per_trial: u64,
    #[serde(default = "twenty_five")]
    pub max_trials: u64,
    #[serde(default)]
    pub max_val: Option<usize>,
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

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSummary {
    #[serde(default = "super::one_u64")]
    pub max_depth: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CallbacksConfig {
    #[serde(default)]
    pub model_checkpoint: Option<ModelCheckpoint>,
    #[serde(default)]
    pub early_stopping: Option<EarlyStopping>,
    #[serde(default)]
    pub lr_monitor: Option<LrMonitor>,
    #[serde(default)]
    pub device_stats: Option<DeviceStats>,
    #[serde(default)]
    pub timer: Option<Timer>,
    #[serde(default)]
    pub batch_size_finder: Option<BatchSizeFinder>,
    #[serde(default)]
    pub model_summary: Option<ModelSummary>,
    /// Callbacks a crate registered (`register_callback!`), as `callbacks.<name>` names them.
    #[serde(skip)]
    pub registered: Vec<super::registered::RegisteredSpec>,
}
