//! Composition: parsed overrides + the defaults list → one config tree (Hydra's `ConfigLoaderImpl`).
//! Group overrides steer the defaults list; the rest are applied to the merged tree afterwards, in order,
//! with the struct-mode rules that make a typo an error instead of a silent new key.

use super::defaults::{create_defaults_list, DefaultsList, GroupOverrides, GroupValue};
use super::errors::{at, did_you_mean, ConfigError};
use super::grammar::{Element, Override, OverrideKind, ParsedValue, Sweep};
use super::repository::Repository;
use super::tree::{split_key, Map, Node, Source, Value};
use indexmap::IndexMap;
use std::sync::Arc;

/// A single run composes with sweeps forbidden; a multirun's master config skips them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunMode {
    Run,
    Multirun,
}

/// The result of composition.
#[derive(Debug)]
pub struct Composed {
    pub config: Node,
    pub defaults: DefaultsList,
    /// The chosen option of every group (`hydra.runtime.choices`).
    pub choices: IndexMap<String, Option<String>>,
}

/// Compose `config_name` from the search path with `overrides` applied.
pub fn compose(
    repo: &Repository,
    config_name: &str,
    overrides: &[Override],
    mode: RunMode,
) -> Result<Composed, ConfigError> {
    compose_over(repo, config_name, overrides, mode, false)
}

/// `compose`, optionally with Hydra's own `hydra/config` composed first (its groups, the `hydra` node).
pub fn compose_over(
    repo: &Repository,
    config_name: &str,
    overrides: &[Override],
    mode: RunMode,
    with_hydra: bool,
) -> Result<Composed, ConfigError> {
    validate_sweeps(overrides, mode)?;
    let (group_overrides, config_overrides) = split_overrides(repo, overrides)?;
    let defaults = create_defaults_list(
        repo,
        config_name,
        group_overrides,
        mode == RunMode::Multirun,
        with_hydra,
    )?;
    let mut config = Node::empty_map();
    for item in &defaults.defaults {
        let Some(loaded) = repo.load(&item.config_path)? else {
            return Err(ConfigError::MissingConfig(format!(
                "Could not load '{}'",
                item.config_path
            )));
        };
        if matches!(loaded.body.value, Value::List(_)) && (item.primary || item.package.is_empty())
        {
            let what = if item.primary {
                format!("primary config '{}'", item.config_path)
            } else {
                format!("config '{}' (merged at the top level)", item.config_path)
            };
            return Err(ConfigError::composition(format!(
                "{what} must be a DictConfig, got ListConfig{}",
                at(&loaded.body.source)
            )));
        }
        let body = loaded.body.clone().wrap_in_package(&item.package);
        config.try_merge(body).map_err(|e| {
            ConfigError::composition(format!(
                "In '{}': ConfigTypeError raised while composing config:\n{e}\n    (merging {})",
                item.config_path,
                super::repository::display_path(&loaded.file)
            ))
        })?;
    }
    for o in config_overrides {
        apply_override(&mut config, o)?;
    }
    let choices = defaults.known_choices.clone();
    Ok(Composed {
        config,
        defaults,
        choices,
    })
}

fn validate_sweeps(overrides: &[Override], mode: RunMode) -> Result<(), ConfigError> {
    if mode == RunMode::Multirun {
        return Ok(());
    }
    if let Some(o) = overrides.iter().find(|o| o.is_sweep()) {
        let simple = matches!(
            o.value,
            Some(ParsedValue::Sweep(Sweep::Choice {
                simple_form: true,
                ..
            }))
        );
        let msg = if simple {
            format!(
                "Ambiguous value for argument '{}'\n\
                 1. To use it as a list, use key=[value1,value2]\n\
                 2. To use it as string, quote the value: key=\\'value1,value2\\'\n\
                 3. To sweep over it, add --multirun to your command line",
                o.input
            )
        } else {
            format!("Sweep parameters '{}' requires --multirun", o.input)
        };
        return Err(ConfigError::composition(msg));
    }
    Ok(())
}

