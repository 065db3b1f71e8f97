//! `logger:`: CSV, TensorBoard and the console.

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
}
