//! How a `_target_` is named in messages: its text, and the error for one that is Python code of the
//! user's project. Shared by the target translation (`targets`), the registered targets (`registered`) and
//! the template's modules (`template`).

use crate::config::errors::{at, ConfigError};
use crate::config::tree::Node;

/// A `_target_` node's text (empty when it is not a string).
pub(super) fn target_text(t: &Node) -> &str {
    t.as_str().unwrap_or_default()
}

/// A project's own Python class (its LightningModule or DataModule) named as a target.
pub(super) fn user_code(section: &str, target: &Node) -> ConfigError {
    ConfigError::Schema(format!(
        "{section}: _target_ {} is Python code of your project; trainyard runs no Python, so it cannot build \
         it. Choose one of trainyard's built-in {section} configs instead (`{section}=<option>`, see \
         `train --help` for the options of conf/{section}/){}",
        target_text(target),
        at(&target.source)
    ))
}
