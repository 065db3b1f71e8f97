//! How replicas, gradients, parameters and optimizer state are placed and kept in step. The trainer loop
//! is the same for every strategy; it asks the strategy for the engine this process trains (`engine`), to
//! make gradients global before each optimizer step, and to make statistics global before they are logged.

pub mod ddp;
pub mod dp;
pub mod scatter;

use crate::backend::{self, Engine};
use crate::schema::{Experiment, Strategy};

/// The engine this process trains: the model on this process's device, or, under `trainer.strategy=dp`,
/// a DataParallel group of replicas that the loop drives as one engine.
pub fn engine(exp: &Experiment) -> anyhow::Result<Box<dyn Engine>> {
    match exp.trainer.strategy {
        Strategy::Dp => Ok(Box::new(dp::DataParallelEngine::build(exp)?)),
        _ => backend::build(exp),
    }
}