/// Split into group overrides (steer the defaults list) and config overrides (applied after merging).
fn split_overrides<'a>(
    repo: &Repository,
    overrides: &'a [Override],
) -> Result<(GroupOverrides, Vec<&'a Override>), ConfigError> {
    let mut groups = GroupOverrides::default();
    let mut config = Vec::new();
    for o in overrides {
        if o.is_sweep() {
            continue;
        }
        let key = &o.key.key_or_group;
        let is_group = repo.group_exists(key);
        let is_dict = matches!(o.value, Some(ParsedValue::Element(Element::Dict(_))));
        if is_dict || !is_group {
            config.push(o);
            continue;
        }
        let override_key = match &o.key.package {
            Some(p) => format!("{key}@{p}"),
            None => key.clone(),
        };
        match o.kind {
            OverrideKind::ForceAdd => {
                return Err(ConfigError::composition(format!(
                    "force-add of config groups is not supported: '{}'",
                    o.input
                )))
            }
            OverrideKind::Delete => {
                let name = match &o.value {
                    None => None,
                    Some(ParsedValue::Element(Element::Str { value, .. })) => Some(value.clone()),
                    Some(_) => {
                        return Err(ConfigError::composition(format!(
                            "Config group override deletion value must be a string : {}",
                            o.input
                        )))
                    }
                };
                groups.delete(&override_key, name);
            }
            OverrideKind::Add | OverrideKind::Change => {
                let value = group_value(o)?;
                super::defaults::check_option_names(
                    "command line",
                    &value,
                    &Source::Override(Arc::from(o.input.as_str())),
                )?;
                if o.kind == OverrideKind::Add {
                    let mut d = super::defaults::InputDefault::group(
                        key,
                        value,
                        o.key.package.clone(),
                        Source::Override(Arc::from(o.input.as_str())),
                    );
                    if let super::defaults::Entry::Group {
                        external_append, ..
                    } = &mut d.entry
                    {
                        *external_append = true;
                    }
                    groups.appends.push(d);
                } else {
                    groups.choose(
                        &override_key,
                        value,
                        Source::Override(Arc::from(o.input.as_str())),
                    );
                }
            }
        }
    }
    Ok((groups, config))
}

