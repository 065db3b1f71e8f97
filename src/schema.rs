//! The typed experiment: what training reads, extracted from the resolved config tree by figment and checked
//! strictly (unknown keys, wrong types, bad choices). Every error names the dotted key, the value, where it
//! was set (file:line or the override) and a fix.

use crate::config::errors::{at, did_you_mean, ConfigError};
use crate::config::tree::Node;
use figment::error::Kind;
use figment::providers::Serialized;
use figment::Figment;
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    pub task_name: String,
    pub seed: u64,
    #[serde(default)]
    pub backend: Backend,
    #[serde(default)]
    pub tags: Vec<String>,
    /// `last`, `best` or a checkpoint file to resume from.
    #[serde(default)]
    pub ckpt_path: Option<String>,
    pub model: ModelConfig,
    pub data: DataConfig,
    pub optimizer: OptimizerConfig,
    pub scheduler: SchedulerConfig,
    pub trainer: TrainerConfig,
    /// `callbacks: null` (as the Lightning-Hydra template's debug configs write it) means none.
    #[serde(default, deserialize_with = "null_as_default")]
    pub callbacks: CallbacksConfig,
    #[serde(default, deserialize_with = "null_as_default")]
    pub logger: LoggerConfig,
    pub paths: PathsConfig,
}

fn null_as_default<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(
    d: D,
) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Pure Rust (Candle); the default build.
    #[default]
    Candle,
    /// libtorch through tch (cargo feature `torch`).
    Tch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelName {
    Mlp,
    Cnn,
    Resnet18,
    Resnet34,
    Resnet50,
    Resnet101,
    Resnet152,
    Vit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VitVariant {
    Tiny,
    Small,
    Base,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub name: ModelName,
    pub num_classes: usize,
    /// mlp: hidden layer widths.
    #[serde(default)]
    pub hidden: Option<Vec<usize>>,
    /// cnn: channels of each conv block.
    #[serde(default)]
    pub channels: Option<Vec<usize>>,
    #[serde(default)]
    pub dropout: f64,
    /// resnet: 3x3 stride-1 stem without max-pool, for 32x32 images.
    #[serde(default)]
    pub cifar_stem: bool,
    #[serde(default)]
    pub zero_init_residual: bool,
    /// vit: tiny | small | base.
    #[serde(default)]
    pub variant: Option<VitVariant>,
    /// vit: side of a square patch (16 or 32 for the published weights); must divide the image size.
    #[serde(default)]
    pub patch_size: Option<usize>,
    /// vit: input resolution (position embeddings are interpolated when loading other sizes).
    #[serde(default)]
    pub image_size: Option<usize>,
    /// A safetensors file with torchvision/timm parameter names.
    #[serde(default)]
    pub pretrained: Option<String>,
    /// Cross-entropy label smoothing in [0, 1), as `nn.CrossEntropyLoss(label_smoothing=...)`.
    #[serde(default)]
    pub label_smoothing: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DataName {
    Cifar10,
    Cifar100,
    Cinic10,
    Imagenet,
    Mnist,
    FashionMnist,
    Synthetic,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    pub name: DataName,
    #[serde(default)]
    pub root: Option<String>,
    #[serde(default)]
    pub download: bool,
    /// With `download`: a base URL that replaces the official one (same file names).
    #[serde(default)]
    pub mirror: Option<String>,
    /// With `download`: MD5 per file name, replacing the published checksum (for re-packed mirrors).
    #[serde(default)]
    pub checksums: std::collections::BTreeMap<String, String>,
    pub num_classes: usize,
    pub image_size: usize,
    #[serde(default = "three")]
    pub channels: usize,
    pub batch_size: usize,
    #[serde(default)]
    pub num_workers: usize,
    #[serde(default)]
    pub drop_last: bool,
    /// synthetic: number of generated training / validation images.
    #[serde(default)]
    pub train_size: Option<usize>,
    #[serde(default)]
    pub val_size: Option<usize>,
    #[serde(default)]
    pub train_transforms: Vec<Transform>,
    #[serde(default)]
    pub val_transforms: Vec<Transform>,
}

fn three() -> usize {
    3
}

/// One augmentation step, written as a one-key mapping: `- random_crop: {size: 32, padding: 4}`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Transform {
    RandomCrop {
        size: usize,
        #[serde(default)]
        padding: usize,
    },
    RandomResizedCrop {
        size: usize,
        #[serde(default = "default_scale")]
        scale: [f64; 2],
        #[serde(default = "default_ratio")]
        ratio: [f64; 2],
    },
    HorizontalFlip {
        #[serde(default = "half")]
        p: f64,
    },
    Resize {
        size: usize,
    },
    CenterCrop {
        size: usize,
    },
    Normalize {
        mean: Vec<f64>,
        std: Vec<f64>,
    },
}

fn default_scale() -> [f64; 2] {
    [0.08, 1.0]
}
fn default_ratio() -> [f64; 2] {
    [3.0 / 4.0, 4.0 / 3.0]
}
fn half() -> f64 {
    0.5
}

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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    Single,
    Dp,
    Ddp,
    Fsdp,
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Strategy::Single => "single",
            Strategy::Dp => "dp",
            Strategy::Ddp => "ddp",
            Strategy::Fsdp => "fsdp",
        };
        f.write_str(s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Accelerator {
    Cpu,
    Gpu,
    Cuda,
    Auto,
}

/// `devices: 2` or `devices: auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Devices {
    Count(usize),
    Auto,
}

