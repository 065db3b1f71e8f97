//! Where metrics go, behind one trait: `metrics.csv` (`csv`), TensorBoard event files (`tensorboard`), a
//! Weights & Biases offline run (`wandb`), an MLflow tracking server (`mlflow`) and the console's lines
//! (`console`). The training loop hands every row to each sink it was given; a sink
//! keeps what it records. A new logger is one more `MetricSink` (the trait is the registry's, where a
//! user's crate registers its own with `register_logger!`); `builtin` opens trainyard's own from one table.

pub mod console;
pub mod csv;
pub mod mlflow;
pub mod tensorboard;
pub mod wandb;

pub use crate::registry::{MetricSink, Row, RowKind, RunEnd};
