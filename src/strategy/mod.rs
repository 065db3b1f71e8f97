//! How replicas, gradients, parameters and optimizer state are placed and kept in step. The trainer loop
//! is the same for every strategy: it asks the strategy for the engine this process trains (`engine`:
//! the model itself, or DataParallel's replicas driven as one), the engine does the placing (`ddp`:
//! gradients averaged in buckets before each step; `fsdp`: `ShardedEngine` wraps the model's engine and
//! owns the shards), and the loop makes statistics global before they are logged.

pub mod ddp;
pub mod dp;
pub mod fsdp;
pub mod scatter;
pub mod sync_batchnorm;

use crate::backend::{self, Engine};
use crate::schema::{Experiment, Strategy};

/// The engine this process trains: the model on this process's device, or, under `trainer.strategy=dp`,
/// a DataParallel group of replicas that the loop drives as one engine. (FSDP wraps this engine once the
/// process group exists: `fsdp::ShardedEngine`.)
pub fn engine(exp: &Experiment) -> anyhow::Result<Box<dyn Engine>> {
    match exp.trainer.strategy {
        Strategy::Dp => Ok(Box::new(dp::DataParallelEngine::build(exp)?)),
        _ => backend::build(exp),
    }
}