impl<'de> Deserialize<'de> for Devices {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(usize),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(0) => Err(de::Error::custom("devices must be at least 1 (or 'auto')")),
            Raw::N(n) => Ok(Devices::Count(n)),
            Raw::S(s) if s == "auto" => Ok(Devices::Auto),
            Raw::S(s) => Err(de::Error::custom(format!(
                "devices must be a number or 'auto', got '{s}'"
            ))),
        }
    }
}

/// Lightning's precision names; `32`, `16` and `bf16` are accepted as aliases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Precision {
    #[serde(rename = "32-true")]
    Full,
    #[serde(rename = "16-mixed")]
    Mixed16,
    #[serde(rename = "bf16-mixed")]
    MixedBf16,
    #[serde(rename = "bf16-true")]
    TrueBf16,
    #[serde(rename = "16-true")]
    True16,
}

impl<'de> Deserialize<'de> for Precision {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(i64),
            S(String),
        }
        let text = match Raw::deserialize(d)? {
            Raw::N(n) => n.to_string(),
            Raw::S(s) => s,
        };
        match text.as_str() {
            "32" | "32-true" => Ok(Precision::Full),
            "16" | "16-mixed" => Ok(Precision::Mixed16),
            "bf16" | "bf16-mixed" => Ok(Precision::MixedBf16),
            "bf16-true" => Ok(Precision::TrueBf16),
            "16-true" => Ok(Precision::True16),
            other => {
                let names = ["32-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true"];
                let hint = did_you_mean(other, names)
                    .map(|s| format!(" (did you mean '{s}'?)"))
                    .unwrap_or_default();
                Err(de::Error::custom(format!(
                    "unknown precision '{other}'{hint}; expected one of {} (or the aliases 32, 16, bf16)",
                    names.join(", ")
                )))
            }
        }
    }
}

/// `limit_train_batches: 10` (batches) or `0.25` (fraction of the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Limit {
    Batches(u64),
    Fraction(f64),
}

impl Default for Limit {
    fn default() -> Self {
        Limit::Fraction(1.0)
    }
}

/// `fast_dev_run: true` (one batch) or a number of batches.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FastDevRun {
    Flag(bool),
    Batches(u64),
}

