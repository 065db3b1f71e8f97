//! The glue between what the user typed and the composer, as Hydra's `hydra/_internal/hydra.py` does it:
//! overrides parsed, the built-in `hydra` node composed under every primary config, and the composed tree
//! split back into the job's config and the `hydra` node.

use super::compose::{Composed, RunMode};
use super::errors::ConfigError;
use super::grammar::{parse_override, Override};
use super::repository::Repository;
use super::tree::Node;
use super::yaml;

pub fn parse_overrides(texts: &[String]) -> Result<Vec<Override>, ConfigError> {
    texts
        .iter()
        .map(|t| parse_override(t).map_err(|e| ConfigError::Parse(e.to_string())))
        .collect()
}

/// The `hydra` node every composition starts from, so `hydra.run.dir=...` and sweeper params can be set.
fn builtin_hydra() -> Node {
    let text = "hydra:\n  run:\n    dir: null\n  sweep:\n    dir: null\n    subdir: null\n  sweeper:\n    params: {}\n  job:\n    name: null\n";
    yaml::parse(text, "<builtin hydra config>")
        .ok()
        .flatten()
        .unwrap_or_else(Node::empty_map)
}

/// Compose with the built-in `hydra` node underneath (a primary config's `hydra:` block merges over it).
pub fn compose_with_hydra(
    repo: &Repository,
    config_name: &str,
    overrides: &[Override],
    mode: RunMode,
) -> Result<Composed, ConfigError> {
    crate::config::compose::compose_over(builtin_hydra(), repo, config_name, overrides, mode)
}

/// Split a composed tree into the job's config and the `hydra` node.
pub fn split_hydra(mut config: Node) -> (Node, Node) {
    let hydra = config
        .as_map_mut()
        .and_then(|m| m.shift_remove("hydra"))
        .unwrap_or_else(Node::empty_map);
    (config, hydra)
}
