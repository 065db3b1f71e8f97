//! Where metrics go: `metrics.csv` now; TensorBoard and the console bar plug in beside it.

pub mod csv;
pub mod tensorboard;
