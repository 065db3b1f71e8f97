//! The config engine: Hydra 1.3 composition semantics with provenance on every value.
//! Knows nothing of machine learning; it could be its own crate.
pub mod compose;
pub mod conf_files;
pub mod default_entry;
pub mod defaults;
pub mod errors;
pub mod fuzz_targets;
pub mod grammar;
pub mod hydra;
pub mod interpolate;
pub mod repository;
pub mod sweep;
pub mod tree;
pub mod yaml;
