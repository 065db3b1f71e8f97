//! Resolving the defaults tree (Hydra's `_create_defaults_tree`): every config's own defaults list loaded
//! and walked depth-first, overrides applied, `_self_` placed, interpolations in group choices resolved.

use super::element::*;
use super::overrides::*;
use super::*;
use crate::config::errors::at;
use crate::config::tree::Source;

pub(super) struct Walker<'a> {
    pub(super) repo: &'a Repository,
    pub(super) overrides: &'a mut GroupOverrides,
    pub(super) skip_missing: bool,
    /// Options of an optional multi-select the command line named and that do not exist (Hydra drops them).
    pub(super) dropped_options: Vec<String>,
    /// The configs whose defaults lists are being expanded, outermost first: a config that includes
    /// itself, directly or through others, is refused by name (Hydra recurses until Python's recursion
    /// limit; here it overflowed the stack, found by fuzzing).
    pub(super) expanding: Vec<String>,
}

impl Walker<'_> {
    pub(super) fn create_tree(
        &mut self,
        mut root: TreeNode,
        is_root_config: bool,
        interpolated_subtree: bool,
        parent_path: Option<&str>,
    ) -> Result<TreeNode, ConfigError> {
        if is_root_config {
            root.node.update_parent("", "");
            if !self.repo.config_exists(&root.node.get_config_path()) {
                return Err(self.not_found(&root.node, parent_path));
            }
        }
        // update_package_header
        if !root.node.is_missing() && root.node.get_name().is_some() {
            if let Some(loaded) = self.repo.load(&root.node.get_config_path())? {
                if root.node.package_header.is_none() {
                    root.node
                        .set_package_header(loaded.package_header.as_deref());
                }
            }
        }
        if self.overrides.is_deleted(&root.node) {
            self.overrides.mark_deleted(&mut root.node);
            return Ok(root);
        }
        self.overrides.set_known_choice(&root.node)?;
        if root.node.get_name().is_none() {
            return Ok(root);
        }
        if self.check_not_missing(&root.node)? {
            return Ok(root);
        }
        let path = root.node.get_config_path();
        let loaded = match self.repo.load(&path)? {
            Some(l) => l,
            None => {
                // Hydra drops a missing optional config, also one the command line named; so do we, and
                // a named one gets a warning with the group's options (a typo must not vanish unseen).
                if root.node.optional {
                    if root.node.overridden {
                        self.dropped_options.push(path.clone());
                    }
                    root.node.deleted = true;
                    return Ok(root);
                }
                return Err(self.not_found(&root.node, parent_path));
            }
        };
        if self.expanding.contains(&path) {
            let chain: Vec<&str> = self.expanding.iter().map(String::as_str).collect();
            return Err(ConfigError::composition(format!(
                "Defaults List cycle: '{path}' includes itself ({} -> {path}); remove the entry that \
                 names it again from its defaults list",
                chain.join(" -> ")
            )));
        }
        self.expanding.push(path.clone());
        let mut defaults_list = loaded.defaults.clone();
        let mut self_added = false;
        if !defaults_list.is_empty() || (is_root_config && !self.overrides.appends.is_empty()) {
            self_added = validate_self(&root.node, &mut defaults_list)?;
        }
        if is_root_config {
            defaults_list.extend(self.overrides.appends.iter().cloned());
        }
        self.update_overrides(&mut defaults_list, &root.node, interpolated_subtree)?;

        let parent_group = root.node.get_group_path();
        let parent_package = root.node.get_final_package(true);
        let mut children: Vec<Child> = Vec::new();
        for i in (0..defaults_list.len()).rev() {
            if defaults_list[i].is_self() {
                let d = &mut defaults_list[i];
                d.update_parent(
                    root.node.parent_base_dir.as_deref().unwrap_or(""),
                    root.node.get_package(true).as_deref().unwrap_or(""),
                );
                children.push(Child::Leaf(d.clone()));
                continue;
            }
            if defaults_list[i].is_override() {
                continue;
            }
            defaults_list[i].update_parent(&parent_group, &parent_package);
            if self.overrides.is_overridden(&defaults_list[i]) {
                self.overrides
                    .override_default_option(&mut defaults_list[i]);
            }
            let d = defaults_list[i].clone();
            if let Some(options) = d.options() {
                for item in options.iter().rev() {
                    if item.contains("${") {
                        return Err(ConfigError::composition(format!(
                            "In '{path}': Defaults List interpolation is not supported in options list items"
                        )));
                    }
                    let Entry::Group { group, .. } = &d.entry else {
                        unreachable!()
                    };
                    let mut node = InputDefault::config(
                        &format!("{group}/{item}"),
                        d.package.clone(),
                        d.source.clone(),
                    );
                    node.optional = d.optional;
                    node.overridden = d.overridden;
                    node.update_parent(&parent_group, &parent_package);
                    // Hydra drops a missing member of an optional multi-select, also one the command
                    // line named; the caller is told which (a typo must not vanish unseen).
                    if node.optional
                        && node.overridden
                        && !self.repo.config_exists(&node.get_config_path())
                    {
                        self.dropped_options.push(node.get_config_path());
                        continue;
                    }
                    self.add_child(&mut children, node, interpolated_subtree, &path)?;
                }
            } else if d.is_interpolation() {
                children.push(Child::Leaf(d));
            } else {
                self.add_child(&mut children, d, interpolated_subtree, &path)?;
            }
        }

        // Deferred interpolations (`db: ${other_group}`) resolve against the choices made so far.
        let known = self.interpolation_map(&defaults_list, self_added);
        for child in children.iter_mut() {
            let Child::Leaf(d) = child else { continue };
            if !d.is_interpolation() {
                continue;
            }
            let mut d = d.clone();
            resolve_default_interpolation(&mut d, &known)?;
            d.update_parent(&parent_group, &parent_package);
            let subtree = self.create_tree(
                TreeNode {
                    node: d.clone(),
                    children: None,
                },
                false,
                true,
                Some(&path),
            )?;
            *child = if subtree.children.is_some() {
                Child::Tree(subtree)
            } else {
                Child::Leaf(subtree.node)
            };
        }
        if !children.is_empty() {
            children.reverse();
            root.children = Some(children);
        }
        self.expanding.pop();
        Ok(root)
    }

    pub(super) fn add_child(
        &mut self,
        children: &mut Vec<Child>,
        node: InputDefault,
        interpolated_subtree: bool,
        parent_path: &str,
    ) -> Result<(), ConfigError> {
        let subtree = self.create_tree(
            TreeNode {
                node,
                children: None,
            },
            false,
            interpolated_subtree,
            Some(parent_path),
        )?;
        children.push(if subtree.children.is_some() {
            Child::Tree(subtree)
        } else {
            Child::Leaf(subtree.node)
        });
        Ok(())
    }

    pub(super) fn update_overrides(
        &mut self,
        defaults_list: &mut [InputDefault],
        parent: &InputDefault,
        interpolated_subtree: bool,
    ) -> Result<(), ConfigError> {
        let mut last_override: Option<InputDefault> = None;
        let parent_group = parent.get_group_path();
        let parent_package = parent.get_final_package(true);
        let parent_path = parent.get_config_path();
        for d in defaults_list.iter_mut() {
            if d.is_self() {
                continue;
            }
            d.update_parent(&parent_group, &parent_package);
            if let Some(last) = &last_override {
                if !(d.is_override() || d.is_external_append()) {
                    return Err(ConfigError::composition(format!(
                        "In {parent_path}: Override '{} : {}' is defined before '{}: {}'.\n\
                         Overrides must be at the end of the defaults list{}",
                        last.get_override_key(),
                        last.get_name().unwrap_or_else(|| "None".into()),
                        d.get_override_key(),
                        d.get_name().unwrap_or_else(|| "None".into()),
                        at(&d.source)
                    )));
                }
            }
            if d.is_override() {
                last_override = Some(d.clone());
                if interpolated_subtree {
                    return Err(ConfigError::composition(format!(
                        "{parent_path}: Default List Overrides are not allowed in the subtree\n\
                         of an in interpolated config group (override {}={}).",
                        d.get_override_key(),
                        d.get_name().unwrap_or_default()
                    )));
                }
                self.overrides.add_override(&parent_path, d);
            }
        }
        Ok(())
    }

    /// `???` option: an error naming the group and its options, or skipped while sweeping.
    pub(super) fn check_not_missing(&self, d: &InputDefault) -> Result<bool, ConfigError> {
        if !d.get_config_path().ends_with("???") {
            return Ok(false);
        }
        if self.skip_missing {
            return Ok(true);
        }
        let key = d.get_override_key();
        let options = self.repo.group_options(&d.get_group_path());
        let list: Vec<String> = options.iter().map(|o| format!("\t{o}")).collect();
        Err(ConfigError::composition(format!(
            "You must specify '{key}', e.g, {key}=<OPTION>\nAvailable options:\n{}{}",
            list.join("\n"),
            at(&d.source)
        )))
    }

    pub(super) fn interpolation_map(
        &self,
        defaults_list: &[InputDefault],
        self_added: bool,
    ) -> HashMap<String, String> {
        let mut map: HashMap<String, String> = self
            .overrides
            .known_choices
            .iter()
            .filter_map(|(k, v)| v.clone().map(|v| (k.clone(), v)))
            .collect();
        for d in defaults_list {
            if self_added && d.is_self() {
                continue;
            }
            if let Entry::Group {
                value: GroupValue::Name(Some(n)),
                ..
            } = &d.entry
            {
                map.entry(d.get_override_key()).or_insert_with(|| n.clone());
            }
        }
        map
    }

    pub(super) fn not_found(&self, d: &InputDefault, parent_path: Option<&str>) -> ConfigError {
        let mut msg = if d.primary {
            format!(
                "Cannot find primary config '{}'. Check that it's in your config search path.\n",
                d.get_config_path()
            )
        } else if d.is_group() {
            let group = d.get_group_path();
            let options = self.repo.group_options(&group);
            let mut m = format!("Could not find '{}'\n", d.get_config_path());
            if !options.is_empty() {
                let list: Vec<String> = options.iter().map(|o| format!("\t{o}")).collect();
                m.push_str(&format!(
                    "\nAvailable options in '{group}':\n{}",
                    list.join("\n")
                ));
                if let Some(name) = d.get_name() {
                    if let Some(s) = crate::config::errors::did_you_mean(
                        &name,
                        options.iter().map(String::as_str),
                    ) {
                        m.push_str(&format!("\nDid you mean '{s}'?"));
                    }
                }
            }
            m
        } else {
            format!("Could not load '{}'.\n", d.get_config_path())
        };
        if !d.primary {
            if let Some(parent) = parent_path {
                msg = format!("In '{parent}': {msg}");
            }
        }
        msg.push_str(&format!("\nConfig search path:\n{}", self.repo.describe()));
        msg.push_str(&at(&d.source));
        ConfigError::MissingConfig(msg)
    }
}

