//! What a run leaves on disk and where: its records (`.hydra/`, `run.json`, `sweep.json`, written
//! atomically), its checkpoints (safetensors with the training state and a checksum), and the S3 store they
//! are uploaded to and resumed from.

pub mod checkpoint;
pub mod predictions;
pub mod records;
pub mod s3;
