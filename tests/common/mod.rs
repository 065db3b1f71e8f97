//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// The `train` binary under test.
pub const TRAIN: &str = env!("CARGO_BIN_EXE_train");

/// Run `train` in `cwd` (a test project), ignoring any project named in the environment.
pub fn train(cwd: &Path, args: &[&str]) -> Output {
    Command::new(TRAIN)
        .args(args)
        .current_dir(cwd)
        .env_remove("TRAIN_CONFIG_PATH")
        .output()
        .unwrap()
}

/// A run's `summary.json`.
pub fn summary(run: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap()
}

/// A copy of this repository's own conf/ and experiments/ in a temp dir, so runs write their logs there.
pub fn real_project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for sub in ["conf", "experiments"] {
        copy_dir(&root.join(sub), &dir.path().join(sub));
    }
    dir
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
