//! The machine under the run: CUDA devices and their statistics, heap and resident-memory accounting, seeded
//! randomness, and the signals that stop a run from outside.

#[cfg(feature = "torch")]
pub mod cuda;
pub mod memory;
pub mod rng;
pub mod signals;
