//! The group choices and deletions that override a defaults list (Hydra's `Overrides` in
//! `defaults_list.py`): from the command line first, from `override` entries of nested configs next;
//! each must be used, or it is an error naming it.

use super::element::*;
use crate::config::errors::{at, ConfigError};
use crate::config::tree::Source;
use indexmap::IndexMap;
use std::collections::{BTreeSet, HashMap};

/// A group choice that came from the command line (or an `override` entry), before it is used.
#[derive(Debug, Clone)]
pub(super) struct OverrideMeta {
    pub(super) external: bool,
    pub(super) source: Source,
    pub(super) containing_config_path: Option<String>,
    pub(super) used: bool,
}

#[derive(Debug, Clone)]
pub(super) struct Deletion {
    pub(super) name: Option<String>,
    pub(super) used: bool,
}

/// Group overrides split out of the command line, and what composition learns while walking the tree.
#[derive(Debug, Default)]
pub struct GroupOverrides {
    choices: IndexMap<String, GroupValue>,
    meta: IndexMap<String, OverrideMeta>,
    /// `+group=option` entries, appended to the primary config's defaults list.
    pub appends: Vec<InputDefault>,
    deletions: IndexMap<String, Deletion>,
    /// Chosen option of every group seen, by override key (`hydra.runtime.choices`).
    pub known_choices: IndexMap<String, Option<String>>,
    known_choices_per_group: HashMap<String, BTreeSet<String>>,
    /// Where each known choice was made, for the "Multiple values" error.
    known_choice_sources: HashMap<String, Source>,
}

impl GroupOverrides {
    pub fn choose(&mut self, key: &str, value: GroupValue, source: Source) {
        self.choices.insert(key.to_string(), value);
        self.meta.insert(
            key.to_string(),
            OverrideMeta {
                external: true,
                source,
                containing_config_path: None,
                used: false,
            },
        );
    }

    pub fn delete(&mut self, key: &str, name: Option<String>) {
        self.deletions
            .insert(key.to_string(), Deletion { name, used: false });
    }

    pub(super) fn add_override(&mut self, parent_config_path: &str, d: &InputDefault) {
        let key = d.get_override_key();
        if !self.choices.contains_key(&key) {
            if let Entry::Group { value, .. } = &d.entry {
                self.choices.insert(key.clone(), value.clone());
            }
            self.meta.insert(
                key,
                OverrideMeta {
                    external: false,
                    source: d.source.clone(),
                    containing_config_path: Some(parent_config_path.to_string()),
                    used: false,
                },
            );
            let _ = d.get_relative_override_key();
        }
    }

    pub(super) fn is_overridden(&self, d: &InputDefault) -> bool {
        d.is_group() && self.choices.contains_key(&d.get_override_key())
    }

    pub(super) fn override_default_option(&mut self, d: &mut InputDefault) {
        let key = d.get_override_key();
        if let Some(value) = self.choices.get(&key) {
            // Choosing the option the defaults list already names (`local=default`) changes nothing: an
            // optional group's missing option is then skipped as it would be without the override.
            let same = matches!(&d.entry, Entry::Group { value: current, .. } if current == value);
            d.set_value(value.clone());
            d.overridden |= !same;
            if let Some(meta) = self.meta.get_mut(&key) {
                meta.used = true;
                d.source = meta.source.clone();
            }
        }
    }

    pub(super) fn ensure_overrides_used(&self) -> Result<(), ConfigError> {
        for (key, meta) in &self.meta {
            if meta.used {
                continue;
            }
            let group = key.split('@').next().unwrap_or(key);
            let choices: Vec<&String> = self
                .known_choices_per_group
                .get(group)
                .map(|s| s.iter().collect())
                .unwrap_or_default();
            let mut msg = match choices.len() {
                0 => format!("Could not override '{key}'. No match in the defaults list."),
                1 => format!(
                    "Could not override '{key}'.\nDid you mean to override {}?",
                    choices[0]
                ),
                _ => format!(
                    "Could not override '{key}'.\nDid you mean to override one of {}?",
                    choices
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            if let Some(path) = &meta.containing_config_path {
                msg = format!("In '{path}': {msg}");
            }
            if meta.external {
                let value = match &self.choices[key] {
                    GroupValue::Name(Some(n)) => n.clone(),
                    GroupValue::Name(None) => "None".into(),
                    GroupValue::Options(o) => format!("[{}]", o.join(", ")),
                };
                msg.push_str(&format!(
                    "\nTo append to your default list use +{key}={value}"
                ));
            }
            return Err(ConfigError::composition(msg));
        }
        Ok(())
    }

    pub(super) fn ensure_deletions_used(&self) -> Result<(), ConfigError> {
        for (key, deletion) in &self.deletions {
            if !deletion.used {
                let desc = match &deletion.name {
                    Some(n) => format!("{key}={n}"),
                    None => key.clone(),
                };
                return Err(ConfigError::composition(format!(
                    "Could not delete '{desc}'. No match in the defaults list"
                )));
            }
        }
        Ok(())
    }

    pub(super) fn set_known_choice(&mut self, d: &InputDefault) -> Result<(), ConfigError> {
        if !d.is_group() {
            return Ok(());
        }
        let key = d.get_override_key();
        let name = d.get_name();
        match self.known_choices.get(&key) {
            None => {
                self.known_choices.insert(key.clone(), name);
                self.known_choice_sources
                    .insert(key.clone(), d.source.clone());
            }
            Some(prev) if *prev != name => {
                let first = self
                    .known_choice_sources
                    .get(&key)
                    .filter(|s| !s.is_internal())
                    .map(|s| {
                        format!(
                            "\n    (first chosen{})",
                            at(s).trim_start_matches("\n    (set")
                        )
                    })
                    .unwrap_or_default();
                return Err(ConfigError::composition(format!(
                    "Multiple values for {key}. To override a value use 'override {key}: {}'{first}{}",
                    prev.clone().unwrap_or_else(|| "None".into()),
                    at(&d.source)
                )));
            }
            Some(_) => {}
        }
        self.known_choices_per_group
            .entry(d.get_group_path())
            .or_default()
            .insert(key);
        Ok(())
    }

    pub(super) fn is_deleted(&self, d: &InputDefault) -> bool {
        if !d.is_group() {
            return false;
        }
        match self.deletions.get(&d.get_override_key()) {
            None => false,
            Some(Deletion { name: None, .. }) => true,
            Some(Deletion { name: Some(n), .. }) => Some(n.clone()) == d.get_name(),
        }
    }

    pub(super) fn mark_deleted(&mut self, d: &mut InputDefault) {
        d.deleted = true;
        if let Some(del) = self.deletions.get_mut(&d.get_override_key()) {
            del.used = true;
        }
    }
}
