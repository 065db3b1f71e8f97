//! The config groups trainyard ships (this repository's `conf/` and `experiments/`), embedded in the binary
//! at build time (`build.rs` lists them) and put on every search path as a package entry,
//! `pkg://trainyard.conf` (provider `trainyard`), after the project's own directories: the way Hydra
//! places a plugin's configs, so a project's file of the same group and name wins. A project's
//! `conf/train.yaml` names them in its defaults list without copying any; with no project at all the
//! shipped primary config (`train`) is used.

use crate::config::hydra::builtin::{BuiltinConfig, BuiltinSource};

/// The search-path entry the shipped configs are listed under.
pub static TRAINYARD_CONF: BuiltinSource = BuiltinSource {
    provider: "trainyard",
    path: "pkg://trainyard.conf",
    before_user: false,
};

/// Every shipped config: `model/resnet18`, `trainer/ddp`, `experiment/quickstart`, `train`, ...
pub static SHIPPED: &[BuiltinConfig] = include!(concat!(env!("OUT_DIR"), "/shipped_configs.rs"));

/// The shipped config at `config_path`, if there is one.
pub fn shipped(config_path: &str) -> Option<&'static BuiltinConfig> {
    SHIPPED.iter().find(|c| c.config_path == config_path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file of `conf/` and `experiments/` is in the binary, with its text.
    #[test]
    fn every_shipped_file_is_embedded() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut count = 0;
        for (dir, mount) in [("conf", ""), ("experiments", "experiment/")] {
            let mut stack = vec![root.join(dir)];
            while let Some(d) = stack.pop() {
                for entry in std::fs::read_dir(&d).unwrap().flatten() {
                    let path = entry.path();
                    if path.is_dir() {
                        stack.push(path);
                        continue;
                    }
                    let rel = path
                        .strip_prefix(root.join(dir))
                        .unwrap()
                        .with_extension("");
                    let name = format!("{mount}{}", rel.display());
                    let embedded = shipped(&name).unwrap_or_else(|| panic!("{name} not embedded"));
                    assert_eq!(embedded.text, std::fs::read_to_string(&path).unwrap());
                    count += 1;
                }
            }
        }
        assert_eq!(count, SHIPPED.len());
        assert!(shipped("train").is_some() && shipped("experiment/quickstart").is_some());
    }
}
