//! trainyard: declare a training experiment in YAML, compose it the way Hydra does, run it.
//!
//! The pipeline is one-way: `cli` → `config` (compose, interpolate, sweep) → `schema` (typed) → `records`.
pub mod app;
pub mod backend;
pub mod callbacks;
pub mod checkpoint;
pub mod cli;
pub mod comm;
pub mod config;
#[cfg(feature = "torch")]
pub mod cuda;
pub mod data;
pub mod export;
pub mod introspect;
pub mod json_nan;
pub mod launcher;
pub mod logbook;
pub mod loggers;
pub mod memory;
pub mod model;
pub mod optim;
pub mod plan;
pub mod project;
pub mod records;
pub mod registry;
/// The allocator `trainyard::main!()` installs.
pub use mimalloc;
pub mod rng;
pub mod s3;
pub mod schema;
pub mod search;
pub mod signals;
pub mod strategy;
pub mod tensor;
#[cfg(test)]
mod testing;
pub mod trainer;
