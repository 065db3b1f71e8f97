//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::Path;

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
