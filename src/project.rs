//! Where a run's configs come from and where its outputs go: the project root (found by walking up to
//! `conf/train.yaml`, or `TRAIN_CONFIG_PATH`) and the config search path (`--config-path`, `--config-dir`).

use crate::config::errors::ConfigError;
use crate::config::repository::{Repository, SearchRoot};
use std::path::{Path, PathBuf};

/// The file whose presence marks a project root (searched from the current directory upward).
const PROJECT_MARKER: &str = "conf/train.yaml";

const DEFAULT_CONFIG_NAME: &str = "train";

/// The command line's say on where configs come from (`--config-path`, `--config-name`, `--config-dir`).
#[derive(Debug, Clone, Default)]
pub struct ConfigLocation {
    pub config_path: Option<PathBuf>,
    pub config_name: Option<String>,
    pub config_dir: Vec<PathBuf>,
}

impl ConfigLocation {
    /// The same flags again, for the command line of a job started in its own process.
    pub fn flags(&self) -> Vec<std::ffi::OsString> {
        let mut flags = Vec::new();
        if let Some(p) = &self.config_path {
            flags.extend(["--config-path".into(), p.clone().into_os_string()]);
        }
        if let Some(n) = &self.config_name {
            flags.extend(["--config-name".into(), n.into()]);
        }
        for d in &self.config_dir {
            flags.extend(["--config-dir".into(), d.clone().into_os_string()]);
        }
        flags
    }
}

/// Where configs come from and where outputs go.
pub struct Setup {
    pub repo: Repository,
    pub config_name: String,
    /// Outputs (`logs/`) are written relative to this directory.
    pub project_root: PathBuf,
    /// How the command line named them.
    pub source: ConfigLocation,
}

impl Setup {
    pub fn discover(cli: &ConfigLocation) -> Result<Setup, ConfigError> {
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
            source: cli.clone(),
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
