//! lightning-hydra-template's `extras:` (its `utils.extras`), done once per run by the process that
//! writes the run's records, before training: `enforce_tags` writes `tags.log` (an untagged run was
//! refused when the config was read); `print_config` prints the resolved config and keeps it as
//! `config_tree.log`.
//! (`ignore_warnings` is the job's logging: `logs::LogSetup::hide_warnings`.)

use crate::config::errors::ConfigError;
use crate::schema::Experiment;
use std::path::Path;

pub fn apply(exp: &Experiment, config_yaml: &str, output_dir: &Path) -> Result<(), ConfigError> {
    let extras = &exp.extras;
    if !(extras.enforce_tags || extras.print_config) {
        return Ok(());
    }
    let write = |name: &str, text: &str| {
        let path = output_dir.join(name);
        let _ = std::fs::create_dir_all(output_dir);
        crate::storage::records::write_atomic(&path, text.as_bytes())
            .map_err(|e| ConfigError::Io(format!("could not write {}: {e}", path.display())))
    };
    // An untagged run was refused when the config was read (`schema::extract`), on every rank.
    if extras.enforce_tags {
        write("tags.log", &format!("{:?}\n", exp.tags))?;
    }
    if extras.print_config {
        println!("{config_yaml}");
        write("config_tree.log", config_yaml)?;
    }
    Ok(())
}