pub(super) fn validate_self(
    containing: &InputDefault,
    defaults: &mut Vec<InputDefault>,
) -> Result<bool, ConfigError> {
    let mut has_self = false;
    let mut has_non_override = false;
    for d in defaults.iter() {
        if !d.is_override() {
            has_non_override = true;
        }
        if d.is_self() {
            if has_self {
                return Err(ConfigError::composition(format!(
                    "Duplicate _self_ defined in {}{}",
                    containing.get_config_path(),
                    at(&d.source)
                )));
            }
            has_self = true;
        }
    }
    if (!has_self && has_non_override) || defaults.is_empty() {
        defaults.push(InputDefault::config("_self_", None, Source::Internal));
    }
    Ok(!has_self)
}

/// `${group}` in an option name, resolved against the choices already made (Hydra resolves it with
/// OmegaConf, so resolvers work too: `${oc.decode:file1}`).
pub(super) fn resolve_default_interpolation(
    d: &mut InputDefault,
    known: &HashMap<String, String>,
) -> Result<(), ConfigError> {
    use crate::config::interpolate::{resolve_path, ResolveContext};
    use crate::config::tree::{Node, Value};
    let text = match &d.entry {
        Entry::Config { .. } => d.get_config_path(),
        _ => d.get_name().unwrap_or_default(),
    };
    let legacy = text
        .strip_prefix("${defaults.")
        .and_then(|rest| {
            rest.chars()
                .next()
                .filter(char::is_ascii_digit)
                .map(|_| &rest[1..])
        })
        .is_some_and(|rest| rest.starts_with('.'));
    if legacy {
        return Err(ConfigError::composition(format!(
            "Defaults list element '{}={text}' is using a deprecated interpolation form.\n\
             See http://hydra.cc/docs/1.1/upgrades/1.0_to_1.1/defaults_list_interpolation for migration \
             information.{}",
            d.get_override_key(),
            at(&d.source)
        )));
    }
    let mut root = Node::empty_map();
    if let Some(m) = root.as_map_mut() {
        for (k, v) in known {
            m.insert(
                k.clone(),
                Node::new(Value::Str(v.clone()), Source::Internal),
            );
        }
        m.insert(
            "_dummy_".into(),
            Node::new(Value::Str(text.clone()), d.source.clone()),
        );
    }
    let out = match resolve_path(&root, "_dummy_", &ResolveContext::from_process()) {
        Ok(Node {
            value: Value::Str(s),
            ..
        }) => s,
        Ok(other) => other.value.display_python(),
        Err(ConfigError::Interpolation(m)) if m.contains("not found") => {
            let mut options: Vec<&String> = known.keys().collect();
            options.sort();
            let msg = if options.is_empty() {
                format!("Error resolving interpolation '{text}'")
            } else {
                format!(
                    "Error resolving interpolation '{text}', possible interpolation keys: {}",
                    options
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            return Err(ConfigError::composition(format!("{msg}{}", at(&d.source))));
        }
        Err(e) => return Err(e),
    };
    match &mut d.entry {
        Entry::Config { path } => *path = out,
        Entry::Group { value, .. } => *value = GroupValue::Name(Some(out)),
    }
    Ok(())
}

pub(super) fn result_default(
    tree: Option<&TreeNode>,
    node: &InputDefault,
) -> Option<ResultDefault> {
    node.get_name()?;
    if node.is_self() {
        let tree = tree?;
        return Some(ResultDefault {
            config_path: tree.node.get_config_path(),
            parent: None,
            package: tree.node.get_final_package(true),
            is_self: true,
            primary: tree.node.primary,
            override_key: None,
        });
    }
    Some(ResultDefault {
        config_path: node.get_config_path(),
        parent: tree.map(|t| t.node.get_config_path()),
        package: node.get_final_package(true),
        is_self: false,
        primary: node.primary,
        override_key: node.is_group().then(|| node.get_override_key()),
    })
}
