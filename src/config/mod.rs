//! The config engine: Hydra 1.3 composition semantics with provenance on every value.
//! Knows nothing of machine learning; it could be its own crate.
pub mod grammar;
pub mod tree;
pub mod yaml;
