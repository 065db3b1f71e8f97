//! `logger:`: CSV, TensorBoard, Weights & Biases, MLflow and the console.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CsvLogger {
    /// Write buffered rows to `metrics.csv` every this many steps (Lightning's `flush_logs_every_n_steps`);
    /// every epoch row is written at once.
    #[serde(default = "hundred")]
    pub flush_every_n_steps: u64,
}

fn hundred() -> u64 {
    100
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TensorBoardLogger {
    /// Sub-directory of the run directory.
    #[serde(default = "tb_dir")]
    pub dir: String,
}

fn tb_dir() -> String {
    "tensorboard".into()
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsoleLogger {
    /// Plain lines instead of a progress bar (also when the output is not a terminal).
    #[serde(default)]
    pub plain: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoggerConfig {
    /// Lightning's `CSVLogger`: `metrics.csv` in the run directory.
    #[serde(default)]
    pub csv: Option<CsvLogger>,
    /// Lightning's `TensorBoardLogger`: event files TensorBoard reads.
    #[serde(default)]
    pub tensorboard: Option<TensorBoardLogger>,
    /// The console's progress and epoch lines.
    #[serde(default)]
    pub console: Option<ConsoleLogger>,
    /// Lightning's `WandbLogger`: a Weights & Biases run, written offline and synced.
    #[serde(default)]
    pub wandb: Option<WandbLogger>,
    /// Lightning's `MLFlowLogger`: a run on an MLflow tracking server.
    #[serde(default)]
    pub mlflow: Option<MlflowLogger>,
    /// Loggers a crate registered (`register_logger!`), as `logger.<name>` names them.
    #[serde(skip)]
    pub registered: Vec<super::registered::RegisteredSpec>,
}

/// Lightning's `MLFlowLogger` keys, on an MLflow tracking server (HTTP).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MlflowLogger {
    /// The MLflow experiment the run goes in (created when missing).
    #[serde(default = "lightning_logs")]
    pub experiment_name: String,
    /// Default: the task name (and the job's number in a sweep).
    #[serde(default)]
    pub run_name: Option<String>,
    /// `http(s)://host:port`; default: the `MLFLOW_TRACKING_URI` environment variable.
    #[serde(default)]
    pub tracking_uri: Option<String>,
    /// Tags set on the MLflow run.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub tags: indexmap::IndexMap<String, serde_json::Value>,
    /// `true`/`all`: the best checkpoint (or every one) and summary.json become artifacts of the run.
    #[serde(default)]
    pub log_model: LogModel,
}

fn lightning_logs() -> String {
    "lightning_logs".into()
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<indexmap::IndexMap<String, serde_json::Value>, D::Error> {
    Ok(Option::deserialize(d)?.unwrap_or_default())
}

/// Lightning's `WandbLogger` keys. The run is written offline in `<run dir>/<save_dir>/wandb/`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WandbLogger {
    /// The W&B project.
    #[serde(default = "wandb_project")]
    pub project: String,
    /// The run's display name (default: the task name).
    #[serde(default)]
    pub name: Option<String>,
    /// Relative to the run directory (Lightning's default `.`).
    #[serde(default = "dot")]
    pub save_dir: String,
    /// `false` (Lightning's default): upload with `wandb sync` at the end when `WANDB_API_KEY` is set.
    #[serde(default)]
    pub offline: bool,
    /// The W&B run id (unset: a new one).
    #[serde(default)]
    pub id: Option<String>,
    /// Tags of the W&B run.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Default: the sweep's name for a sweep's job.
    #[serde(default)]
    pub group: Option<String>,
    /// W&B's `job_type` of the run.
    #[serde(default)]
    pub job_type: Option<String>,
    /// The W&B user or team the run belongs to.
    #[serde(default)]
    pub entity: Option<String>,
    /// W&B's notes of the run.
    #[serde(default)]
    pub notes: Option<String>,
    /// `true`/`all`: the best checkpoint becomes a file of the run (uploaded by `wandb sync`).
    #[serde(default)]
    pub log_model: LogModel,
}

fn wandb_project() -> String {
    "lightning_logs".into()
}

fn dot() -> String {
    ".".into()
}

/// `log_model`: `false`, `true` or `all` (Lightning's values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub enum LogModel {
    #[default]
    No,
    Best,
    All,
}

impl<'de> Deserialize<'de> for LogModel {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Flag(bool),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Flag(false) => Ok(LogModel::No),
            Raw::Flag(true) => Ok(LogModel::Best),
            Raw::Text(t) if t == "all" => Ok(LogModel::All),
            Raw::Text(t) => Err(serde::de::Error::custom(format!(
                "log_model must be false, true or 'all', got '{t}'"
            ))),
        }
    }
}

impl schemars::JsonSchema for LogModel {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "LogModel".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Lightning's log_model: false, true (the best checkpoint) or all (every one).",
            "anyOf": [{"type": "boolean"}, {"const": "all"}]
        })
    }
}