fn group_value(o: &Override) -> Result<GroupValue, ConfigError> {
    let bad = |type_name: &str| {
        ConfigError::composition(format!(
            "Config group override must be a string or a list. Got {type_name}\n    (in override '{}')",
            o.input
        ))
    };
    match &o.value {
        Some(ParsedValue::Element(Element::Str { value, .. })) => {
            Ok(GroupValue::Name(Some(value.clone())))
        }
        Some(ParsedValue::Element(Element::List(items))) => items
            .iter()
            .map(|e| match e {
                Element::Str { value, .. } => Ok(value.clone()),
                other => Err(bad(element_type(other))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(GroupValue::Options),
        Some(ParsedValue::Element(other)) => Err(bad(element_type(other))),
        _ => Err(bad("NoneType")),
    }
}

fn element_type(e: &Element) -> &'static str {
    match e {
        Element::Null => "NoneType",
        Element::Bool(_) => "bool",
        Element::Int(_) => "int",
        Element::Float(_) => "float",
        Element::Str { .. } => "str",
        Element::List(_) => "list",
        Element::Dict(_) => "dict",
    }
}

/// An override value as a tree node, remembering the override as its source.
pub fn element_to_node(e: &Element, source: &Source) -> Node {
    let value = match e {
        Element::Null => Value::Null,
        Element::Bool(b) => Value::Bool(*b),
        Element::Int(i) => Value::Int(*i),
        Element::Float(x) => Value::Float(*x),
        Element::Str { value, .. } if value == "???" => Value::Missing,
        Element::Str { value, .. } => Value::Str(value.clone()),
        Element::List(items) => {
            Value::List(items.iter().map(|i| element_to_node(i, source)).collect())
        }
        Element::Dict(items) => {
            let mut map = Map::new();
            // A `null` key is refused before this (`Element::null_key`); left here, it is the text "null".
            for (k, v) in items {
                let (text, kind) = k
                    .tree_key()
                    .unwrap_or(("null".into(), super::tree::KeyKind::Str));
                map.insert(text, element_to_node(v, source).keyed(kind));
            }
            Value::Map(map)
        }
    };
    Node::new(value, source.clone())
}

/// Apply one config override (`k=v`, `+k=v`, `++k=v`, `~k`) with Hydra's rules and messages.
fn apply_override(cfg: &mut Node, o: &Override) -> Result<(), ConfigError> {
    let key = o.key.key_or_group.as_str();
    if o.key.package.is_some() {
        return Err(ConfigError::composition(format!(
            "Override {} looks like a config group override, but config group '{key}' does not exist.",
            o.input
        )));
    }
    let source = Source::Override(Arc::from(o.input.as_str()));
    // OmegaConf refuses a `null` dict key when the value is merged (Hydra: "Error merging override").
    let merged_value = match (&o.kind, &o.value) {
        (OverrideKind::Delete, _) => None,
        (_, Some(ParsedValue::Element(e))) => Some(e),
        _ => None,
    };
    if let Some(e) = merged_value {
        if let Some(full_key) = e.null_key(key) {
            return Err(ConfigError::composition(format!(
                "Error merging override {}\nIncompatible key type 'NoneType'\n    full_key: {full_key}\n    object_type=dict",
                o.input
            )));
        }
    }
    let value = match &o.value {
        Some(ParsedValue::Element(e)) => Some(element_to_node(e, &source)),
        Some(ParsedValue::Sweep(_)) => return Ok(()),
        None => None,
    };
    match o.kind {
        OverrideKind::Delete => delete(cfg, key, value.as_ref()),
        OverrideKind::Add => {
            let existing_is_none =
                matches!(cfg.get(key).map(|n| &n.value), None | Some(Value::Null));
            let is_container = matches!(
                value.as_ref().map(|v| &v.value),
                Some(Value::Map(_) | Value::List(_))
            );
            if existing_is_none || is_container {
                update(
                    cfg,
                    key,
                    value.unwrap_or(Node::new(Value::Null, source)),
                    true,
                    o,
                )
            } else {
                let line = &o.input;
                Err(ConfigError::composition(format!(
                    "Could not append to config. An item is already at '{key}'.\n\
                     Either remove + prefix: '{}'\n\
                     Or add a second + to add or override '{key}': '+{line}'{}",
                    &line[1..],
                    cfg.get(key).map(|n| at(&n.source)).unwrap_or_default()
                )))
            }
        }
        OverrideKind::ForceAdd => update(
            cfg,
            key,
            value.unwrap_or(Node::new(Value::Null, source)),
            true,
            o,
        ),
        OverrideKind::Change => update(
            cfg,
            key,
            value.unwrap_or(Node::new(Value::Null, source)),
            false,
            o,
        ),
    }
}

fn delete(cfg: &mut Node, key: &str, expected: Option<&Node>) -> Result<(), ConfigError> {
    // Hydra looks the key up with `OmegaConf.select`, which reads a null or `???` value as absent.
    let found = cfg.get(key);
    let existing = found.filter(|n| !matches!(n.value, Value::Null | Value::Missing));
    let Some(existing) = existing else {
        let why = match found {
            Some(n) if n.is_missing() => format!(
                " Its value is ???, which Hydra reads as no value: leave it out, or set it with \
                 {key}=<value>.{}",
                at(&n.source)
            ),
            _ => String::new(),
        };
        return Err(ConfigError::composition(format!(
            "Could not delete from config. '{key}' does not exist.{why}"
        )));
    };
    if let Some(expected) = expected {
        if !values_equal(&existing.value, &expected.value) {
            return Err(ConfigError::composition(format!(
                "Could not delete from config. The value of '{key}' is {} and not {}.{}",
                existing.value.display_python(),
                expected.value.display_python(),
                at(&existing.source)
            )));
        }
    }
    let parts = split_key(key);
    let (last, parents) = parts.split_last().expect("key is non-empty");
    let parent = cfg
        .get_mut(&parents.join("."))
        .expect("parent exists when child exists");
    match &mut parent.value {
        Value::Map(m) => {
            m.shift_remove(*last);
        }
        Value::List(l) => {
            if let Ok(i) = last.parse::<usize>() {
                if i < l.len() {
                    l.remove(i);
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// Python equality of plain values (1 == 1.0, lists and dicts element-wise).
fn values_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Int(x), Value::Float(y)) | (Value::Float(y), Value::Int(x)) => (*x as f64) == *y,
        (Value::Bool(x), Value::Int(y)) | (Value::Int(y), Value::Bool(x)) => (*x as i64) == *y,
        (Value::List(x), Value::List(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|(a, b)| values_equal(&a.value, &b.value))
        }
        (Value::Map(x), Value::Map(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| values_equal(&v.value, &w.value)))
        }
        _ => a == b,
    }
}

/// `OmegaConf.update(cfg, key, value, merge=True, force_add=...)` on a struct-mode config.
fn update(
    cfg: &mut Node,
    key: &str,
    value: Node,
    force_add: bool,
    o: &Override,
) -> Result<(), ConfigError> {
    let parts = split_key(key);
    let not_found = |cfg: &Node| {
        let mut msg = format!(
            "Could not override '{key}'.\nTo append to your config use +{}",
            o.input
        );
        let paths = cfg.all_paths();
        if let Some(s) = did_you_mean(key, paths.iter().map(String::as_str)) {
            msg.push_str(&format!("\nDid you mean '{s}'?"));
        }
        ConfigError::composition(msg)
    };
    if parts.is_empty() {
        return Err(not_found(cfg));
    }
    let mut missing_parent = false;
    {
        // Walk to the parent, creating containers only when force-adding.
        let mut node = &mut *cfg;
        for part in &parts[..parts.len() - 1] {
            let exists_as_container = matches!(
                node.child(part).map(|n| &n.value),
                Some(Value::Map(_) | Value::List(_))
            );
            if !exists_as_container {
                let exists = node.child(part).is_some();
                match &mut node.value {
                    Value::Map(m) if force_add || exists => {
                        m.insert(
                            part.to_string(),
                            Node::new(Value::Map(Map::new()), value.source.clone()),
                        );
                    }
                    _ => {
                        missing_parent = true;
                        break;
                    }
                }
                if !force_add {
                    // A fresh dict in struct mode rejects the new key below.
                    missing_parent = true;
                    break;
                }
            }
            node = node.child_mut(part).expect("child just ensured");
        }
        if !missing_parent {
            let last = parts[parts.len() - 1];
            match &mut node.value {
                Value::Map(m) => match m.get_mut(last) {
                    Some(existing) => {
                        let both_maps = matches!((&existing.value, &value.value), (Value::Map(_), Value::Map(_)));
                        if both_maps && !force_add {
                            if let Some(new_key) = first_new_key(existing, &value) {
                                let _ = new_key;
                                return Err(not_found(cfg));
                            }
                        }
                        if both_maps {
                            existing.merge(value);
                        } else {
                            *existing = value;
                        }
                    }
                    None if force_add => {
                        m.insert(last.to_string(), value);
                    }
                    None => missing_parent = true,
                },
                Value::List(l) => match last.parse::<usize>().ok().and_then(|i| l.get_mut(i)) {
                    Some(slot) => *slot = value,
                    None => {
                        return Err(ConfigError::composition(format!(
                            "Error merging override {}\n    (index {last} is out of range for a list of {} items)",
                            o.input,
                            l.len()
                        )))
                    }
                },
                _ => missing_parent = true,
            }
        }
    }
    if missing_parent {
        return Err(not_found(cfg));
    }
    Ok(())
}

/// The first key of `src` (recursively) that `dst` lacks: a struct-mode merge may not add it.
fn first_new_key(dst: &Node, src: &Node) -> Option<String> {
    let (Value::Map(d), Value::Map(s)) = (&dst.value, &src.value) else {
        return None;
    };
    for (k, v) in s {
        match d.get(k) {
            None => return Some(k.clone()),
            Some(existing) => {
                if let Some(inner) = first_new_key(existing, v) {
                    return Some(format!("{k}.{inner}"));
                }
            }
        }
    }
    None
}
