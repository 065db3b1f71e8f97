//! Hyperparameter search, the engine under `hydra/sweeper=optuna`: search spaces ([`Distribution`]),
//! samplers (TPE as Optuna's `TPESampler`, random, grid), a study of trials kept in an append-only journal
//! file (so a search resumes after a crash), and the median pruner. Pure: it knows nothing of configs,
//! launchers or training; the sweeper drives it and the trainer reports to it through a seam.

pub mod distribution;
pub mod journal;
pub mod parzen;
pub mod pruner;
pub mod samplers;
pub mod study;
pub mod tpe;
pub mod truncnorm;

pub use distribution::{Choice, Distribution};
pub use pruner::MedianPruner;
pub use samplers::Sampler;
pub use study::{Direction, Study, Trial, TrialState};
