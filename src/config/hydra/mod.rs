//! Hydra's runtime around the composer, as `hydra/_internal/{hydra,config_loader_impl}.py` do it: overrides
//! parsed, `hydra.searchpath` applied, Hydra's own `hydra/config` (its groups and the `hydra` node) composed
//! under every primary config, the run-time fields of the `hydra` node filled, and the composed tree split
//! back into the job's config and the `hydra` node.
//!
//! `builtin` holds Hydra's own config groups, `runtime` fills `hydra.runtime`/`hydra.job`, `settings` reads
//! the `hydra` node into typed settings (refusing what trainyard cannot honour).

pub mod builtin;
pub mod optuna;
pub mod runtime;
pub mod settings;

use super::compose::{Composed, RunMode};
use super::defaults::HYDRA_CONFIG;
use super::errors::{at, ConfigError};
use super::grammar::{parse_override, Override, ParsedValue};
use super::repository::{display_path, Repository, SearchRoot};
use super::tree::{Node, Source, Value};

pub use runtime::JobRuntime;
pub use settings::{HydraSettings, LoggingStyle};

pub fn parse_overrides(texts: &[String]) -> Result<Vec<Override>, ConfigError> {
    texts
        .iter()
        .map(|t| parse_override(t).map_err(|e| ConfigError::Parse(e.to_string())))
        .collect()
}

/// Compose with Hydra's own config underneath (`hydra/config` and its groups; a primary config's `hydra:`
/// block merges over it), then fill what Hydra fills at composition: the overrides, the chosen options, the
/// job's name and `override_dirname`, the working directory and the config sources.
pub fn compose_with_hydra(
    repo: &Repository,
    config_name: &str,
    overrides: &[Override],
    mode: RunMode,
) -> Result<Composed, ConfigError> {
    let extended;
    let repo = match searchpath_roots(repo, config_name, overrides)? {
        Some(roots) => {
            extended = repo.extended(roots);
            &extended
        }
        None => repo,
    };
    if let Some(file) = repo.find_file(HYDRA_CONFIG) {
        return Err(ConfigError::composition(format!(
            "'{HYDRA_CONFIG}' is validated against ConfigStore schema with the same name.\n\
             A config named '{HYDRA_CONFIG}' ({}) replaces Hydra's own config, which trainyard composes \
             under every primary config: rename it (a project's Hydra settings go in `hydra/<name>.yaml`, \
             chosen with `- hydra: <name>` in the primary config's defaults)",
            display_path(&file)
        )));
    }
    let mut composed = super::compose::compose_over(repo, config_name, overrides, mode, true)?;
    let owners: Vec<(String, String)> = composed
        .defaults
        .defaults
        .iter()
        .filter_map(|d| {
            let loaded = repo.load(&d.config_path).ok().flatten()?;
            Some((display_path(&loaded.file), d.config_path.clone()))
        })
        .collect();
    let owner = |source: &Source| match source {
        Source::File { path, .. } => owners
            .iter()
            .find(|(file, _)| file.as_str() == path.as_ref())
            .map(|(_, config)| config.clone()),
        _ => None,
    };
    settings::check_schema(&mut composed.config, &composed.choices, &owner)?;
    settings::check_only_primary_sets_searchpath(repo, &composed, &owner)?;
    runtime::fill_composed(&mut composed, repo, config_name, overrides)?;
    Ok(composed)
}

/// Split a composed tree into the job's config and the `hydra` node.
pub fn split_hydra(mut config: Node) -> (Node, Node) {
    let hydra = config
        .as_map_mut()
        .and_then(|m| m.shift_remove("hydra"))
        .unwrap_or_else(Node::empty_map);
    (config, hydra)
}

/// `hydra.searchpath`, from the command line or else the primary config alone (Hydra reads it before
/// composing, so only the primary config may set it): the directories to append to the search path.
fn searchpath_roots(
    repo: &Repository,
    config_name: &str,
    overrides: &[Override],
) -> Result<Option<Vec<SearchRoot>>, ConfigError> {
    let from_cli = overrides
        .iter()
        .find(|o| o.key.key_or_group == "hydra.searchpath" && o.key.package.is_none());
    let (node, provider) = match from_cli {
        Some(o) => match &o.value {
            Some(ParsedValue::Element(e)) => (
                super::compose::element_to_node(
                    e,
                    &super::tree::Source::Override(std::sync::Arc::from(o.input.as_str())),
                ),
                "hydra.searchpath in command-line",
            ),
            _ => return Ok(None),
        },
        None => {
            let Some(loaded) = repo.load(config_name)? else {
                return Ok(None);
            };
            match loaded.body.get("hydra.searchpath") {
                Some(n) => (n.clone(), "hydra.searchpath in main"),
                None => return Ok(None),
            }
        }
    };
    let bad = || {
        ConfigError::composition(format!(
            "hydra.searchpath must be a list of strings. Got: {}{}",
            node.value.display_python(),
            at(&node.source)
        ))
    };
    let items = match &node.value {
        Value::Null => return Ok(None),
        Value::List(items) => items,
        _ => return Err(bad()),
    };
    let cwd = std::env::current_dir()
        .map_err(|e| ConfigError::Io(format!("no current directory: {e}")))?;
    let mut roots = Vec::new();
    for item in items {
        let Value::Str(text) = &item.value else {
            return Err(bad());
        };
        let env: std::collections::HashMap<String, String> = std::env::vars().collect();
        let text = if text.contains("${") {
            expand_env_only(text, &env, item)?
        } else {
            text.clone()
        };
        let dir = match text.split_once("://") {
            // trainyard's own groups are on every search path already.
            Some(("pkg", "trainyard.conf")) => continue,
            Some(("file", path)) => cwd.join(path),
            None => cwd.join(&text),
            Some((scheme, _)) => {
                return Err(ConfigError::composition(format!(
                    "hydra.searchpath entry '{text}': only file:// paths can be searched here \
                     (a {scheme}:// source is a Python package; copy its configs into a directory and \
                     name that){}",
                    at(&item.source)
                )))
            }
        };
        roots.push(SearchRoot {
            dir,
            mount: String::new(),
            provider: provider.to_string(),
        });
    }
    Ok(Some(roots))
}

/// A search-path entry may read environment variables (`file://${oc.env:HOME}/conf`): nothing else of the
/// config exists yet when the search path is built.
fn expand_env_only(
    text: &str,
    env: &std::collections::HashMap<String, String>,
    node: &Node,
) -> Result<String, ConfigError> {
    let ctx = super::interpolate::ResolveContext {
        now: chrono::Local::now().fixed_offset(),
        env: env.clone(),
        hydra: None,
    };
    let mut root = Node::empty_map();
    if let Some(m) = root.as_map_mut() {
        m.insert(
            "path".into(),
            Node::new(Value::Str(text.to_string()), node.source.clone()),
        );
    }
    let resolved = super::interpolate::resolve_path(&root, "path", &ctx)?;
    Ok(resolved.value.display_python())
}
