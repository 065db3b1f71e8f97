//! Where a run's configs come from and where its outputs go: the project root (found by walking up to
//! `conf/train.yaml`, or `TRAIN_CONFIG_PATH`) and the config search path (`--config-path`, `--config-dir`).

use crate::cli::Cli;
use crate::config::errors::ConfigError;
use crate::config::repository::{Repository, SearchRoot};
use std::path::{Path, PathBuf};

/// The file whose presence marks a project root (searched from the current directory upward).
const PROJECT_MARKER: &str = "conf/train.yaml";

const DEFAULT_CONFIG_NAME: &str = "train";

/// Where configs come from and where outputs go.
pub struct Setup {
    pub repo: Repository,
    pub config_name: String,
    /// Outputs (`logs/`) are written relative to this directory.
    pub project_root: PathBuf,
}

impl Setup {
    pub fn discover(cli: &Cli) -> Result<Setup, ConfigError> {
        let cwd = std::env::current_dir()
            .map_err(|e| ConfigError::Io(format!("no current directory: {e}")))?;
        let config_name = cli
            .config_name
            .clone()
            .unwrap_or_else(|| DEFAULT_CONFIG_NAME.to_string());
        let mut roots = Vec::new();
        let project_root;
        if let Some(dir) = &cli.config_path {
            let dir = cwd.join(dir);
            if !dir.is_dir() {
                return Err(ConfigError::MissingConfig(format!(
                    "Primary config directory not found: {}\n    (from --config-path/-cp)",
                    dir.display()
                )));
            }
            roots.push(SearchRoot {
                dir,
                mount: String::new(),
                provider: "main".into(),
            });
            project_root = cwd.clone();
        } else {
            let root = find_project(&cwd)?;
            roots.push(SearchRoot {
                dir: root.join("conf"),
                mount: String::new(),
                provider: "main".into(),
            });
            roots.push(SearchRoot {
                dir: root.join("experiments"),
                mount: "experiment".into(),
                provider: "project".into(),
            });
            project_root = root;
        }
        for dir in &cli.config_dir {
            let dir = cwd.join(dir);
            if !dir.is_dir() {
                return Err(ConfigError::MissingConfig(format!(
                    "Additional config directory not found: {}\n    (from --config-dir/-cd)",
                    dir.display()
                )));
            }
            roots.push(SearchRoot {
                dir,
                mount: String::new(),
                provider: "command-line".into(),
            });
        }
        Ok(Setup {
            repo: Repository::new(roots),
            config_name,
            project_root,
        })
    }
}

/// The project root: `TRAIN_CONFIG_PATH`, else the nearest directory upward holding `conf/train.yaml`.
pub fn find_project(cwd: &Path) -> Result<PathBuf, ConfigError> {
    if let Ok(dir) = std::env::var("TRAIN_CONFIG_PATH") {
        let dir = cwd.join(dir);
        if dir.join(PROJECT_MARKER).is_file() {
            return Ok(dir);
        }
        return Err(ConfigError::MissingConfig(format!(
            "TRAIN_CONFIG_PATH={} has no {PROJECT_MARKER}",
            dir.display()
        )));
    }
    for dir in cwd.ancestors() {
        if dir.join(PROJECT_MARKER).is_file() {
            return Ok(dir.to_path_buf());
        }
    }
    Err(ConfigError::MissingConfig(format!(
        "No project found: looked for {PROJECT_MARKER} in {} and its parents.\n\
         Run train inside a project, pass --config-path/-cp DIR, or set TRAIN_CONFIG_PATH=<project dir>.",
        cwd.display()
    )))
}