impl Default for FastDevRun {
    fn default() -> Self {
        FastDevRun::Flag(false)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BatchScaleMode {
    Power,
    Binsearch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcessGroupBackend {
    Gloo,
    Nccl,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DdpConfig {
    #[serde(default = "default_bucket_mb")]
    pub bucket_cap_mb: f64,
    #[serde(default)]
    pub find_unused_parameters: bool,
    #[serde(default)]
    pub gradient_as_bucket_view: bool,
}

fn default_bucket_mb() -> f64 {
    25.0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum ShardingStrategy {
    #[serde(rename = "FULL_SHARD")]
    FullShard,
    #[serde(rename = "SHARD_GRAD_OP")]
    ShardGradOp,
    #[serde(rename = "NO_SHARD")]
    NoShard,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StateDictType {
    Full,
    Sharded,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FsdpConfig {
    pub sharding_strategy: ShardingStrategy,
    pub state_dict_type: StateDictType,
    /// The size-based wrap policy: consecutive blocks are grouped into FSDP units of at least this many
    /// parameters (fewer, larger units: fewer collectives, more held whole at once). Unset: one unit
    /// per block.
    #[serde(default)]
    pub min_num_params: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TrainerConfig {
    pub strategy: Strategy,
    pub accelerator: Accelerator,
    pub devices: Devices,
    #[serde(default = "one")]
    pub num_nodes: usize,
    pub precision: Precision,
    pub max_epochs: u64,
    #[serde(default = "minus_one")]
    pub max_steps: i64,
    #[serde(default)]
    pub limit_train_batches: Limit,
    #[serde(default)]
    pub limit_val_batches: Limit,
    #[serde(default)]
    pub val_check_interval: Limit,
    #[serde(default = "one_u64")]
    pub check_val_every_n_epoch: u64,
    #[serde(default)]
    pub fast_dev_run: FastDevRun,
    #[serde(default)]
    pub overfit_batches: Limit0,
    #[serde(default)]
    pub gradient_clip_val: Option<f64>,
    #[serde(default = "one_u64")]
    pub accumulate_grad_batches: u64,
    #[serde(default)]
    pub deterministic: bool,
    #[serde(default)]
    pub sync_batchnorm: bool,
    #[serde(default)]
    pub cudnn_benchmark: bool,
    #[serde(default)]
    pub auto_scale_batch_size: Option<BatchScaleMode>,
    #[serde(default = "fifty")]
    pub log_every_n_steps: u64,
    #[serde(default)]
    pub process_group_backend: Option<ProcessGroupBackend>,
    #[serde(default = "rendezvous_timeout")]
    pub rendezvous_timeout_s: u64,
    #[serde(default = "collective_timeout")]
    pub collective_timeout_s: u64,
    #[serde(default)]
    pub ddp: Option<DdpConfig>,
    #[serde(default)]
    pub fsdp: Option<FsdpConfig>,
    /// Dynamic loss scaling for `precision: 16-mixed` (torch.amp.GradScaler's settings and defaults).
    #[serde(default)]
    pub grad_scaler: GradScalerConfig,
}

/// `trainer.grad_scaler`: the loss is multiplied by `init_scale` before backward; a step whose gradients
/// hold inf/NaN is skipped and the scale multiplied by `backoff_factor`; after `growth_interval` clean
/// steps in a row it is multiplied by `growth_factor`. Used by `16-mixed` only.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GradScalerConfig {
    pub init_scale: f64,
    pub growth_factor: f64,
    pub backoff_factor: f64,
    pub growth_interval: u64,
}

impl Default for GradScalerConfig {
    fn default() -> Self {
        GradScalerConfig {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

/// `overfit_batches: 0` (off), a batch count, or a fraction.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Limit0 {
    Batches(u64),
    Fraction(f64),
}

impl Default for Limit0 {
    fn default() -> Self {
        Limit0::Batches(0)
    }
}

fn one() -> usize {
    1
}
fn one_u64() -> u64 {
    1
}
fn minus_one() -> i64 {
    -1
}
fn fifty() -> u64 {
    50
}
fn rendezvous_timeout() -> u64 {
    300
}
fn collective_timeout() -> u64 {
    1800
}

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
    #[serde(default = "one_u64")]
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
    #[serde(default = "one_u64")]
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
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CsvLogger {
    #[serde(default = "hundred")]
    pub flush_every_n_steps: u64,
}

fn hundred() -> u64 {
    100
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TensorBoardLogger {
    /// Sub-directory of the run directory.
    #[serde(default = "tb_dir")]
    pub dir: String,
}

fn tb_dir() -> String {
    "tensorboard".into()
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleLogger {
    #[serde(default)]
    pub plain: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LoggerConfig {
    #[serde(default)]
    pub csv: Option<CsvLogger>,
    #[serde(default)]
    pub tensorboard: Option<TensorBoardLogger>,
    #[serde(default)]
    pub console: Option<ConsoleLogger>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PathsConfig {
    pub root_dir: String,
    pub data_dir: String,
    pub log_dir: String,
    pub output_dir: String,
}

/// Extract the typed experiment from a resolved config, or say exactly what is wrong and where.
///
/// The top-level `hydra` node (sweeper params, run directories) belongs to Hydra, not to the job, and is
/// ignored. `???` values still present are errors.
pub fn extract(config: &Node) -> Result<Experiment, ConfigError> {
    let mut job = config.clone();
    if let Some(map) = job.as_map_mut() {
        map.shift_remove("hydra");
    }
    check_no_missing(&job)?;
    let figment = Figment::from(Serialized::defaults(job.to_json()));
    let experiment: Experiment = figment.extract().map_err(|e| describe(&job, e))?;
    validate(&job, &experiment)?;
    Ok(experiment)
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

const RESNETS: &[&str] = &["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"];

/// Keys of `model` that only some models read: (key, the `model.name`s that use it).
const MODEL_ONLY: &[(&str, &[&str])] = &[
    ("hidden", &["mlp"]),
    ("channels", &["cnn"]),
    ("cifar_stem", RESNETS),
    ("zero_init_residual", RESNETS),
    ("variant", &["vit"]),
    ("patch_size", &["vit"]),
    ("image_size", &["vit"]),
];
const DATA_ONLY: &[(&str, &[&str])] =
    &[("train_size", &["synthetic"]), ("val_size", &["synthetic"])];
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
    ("min_lr", &["cosine"]),
    ("step_size", &["step"]),
    ("gamma", &["step"]),
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
    for (section, table) in [
        ("model", MODEL_ONLY),
        ("optimizer", OPTIMIZER_ONLY),
        ("scheduler", SCHEDULER_ONLY),
        ("data", DATA_ONLY),
    ] {
        check_applies(config, section, table)?;
    }
    if m.name == ModelName::Vit {
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
    if m.name == ModelName::Mlp && m.hidden.as_ref().is_none_or(|h| h.contains(&0)) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::yaml;
    use rstest::rstest;

    const GOOD: &str = "task_name: t
seed: 1
model:
  name: cnn
  num_classes: 10
  channels: [8, 16]
data:
  name: synthetic
  num_classes: 10
  image_size: 32
  batch_size: 64
  train_transforms:
    - random_crop: {size: 32, padding: 4}
    - horizontal_flip: {}
optimizer:
  name: sgd
  lr: 0.1
scheduler:
  name: onecycle
  max_lr: 0.1
trainer:
  strategy: single
  accelerator: cpu
  devices: 1
  precision: 32
  max_epochs: 2
  limit_train_batches: 10
  limit_val_batches: 0.5
callbacks:
  model_checkpoint:
    dirpath: out/ckpt
    monitor: val/acc1
    mode: max
logger:
  csv: {}
paths:
  root_dir: .
  data_dir: ./data
  log_dir: ./logs
  output_dir: ./out
";

    fn parse(text: &str) -> Node {
        yaml::parse(text, "exp.yaml").unwrap().unwrap()
    }

    #[test]
    fn a_good_experiment_extracts() {
        let e = extract(&parse(GOOD)).unwrap();
        assert_eq!(e.model.name, ModelName::Cnn);
        assert_eq!(e.trainer.precision, Precision::Full);
        assert_eq!(e.trainer.limit_train_batches, Limit::Batches(10));
        assert_eq!(e.trainer.limit_val_batches, Limit::Fraction(0.5));
        assert_eq!(
            e.data.train_transforms[1],
            Transform::HorizontalFlip { p: 0.5 }
        );
        assert_eq!(
            e.callbacks.model_checkpoint.unwrap().filename,
            "epoch_{epoch:03d}"
        );
        assert_eq!(e.trainer.devices, Devices::Count(1));
    }

    fn with(replace: &str, by: &str) -> String {
        assert!(GOOD.contains(replace), "{replace}");
        GOOD.replacen(replace, by, 1)
    }

    #[test]
    fn hydra_node_is_ignored_and_null_sections_mean_none() {
        let text = with("logger:\n  csv: {}\n", "logger: null\nhydra:\n  sweeper:\n    params:\n      seed: 1,2\n")
            .replace("callbacks:\n  model_checkpoint:\n    dirpath: out/ckpt\n    monitor: val/acc1\n    mode: max\n", "callbacks: null\n");
        let e = extract(&parse(&text)).unwrap();
        assert_eq!(e.logger, LoggerConfig::default());
        assert_eq!(e.callbacks, CallbacksConfig::default());
    }

    #[rstest]
    #[case(
        with("  max_epochs: 2", "  max_epoch: 2"),
        "Error in config key 'trainer.max_epoch': unknown key",
        "exp.yaml:26:14",
        "Did you mean 'trainer.max_epochs'?"
    )]
    #[case(
        with("  precision: 32", "  precision: 64"),
        "unknown precision '64'",
        "exp.yaml:25:14",
        "16-mixed"
    )]
    #[case(
        with("  name: sgd", "  name: sgdd"),
        "'sgdd' is not a valid choice",
        "exp.yaml:16:9",
        "Did you mean 'sgd'?"
    )]
    #[case(
        with("  batch_size: 64", "  batch_size: many"),
        "Error in config key 'data.batch_size' = many: expected",
        "exp.yaml:11:15",
        "string \"many\""
    )]
    #[case(
        with("  lr: 0.1\n", "  lr: ???\n"),
        "Missing mandatory value: optimizer.lr",
        "exp.yaml:17:7",
        "Set it with optimizer.lr=<value>"
    )]
    #[case(
        with("seed: 1\n", ""),
        "Error in config key 'seed': missing",
        "",
        "+seed=<value>"
    )]
    #[case(
        with("  channels: [8, 16]", "  channels: [8, 16]\n  patch_size: 16"),
        "Error in config key 'model.patch_size' = 16: model 'cnn' does not use this key (only vit do)",
        "exp.yaml:7:15",
        "Remove it"
    )]
    #[case(
        with("  num_classes: 10\n  channels", "  num_classes: 100\n  channels"),
        "the model predicts 100 classes but the data set has 10",
        "exp.yaml:5:16",
        "${data.num_classes}"
    )]
    #[case(
        with("  devices: 1", "  devices: 4"),
        "strategy single runs one process",
        "",
        "trainer=ddp"
    )]
    #[case(
        with("    - horizontal_flip: {}", "    - horizontal_flop: {}"),
        "'horizontal_flop' is not a valid choice",
        "exp.yaml:14:",
        "Did you mean 'horizontal_flip'?"
    )]
    #[case(
        with("  precision: 32", "  precision: bf16_mixed"),
        "unknown precision 'bf16_mixed' (did you mean 'bf16-mixed'?)",
        "exp.yaml:25:14",
        "32-true"
    )]
    #[case(
        with("  lr: 0.1\n", "  lr: 0.1\n  betas: [0.9, 0.99]\n"),
        "optimizer 'sgd' does not use this key (only adam, adamw do)",
        "exp.yaml:18:10",
        ""
    )]
    #[case(
        with("  lr: 0.1\n", "  lr: 0.1\n  nesterov: true\n"),
        "Nesterov momentum needs momentum > 0",
        "exp.yaml:18:13",
        "optimizer.momentum=0.9"
    )]
    #[case(
        with("  name: synthetic", "  name: synthetic\n  bogus: 1"),
        "Error in config key 'data.bogus': unknown key",
        "exp.yaml:9:10",
        "Known keys here: name, root"
    )]
    #[case(
        with("  devices: 1", "  devices: lots"),
        "devices must be a number or 'auto'",
        "",
        ""
    )]
    fn errors_name_key_place_and_fix(
        #[case] text: String,
        #[case] first: &str,
        #[case] place: &str,
        #[case] fix: &str,
    ) {
        let err = extract(&parse(&text)).unwrap_err().to_string();
        assert!(err.contains(first), "{err}");
        assert!(err.contains(place), "{err}");
        assert!(err.contains(fix), "{err}");
    }
}

