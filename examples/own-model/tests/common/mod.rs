//! What both test files of this crate run: its own `train` binary from the crate's folder, and a run's
//! summary.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// This crate's `train <args>`, run from its folder as a user runs it.
pub fn train(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_train"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("TRAIN_CONFIG_PATH")
        .output()
        .unwrap()
}

pub fn summary(run: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap()
}
