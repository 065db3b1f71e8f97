//! How replicas, gradients, parameters and optimizer state are placed and kept in step. The trainer loop
//! is the same for every strategy: the engine does the placing (`ddp`: gradients averaged in buckets
//! before each step; `fsdp`: `ShardedEngine` wraps the model's engine and owns the shards), and the loop
//! makes statistics global before they are logged.

pub mod ddp;
pub mod fsdp;
pub mod sync_batchnorm;