/// The shipped `conf/` and `experiments/` trees, composed and resolved by the real config engine, extract.
#[cfg(test)]
mod shipped {
    use super::*;
    use crate::config::compose::{compose, RunMode};
    use crate::config::grammar::parse_override;
    use crate::config::interpolate::{resolve_all, ResolveContext};
    use crate::config::repository::{Repository, SearchRoot};
    use crate::config::yaml;
    use rstest::rstest;
    use std::path::{Path, PathBuf};

    fn project() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    /// Compose `train` under `root` (conf/ + experiments/ as the `experiment` group), resolve, extract.
    fn run_in(root: &Path, overrides: &[&str]) -> Result<Experiment, ConfigError> {
        let repo = Repository::new(vec![
            SearchRoot {
                dir: root.join("conf"),
                mount: String::new(),
                provider: "main".into(),
            },
            SearchRoot {
                dir: root.join("experiments"),
                mount: "experiment".into(),
                provider: "project".into(),
            },
        ]);
        let overrides: Vec<_> = overrides
            .iter()
            .map(|o| parse_override(o).unwrap_or_else(|e| panic!("{o}: {e}")))
            .collect();
        let composed = compose(&repo, "train", &overrides, RunMode::Run)?;
        let mut ctx = ResolveContext::from_process();
        ctx.env.remove("PROJECT_ROOT");
        ctx.hydra = yaml::parse("runtime:\n  output_dir: /tmp/run\n", "<test>").unwrap();
        extract(&resolve_all(&composed.config, &ctx)?)
    }

