//! `trainer:`: strategy, devices, precision, limits and the distributed settings (Lightning's `Trainer`
//! arguments).

use crate::config::errors::did_you_mean;
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
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

impl schemars::JsonSchema for Devices {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Devices".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "How many devices (processes for ddp/fsdp, GPUs for dp) on each node, or `auto`.",
            "anyOf": [{"type": "integer", "minimum": 1}, {"const": "auto"}]
        })
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

impl schemars::JsonSchema for Precision {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Precision".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Lightning's precision names; 32, 16 and bf16 are aliases of 32-true, 16-mixed and bf16-mixed.",
            "enum": ["32-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true"]
        })
    }
}

/// `limit_train_batches: 10` (batches) or `0.25` (fraction of the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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

/// Lightning's `gradient_clip_algorithm`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ClipAlgorithm {
    #[default]
    Norm,
    Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum BatchScaleMode {
    Power,
    Binsearch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProcessGroupBackend {
    Gloo,
    Nccl,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DdpConfig {
    /// Gradients are all-reduced in buckets of this many MB, overlapping backward (DDP's `bucket_cap_mb`).
    #[serde(default = "default_bucket_mb")]
    pub bucket_cap_mb: f64,
    /// Allow parameters that get no gradient in a step (DDP's `find_unused_parameters`).
    #[serde(default)]
    pub find_unused_parameters: bool,
    /// Gradients are views into the buckets, saving a copy (DDP's `gradient_as_bucket_view`).
    #[serde(default)]
    pub gradient_as_bucket_view: bool,
}

fn default_bucket_mb() -> f64 {
    25.0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
pub enum ShardingStrategy {
    #[serde(rename = "FULL_SHARD")]
    FullShard,
    #[serde(rename = "SHARD_GRAD_OP")]
    ShardGradOp,
    #[serde(rename = "NO_SHARD")]
    NoShard,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StateDictType {
    Full,
    Sharded,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FsdpConfig {
    /// What is sharded over ranks: parameters, gradients and optimizer state (`FULL_SHARD`), gradients and
    /// optimizer state (`SHARD_GRAD_OP`), nothing (`NO_SHARD`).
    pub sharding_strategy: ShardingStrategy,
    /// Checkpoints gathered whole on rank 0 (`full`) or written as each rank's shard (`sharded`).
    pub state_dict_type: StateDictType,
    /// The size-based wrap policy: consecutive blocks are grouped into FSDP units of at least this many
    /// parameters (fewer, larger units: fewer collectives, more held whole at once). Unset: one unit
    /// per block.
    #[serde(default)]
    pub min_num_params: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrainerConfig {
    /// How devices share the work: one (`single`), DataParallel in one process (`dp`),
    /// DistributedDataParallel (`ddp`), fully sharded (`fsdp`).
    pub strategy: Strategy,
    /// The device kind: `cpu`, `gpu`/`cuda`, or `auto` (a GPU when there is one).
    pub accelerator: Accelerator,
    /// Devices on each node: processes for ddp/fsdp, GPUs for dp (Lightning's `devices`).
    pub devices: Devices,
    /// Machines the run spans; each runs `train` with the same config (MASTER_ADDR/NODE_RANK, torchrun or
    /// SLURM say where).
    #[serde(default = "one")]
    pub num_nodes: usize,
    /// Lightning's precision: `32-true`, `16-mixed` (with loss scaling), `bf16-mixed`, `bf16-true`,
    /// `16-true`.
    pub precision: Precision,
    /// Epochs to train (Lightning's `max_epochs`).
    pub max_epochs: u64,
    /// Lightning's `min_epochs`: EarlyStopping cannot stop the run before this many epochs.
    #[serde(default)]
    pub min_epochs: u64,
    /// Lightning's `detect_anomaly`: every step's gradient norm is measured, and a NaN or infinite one
    /// stops the run naming the step (the loss is always checked). Not under clipping by value (no norm is
    /// taken; only the loss is checked), and under `16-mixed` a non-finite step is the loss scaler's to skip.
    #[serde(default)]
    pub detect_anomaly: bool,
    /// Stop after this many optimizer steps; -1: no limit (Lightning's `max_steps`).
    #[serde(default = "minus_one")]
    pub max_steps: i64,
    /// Training batches per epoch: a count, or a share of the epoch (Lightning's `limit_train_batches`).
    #[serde(default)]
    pub limit_train_batches: Limit,
    /// Validation batches per check: a count or a share (Lightning's `limit_val_batches`).
    #[serde(default)]
    pub limit_val_batches: Limit,
    /// The test's batches (`test: true`), as Lightning's `limit_test_batches`.
    #[serde(default)]
    pub limit_test_batches: Limit,
    /// `train predict`'s batches, as Lightning's `limit_predict_batches`.
    #[serde(default)]
    pub limit_predict_batches: Limit,
    /// Validate within an epoch: after this many batches, or this share of the epoch (Lightning's
    /// `val_check_interval`).
    #[serde(default)]
    pub val_check_interval: Limit,
    /// Validate at the end of every this many epochs.
    #[serde(default = "super::one_u64")]
    pub check_val_every_n_epoch: u64,
    /// Run this many batches (true: 1) of training and validation, with no logger and no checkpoint, to
    /// check the setup.
    #[serde(default)]
    pub fast_dev_run: FastDevRun,
    /// Train and validate on the same few training batches (a count or a share), to check the model can
    /// learn.
    #[serde(default)]
    pub overfit_batches: Limit0,
    /// Clip gradients to this global norm (Lightning's `gradient_clip_val`); unset: no clipping.
    #[serde(default)]
    pub gradient_clip_val: Option<f64>,
    /// How `gradient_clip_val` clips: the global norm (Lightning's default) or each value.
    #[serde(default)]
    pub gradient_clip_algorithm: ClipAlgorithm,
    /// Batches whose gradients are summed before each optimizer step.
    #[serde(default = "super::one_u64")]
    pub accumulate_grad_batches: u64,
    /// libtorch's deterministic algorithms (`torch.use_deterministic_algorithms`): slower, and a run
    /// repeats exactly.
    #[serde(default)]
    pub deterministic: bool,
    /// BatchNorm statistics over every rank's batch (Lightning's `sync_batchnorm`).
    #[serde(default)]
    pub sync_batchnorm: bool,
    /// Let cuDNN time its algorithms for each shape and keep the fastest
    /// (`torch.backends.cudnn.benchmark`).
    #[serde(default)]
    pub cudnn_benchmark: bool,
    /// Lightning's `profiler`: `simple` times each action of the loop and reports it at the end.
    #[serde(default)]
    pub profiler: Option<super::ProfilerConfig>,
    /// Find the largest batch size that fits before training (`power` or `binsearch`), as the
    /// BatchSizeFinder callback does.
    #[serde(default)]
    pub auto_scale_batch_size: Option<BatchScaleMode>,
    /// A step row (training loss and accuracy of the window) every this many optimizer steps.
    #[serde(default = "fifty")]
    pub log_every_n_steps: u64,
    /// c10d's backend for ddp/fsdp: `nccl` (GPUs) or `gloo` (CPU); unset: chosen by the accelerator.
    #[serde(default)]
    pub process_group_backend: Option<ProcessGroupBackend>,
    /// How long the ranks wait for each other to form the process group.
    #[serde(default = "rendezvous_timeout")]
    pub rendezvous_timeout_s: u64,
    /// After SIGTERM or SIGUSR1: how long the run may take to finish its step and write the resume
    /// checkpoint before it exits anyway (a spot instance's notice leaves 30-120 s).
    #[serde(default = "preemption_grace")]
    pub preemption_grace_s: u64,
    /// torchrun's `--max-restarts`: when a worker (or a single run's training process) fails, stop the
    /// others and start them all again from the latest complete checkpoint, up to this many times.
    #[serde(default)]
    pub max_restarts: u32,
    /// How long a collective may wait for the other ranks before the run fails (a dead rank).
    #[serde(default = "collective_timeout")]
    pub collective_timeout_s: u64,
    /// DistributedDataParallel's settings (`strategy: ddp`).
    #[serde(default)]
    pub ddp: Option<DdpConfig>,
    /// FullyShardedDataParallel's settings (`strategy: fsdp`).
    #[serde(default)]
    pub fsdp: Option<FsdpConfig>,
    /// Dynamic loss scaling for `precision: 16-mixed` (torch.amp.GradScaler's settings and defaults).
    #[serde(default)]
    pub grad_scaler: GradScalerConfig,
}

/// `trainer.grad_scaler`: the loss is multiplied by `init_scale` before backward; a step whose gradients
/// hold inf/NaN is skipped and the scale multiplied by `backoff_factor`; after `growth_interval` clean
/// steps in a row it is multiplied by `growth_factor`. Used by `16-mixed` only.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GradScalerConfig {
    /// The first loss scale.
    pub init_scale: f64,
    /// The scale is multiplied by this after `growth_interval` clean steps.
    pub growth_factor: f64,
    /// The scale is multiplied by this when a step's gradients overflow.
    pub backoff_factor: f64,
    /// Clean steps in a row before the scale grows.
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
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
fn minus_one() -> i64 {
    -1
}
fn fifty() -> u64 {
    50
}
fn preemption_grace() -> u64 {
    25
}
fn rendezvous_timeout() -> u64 {
    300
}
fn collective_timeout() -> u64 {
    1800
}
