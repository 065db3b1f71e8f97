//! `logger:`: CSV, TensorBoard, Weights & Biases, MLflow and the console.

use serde::{Deserialize, Serialize};

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
    #[serde(default)]
    pub wandb: Option<WandbLogger>,
    #[serde(default)]
    pub mlflow: Option<MlflowLogger>,
    /// Loggers a crate registered (`register_logger!`), as `logger.<name>` names them.
    #[serde(skip)]
    pub registered: Vec<super::registered::RegisteredSpec>,
}

/// Lightning's `MLFlowLogger` keys, on an MLflow tracking server (HTTP).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MlflowLogger {
    #[serde(default = "lightning_logs")]
    pub experiment_name: String,
    /// Default: the task name (and the job's number in a sweep).
    #[serde(default)]
    pub run_name: Option<String>,
    /// `http(s)://host:port`; default: the `MLFLOW_TRACKING_URI` environment variable.
    #[serde(default)]
    pub tracking_uri: Option<String>,
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
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WandbLogger {
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
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    /// Default: the sweep's name for a sweep's job.
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub job_type: Option<String>,
    #[serde(default)]
    pub entity: Option<String>,
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