    fn run(overrides: &[&str]) -> Result<Experiment, ConfigError> {
        run_in(&project(), overrides)
    }

    fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                yaml_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                out.push(path);
            }
        }
    }

    #[test]
    fn every_shipped_yaml_file_parses_and_says_what_it_is_for() {
        let mut files = Vec::new();
        yaml_files(&project().join("conf"), &mut files);
        yaml_files(&project().join("experiments"), &mut files);
        assert!(files.len() >= 40, "{files:?}");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let shown = file.display().to_string();
            yaml::parse(&text, &shown).unwrap_or_else(|e| panic!("{shown}: {e}"));
            let comment = text
                .lines()
                .find(|l| !l.starts_with("# @package"))
                .unwrap_or_default();
            assert!(
                comment.starts_with("# ") && comment.len() > 8,
                "{shown}: no comment saying what it is for"
            );
        }
    }

    #[test]
    fn every_shipped_experiment_extracts() {
        let names: Vec<String> = std::fs::read_dir(project().join("experiments"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        assert!(names.len() >= 4, "{names:?}");
        for name in names {
            let e = run(&[&format!("experiment={name}")])
                .unwrap_or_else(|err| panic!("experiment={name}:\n{err}"));
            assert_ne!(
                e.task_name, "train",
                "experiment={name} should name its task"
            );
            assert!(!e.tags.is_empty(), "experiment={name} has no tags");
        }
    }

    #[rstest]
    #[case::plain(&[], |e: &Experiment| e.model.name == ModelName::Cnn && e.task_name == "train" && e.seed == 42)]
    #[case::cifar(&["experiment=cifar"], |e: &Experiment| e.model.name == ModelName::Vit
        && e.model.variant == Some(VitVariant::Base) && e.model.patch_size == Some(32)
        && e.model.image_size == Some(224) && e.data.name == DataName::Cifar10
        && e.trainer.strategy == Strategy::Ddp && e.trainer.precision == Precision::Mixed16
        && e.scheduler.name == SchedulerName::Onecycle && e.scheduler.max_lr == Some(0.03)
        && e.model.num_classes == 10 && e.logger.tensorboard.is_some())]
    #[case::imagenet(&["experiment=imagenet_resnet50"], |e: &Experiment| e.model.name == ModelName::Resnet50
        && e.model.num_classes == 1000 && e.trainer.precision == Precision::MixedBf16
        && e.scheduler.name == SchedulerName::Step && !e.optimizer.nesterov && e.trainer.max_epochs == 90)]
    #[case::cinic(&["experiment=cinic_resnet152"], |e: &Experiment| e.model.name == ModelName::Resnet152 && e.model.cifar_stem
        && e.data.name == DataName::Cinic10)]
    #[case::quickstart(&["experiment=quickstart"], |e: &Experiment| e.trainer.accelerator == Accelerator::Cpu
        && e.trainer.max_epochs == 2 && e.data.name == DataName::Synthetic
        && e.callbacks.early_stopping.is_none() && e.callbacks.model_checkpoint.as_ref()
            .is_some_and(|c| c.dirpath == "/tmp/run/checkpoints"))]
    #[case::mlp_mnist(&["model=mlp", "data=mnist"], |e: &Experiment| e.model.hidden == Some(vec![512, 256]) && e.data.channels == 1)]
    #[case::resnet18_cifar(&["model=resnet18", "data=cifar10"], |e: &Experiment| e.model.name == ModelName::Resnet18)]
    #[case::vit_synthetic(&["model=vit_b32"], |e: &Experiment| e.model.image_size == Some(32))]
    #[case::adam_cosine(&["optimizer=adam", "scheduler=cosine"], |e: &Experiment| e.optimizer.name == OptimizerName::Adam
        && e.scheduler.warmup_epochs == Some(1.0))]
    #[case::adamw_constant(&["optimizer=adamw", "scheduler=constant"], |e: &Experiment| e.optimizer.weight_decay == 0.05)]
    #[case::single(&["trainer=single"], |e: &Experiment| e.trainer.strategy == Strategy::Single && e.trainer.max_steps == -1)]
    #[case::dp(&["trainer=dp"], |e: &Experiment| e.trainer.strategy == Strategy::Dp && e.trainer.devices == Devices::Count(2))]
    #[case::ddp(&["trainer=ddp"], |e: &Experiment| e.trainer.devices == Devices::Auto
        && e.trainer.ddp.as_ref().is_some_and(|d| d.bucket_cap_mb == 25.0))]
    #[case::ddp_sim(&["trainer=ddp_sim"], |e: &Experiment| e.trainer.accelerator == Accelerator::Cpu
        && e.trainer.devices == Devices::Count(2) && e.trainer.process_group_backend == Some(ProcessGroupBackend::Gloo))]
    #[case::fsdp(&["trainer=fsdp"], |e: &Experiment| e.trainer.fsdp.as_ref().is_some_and(|f| f.sharding_strategy == ShardingStrategy::FullShard))]
    #[case::no_callbacks(&["callbacks=none", "logger=many"], |e: &Experiment| e.callbacks == CallbacksConfig::default()
        && e.logger.csv.is_some() && e.logger.tensorboard.is_some() && e.logger.console.is_some())]
    #[case::fdr(&["experiment=cifar", "debug=fdr"], |e: &Experiment| e.trainer.fast_dev_run == FastDevRun::Flag(true)
        && e.callbacks == CallbacksConfig::default() && e.logger == LoggerConfig::default())]
    #[case::limit_caps_an_experiment(&["experiment=imagenet_resnet50", "debug=limit"], |e: &Experiment| e.trainer.max_epochs == 3
        && e.trainer.limit_train_batches == Limit::Batches(5))]
    #[case::overfit(&["debug=overfit"], |e: &Experiment| e.trainer.overfit_batches == Limit0::Batches(3)
        && e.callbacks.early_stopping.is_none())]
    #[case::sweep_lr(&["sweep=lr"], |e: &Experiment| e.task_name == "sweep_lr")]
    #[case::sweep_bs(&["sweep=batch_size", "experiment=quickstart"], |e: &Experiment| e.task_name == "sweep_batch_size")]
    #[case::precision_alias(&["trainer.precision=bf16"], |e: &Experiment| e.trainer.precision == Precision::MixedBf16)]
    #[case::precision_int(&["trainer.precision=16"], |e: &Experiment| e.trainer.precision == Precision::Mixed16)]
    #[case::fast_dev_run_n(&["trainer.fast_dev_run=3", "trainer.limit_val_batches=0.25"], |e: &Experiment|
        e.trainer.fast_dev_run == FastDevRun::Batches(3) && e.trainer.limit_val_batches == Limit::Fraction(0.25))]
    fn shipped_configs_extract(#[case] overrides: &[&str], #[case] check: fn(&Experiment) -> bool) {
        let e = run(overrides).unwrap_or_else(|err| panic!("{overrides:?}:\n{err}"));
        assert!(check(&e), "{overrides:?}: {e:#?}");
    }

    #[rstest]
    #[case::unknown_key(&["+trainer.precison=bf16-mixed"],
        "Error in config key 'trainer.precison': unknown key\n    (set at override '+trainer.precison=bf16-mixed')\n    Did you mean 'trainer.precision'?")]
    #[case::bad_choice(&["trainer.strategy=sngle"],
        "Error in config key 'trainer.strategy': 'sngle' is not a valid choice\n    (set at override 'trainer.strategy=sngle')\n    Did you mean 'single'?\n    Valid choices: single, dp, ddp, fsdp")]
    #[case::wrong_type(&["data.batch_size=many"],
        "Error in config key 'data.batch_size' = many: expected")]
    #[case::wrong_type_place(&["data.batch_size=many"], "(set at override 'data.batch_size=many')")]
    #[case::missing_value(&["model.num_classes=???"],
        "Missing mandatory value: model.num_classes\n    (set at override 'model.num_classes=???')\n    Set it with model.num_classes=<value>")]
    #[case::missing_key(&["~seed"], "Error in config key 'seed': missing")]
    #[case::missing_key_fix(&["~seed"], "+seed=<value>")]
    #[case::wrong_for_model(&["model=resnet50", "+model.hidden=[64]"],
        "Error in config key 'model.hidden' = [64]: model 'resnet50' does not use this key (only mlp do)")]
    #[case::bad_transform(&["data.train_transforms=[{flip: {p: 0.5}}]"], "Valid choices: random_crop")]
    #[case::class_mismatch(&["model.num_classes=100"], "the model predicts 100 classes but the data set has 10")]
    fn shipped_config_errors(#[case] overrides: &[&str], #[case] expected: &str) {
        let err = run(overrides).unwrap_err().to_string();
        assert!(
            err.contains(expected),
            "{overrides:?}:\n{err}\n--- expected to contain:\n{expected}"
        );
    }

    /// Errors in files point at the file, line and column (here: a copy of the shipped tree, edited).
    #[rstest]
    #[case::unknown_key(
        "conf/trainer/default.yaml",
        "precision: 32-true",
        "precison: 32-true",
        "Error in config key 'trainer.precison': unknown key",
        "conf/trainer/default.yaml:6:11",
        "Did you mean 'trainer.precision'?"
    )]
    #[case::missing(
        "conf/model/cnn.yaml",
        "channels: [32, 64, 128]",
        "channels: ???",
        "Missing mandatory value: model.channels",
        "conf/model/cnn.yaml:4:11",
        "Set it with model.channels=<value>"
    )]
    #[case::wrong_type(
        "conf/data/synthetic.yaml",
        "batch_size: 64",
        "batch_size: [64]",
        "Error in config key 'data.batch_size' = [64]: expected",
        "conf/data/synthetic.yaml:6:13",
        "found sequence"
    )]
    #[case::bad_choice(
        "conf/optimizer/sgd.yaml",
        "name: sgd",
        "name: SGD",
        "'SGD' is not a valid choice",
        "conf/optimizer/sgd.yaml:2:7",
        "Valid choices: sgd, adam, adamw"
    )]
    fn file_errors_point_at_the_line(
        #[case] file: &str,
        #[case] from: &str,
        #[case] to: &str,
        #[case] first: &str,
        #[case] place: &str,
        #[case] fix: &str,
    ) {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["conf", "experiments"] {
            copy_tree(&project().join(sub), &dir.path().join(sub));
        }
        let target = dir.path().join(file);
        let text = std::fs::read_to_string(&target).unwrap();
        assert!(text.contains(from), "{file} has no '{from}'");
        std::fs::write(&target, text.replacen(from, to, 1)).unwrap();
        let err = run_in(dir.path(), &[]).unwrap_err().to_string();
        assert!(err.contains(first), "{err}");
        assert!(
            err.contains(&format!("{place})")),
            "{err}\n--- expected place {place}"
        );
        assert!(err.contains(fix), "{err}");
    }

    fn copy_tree(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let path = entry.unwrap().path();
            let dest = to.join(path.file_name().unwrap());
            if path.is_dir() {
                copy_tree(&path, &dest);
            } else {
                std::fs::copy(&path, &dest).unwrap();
            }
        }
    }
}
