//! trainyard: declare a training experiment in YAML, compose it the way Hydra does, run it.
//!
//! The pipeline is one-way (`docs/src/source-map.md`; `tests/layers.rs` checks it):
//!
//! ```text
//! cli ─► app ─► introspect (--cfg, --info)
//!         └──► sweep (Sweeper) ─► launch (Launcher) ─► job (one job, node launcher) ─► trainer (the fit loop) ─► strategy ─► backend ─► model, optim ─► tensor
//!                  │                                                                       │                              └──► comm (c10d) ─► tensor
//!                  └──► config (compose, interpolate, sweep) ─► schema (typed) ─► plan (decided once)
//! storage (records, checkpoints, S3) and platform (CUDA, memory, rng, signals) serve every layer.
//! ```
pub mod app;
pub mod backend;
pub mod callbacks;
pub mod cli;
pub mod comm;
pub mod config;
pub mod data;
pub mod export;
pub mod introspect;
pub mod job;
pub mod json_nan;
pub mod launch;
pub mod logbook;
pub mod loggers;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod pack;
pub mod plan;
pub mod platform;
pub mod project;
pub mod registry;
/// The allocator `trainyard::main!()` installs.
pub use mimalloc;
pub mod schema;
pub mod search;
pub mod storage;
pub mod strategy;
pub mod sweep;
pub mod tensor;
#[cfg(test)]
mod testing;
pub mod trainer;
