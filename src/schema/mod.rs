//! The typed experiment: what training reads, extracted from the resolved config tree by figment and checked
//! strictly (unknown keys, wrong types, bad choices). Every error names the dotted key, the value, where it
//! was set (file:line or the override) and a fix.

mod callbacks;
mod data;
pub mod declared;
mod hparams;
mod logger;
mod metric_specs;
mod metrics;
mod model;
mod optim;
mod profiler;
pub mod reference;
mod registered;
mod target_names;
mod targets;
mod template;
mod trainer;
mod validate;

pub use callbacks::*;
pub use data::*;
pub use logger::*;
pub use metric_specs::{read_metrics, MetricSpec};
pub use metrics::{AccuracyNames, RunMetrics};
pub use model::*;
pub use optim::*;
pub use profiler::ProfilerConfig;
pub use registered::*;
pub use template::accuracy_names_of;
pub use trainer::*;
pub use validate::extract;

use serde::{Deserialize, Deserializer, Serialize};

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    /// The run's name (lightning-hydra-template's `task_name`): runs go in `logs/<task_name>/`.
    pub task_name: String,
    /// `seed: null` (Lightning's "do not seed") draws one, the same on every rank and for a run requeued
    /// into its own directory (`seed_drawn`; `trainer::fit` derives it from the run directory).
    pub seed: u64,
    /// The config's `seed` was null and `seed` was drawn for this run (`schema::extract`).
    #[serde(skip)]
    pub seed_drawn: bool,
    /// lightning-hydra-template's `train:`: fit the model; false: only test it (`test: true`), from
    /// `ckpt_path` when one is given.
    #[serde(default = "yes")]
    pub train: bool,
    /// lightning-hydra-template's `test:`: after fitting, one pass over the test split with the best
    /// checkpoint's weights (the final ones when ModelCheckpoint kept none), as Lightning's
    /// `trainer.test(ckpt_path="best")`; `test/*` metrics join the run's.
    #[serde(default)]
    pub test: bool,
    /// How classification's accuracies are named (`acc1_acc5`, or `acc` as the template's module).
    #[serde(default)]
    pub accuracy_names: AccuracyNames,
    /// lightning-hydra-template's `extras:` (what its `utils.extras` does before a run).
    #[serde(default, deserialize_with = "null_as_default")]
    pub extras: Extras,
    /// The engine that trains: `candle` (CPU, no system dependency) or `tch` (libtorch: CPU and CUDA; a
    /// build with `--features torch`).
    #[serde(default)]
    pub backend: Backend,
    /// Free-form tags of the run (the template's `tags`), recorded with it and given to the loggers.
    #[serde(default)]
    pub tags: Vec<String>,
    /// `last`, `best` or a checkpoint file to resume from.
    #[serde(default)]
    pub ckpt_path: Option<String>,
    /// The run metric a search optimises (`hydra/sweeper=optuna`), lightning-hydra-template's key:
    /// `val/acc1_best`, `val/loss`, ... (checked by the sweeper before its first trial).
    #[serde(default)]
    pub optimized_metric: Option<String>,
    /// The network: a zoo model by name, a declared layer list, a registered `_target_`, or a TorchScript
    /// module.
    pub model: ModelConfig,
    /// The dataset, its loader and its transforms (Lightning's DataModule).
    pub data: DataConfig,
    /// The optimizer (torch.optim's names and arguments).
    pub optimizer: OptimizerConfig,
    /// The learning-rate schedule (torch.optim.lr_scheduler's).
    pub scheduler: SchedulerConfig,
    /// Lightning's `Trainer` arguments: devices, strategy, precision, limits.
    pub trainer: TrainerConfig,
    /// `callbacks: null` (as the Lightning-Hydra template's debug configs write it) means none.
    #[serde(default, deserialize_with = "null_as_default")]
    pub callbacks: CallbacksConfig,
    /// Where metrics go besides the console.
    #[serde(default, deserialize_with = "null_as_default")]
    pub logger: LoggerConfig,
    /// The template's `paths`: where data, logs and this run's output are.
    pub paths: PathsConfig,
    /// `loss: {_target_: ...}`: what a training step computes, a registered loss with its metrics
    /// (`registry`); none: classification (cross-entropy, top-1/top-5). `schema::extract` fills it.
    #[serde(skip)]
    pub loss: Option<std::sync::Arc<LossSpec>>,
    /// `metrics: {name: {_target_: ...}}`: stateful metrics computed per epoch for train, val and test
    /// (`metric_specs`). `schema::extract` fills it.
    #[serde(skip)]
    pub metrics: Vec<MetricSpec>,
    /// `train predict` (Lightning's `trainer.predict`): one row per input of a split, written to a file.
    #[serde(default)]
    pub predict: Option<PredictConfig>,
}

/// `predict:` (what `train predict` sets): which split's inputs to predict and where the rows go.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PredictConfig {
    /// The split whose inputs are predicted: `test` (default), `val` or `train`.
    #[serde(default = "test_split")]
    pub split: PredictSplit,
    /// The file the rows go to: `.csv` or `.parquet`; a relative path is inside the run directory.
    #[serde(default = "predictions_csv")]
    pub output: String,
}

/// The split `train predict` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PredictSplit {
    Train,
    Val,
    Test,
}

impl PredictSplit {
    pub fn name(self) -> &'static str {
        match self {
            PredictSplit::Train => "train",
            PredictSplit::Val => "val",
            PredictSplit::Test => "test",
        }
    }
}

fn test_split() -> PredictSplit {
    PredictSplit::Test
}

fn predictions_csv() -> String {
    "predictions.csv".into()
}

/// lightning-hydra-template's `extras:`, done before the run by rank 0 (`launcher`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Extras {
    /// Hide the run's warnings (the template silences Python's `warnings`).
    #[serde(default)]
    pub ignore_warnings: bool,
    /// Refuse a run without `tags` (the template asks for them at a terminal; a run here is
    /// unattended), and write them to `tags.log` in the run directory.
    #[serde(default)]
    pub enforce_tags: bool,
    /// Print the resolved config before the run and keep it as `config_tree.log` in the run directory.
    #[serde(default)]
    pub print_config: bool,
}

fn yes() -> bool {
    true
}

fn null_as_default<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(
    d: D,
) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Pure Rust (Candle); the default build.
    #[default]
    Candle,
    /// libtorch through tch (cargo feature `torch`).
    Tch,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PathsConfig {
    /// The project's root directory.
    pub root_dir: String,
    /// Where datasets are (the default of `data.root`).
    pub data_dir: String,
    /// Where runs are written (`logs/`).
    pub log_dir: String,
    /// This run's directory (Hydra's `hydra.runtime.output_dir`).
    pub output_dir: String,
    /// lightning-hydra-template's `${hydra:runtime.cwd}`: where the run was launched from.
    #[serde(default)]
    pub work_dir: Option<String>,
}

/// `1` (serde's default for counters that start at one).
fn one_u64() -> u64 {
    1
}

#[cfg(test)]
mod tests;
