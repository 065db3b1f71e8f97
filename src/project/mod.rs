//! Where a run's configs come from and where its outputs go: the project root (found by walking up to
//! `conf/train.yaml`, or `TRAIN_CONFIG_PATH`), the config search path (`--config-path`, `--config-dir`,
//! then trainyard's shipped groups: `shipped`), and `train init`, which writes a project (`init`).

pub mod init;
pub mod shipped;

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
    /// No project was found and no `--config-path` given: the primary config is the shipped one.
    pub shipped_primary: bool,
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
        let mut shipped_primary = false;
        if let Some(dir) = &cli.config_path {
            let dir = cwd.join(dir);
            if !dir.is_dir() {
                return Err(ConfigError::MissingConfig(format!(
                    "Primary config directory not found: {}\n    (from --config-path/-cp; \
                     without it, the project found from here or else trainyard's built-in configs are used)",
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
            match find_project(&cwd)? {
                Some(root) => {
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
                None => {
                    shipped_primary = true;
                    project_root = cwd.clone();
                }
            }
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
        let repo = Repository::new(roots).with_package(shipped::SHIPPED);
        if cli.config_path.is_some() && repo.find_file(&config_name).is_none() {
            // `-cp DIR` names the primary config's directory: the shipped `train` does not stand in.
            return Err(ConfigError::MissingConfig(format!(
                "Cannot find primary config '{config_name}'. Check that it's in your config search path.\n\
                 (no {config_name}.yaml in --config-path/-cp {})",
                cwd.join(cli.config_path.as_deref().unwrap_or(Path::new(""))).display()
            )));
        }
        Ok(Setup {
            repo,
            config_name,
            project_root,
            source: cli.clone(),
            shipped_primary,
        })
    }

    /// The line saying the shipped configs stand in for a project, when they do (printed once per
    /// command by the app, not by the processes it starts).
    pub fn shipped_notice(&self) -> Option<String> {
        self.shipped_primary.then(|| {
            format!(
                "No project here (no {PROJECT_MARKER} in {} or its parents): using trainyard's built-in \
                 configs ({}); outputs go to ./logs. `train init` writes a project.",
                self.project_root.display(),
                shipped::TRAINYARD_CONF.path
            )
        })
    }
}

/// The project root: `TRAIN_CONFIG_PATH`, else the nearest directory upward holding `conf/train.yaml`;
/// `None` when there is none (trainyard's built-in configs are used then).
pub fn find_project(cwd: &Path) -> Result<Option<PathBuf>, ConfigError> {
    if let Ok(dir) = std::env::var("TRAIN_CONFIG_PATH") {
        let dir = cwd.join(dir);
        if dir.join(PROJECT_MARKER).is_file() {
            return Ok(Some(dir));
        }
        return Err(ConfigError::MissingConfig(format!(
            "TRAIN_CONFIG_PATH={} has no {PROJECT_MARKER} (unset it to use the project found from the \
             current directory, or trainyard's built-in configs)",
            dir.display()
        )));
    }
    Ok(cwd
        .ancestors()
        .find(|dir| dir.join(PROJECT_MARKER).is_file())
        .map(Path::to_path_buf))
}
