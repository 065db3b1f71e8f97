//! The defaults list: which config files make up the composed config, in which order, under which package.
//! A faithful port of Hydra 1.3's `defaults_list.py`: the list is resolved into a tree (overrides from the
//! command line first, `override` entries of nested configs next), then flattened depth-first.

use super::errors::{at, ConfigError};
use super::repository::Repository;
use super::tree::{Node, Source, Value};
use indexmap::IndexMap;
use std::collections::{BTreeSet, HashMap};

/// The option chosen for a group: one name (or none, `null`) or several (`db: [mysql, sqlite]`).
#[derive(Debug, Clone, PartialEq)]
pub enum GroupValue {
    Name(Option<String>),
    Options(Vec<String>),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// A plain config path, `- name` or `- /group/name` (or `_self_`).
    Config { path: String },
    /// `- group: option`, possibly `override`, or appended from the command line with `+group=option`.
    Group {
        group: String,
        value: GroupValue,
        is_override: bool,
        external_append: bool,
    },
}

/// One entry of a defaults list, with what the tree walk learns about it.
#[derive(Debug, Clone, PartialEq)]
pub struct InputDefault {
    pub entry: Entry,
    pub package: Option<String>,
    pub parent_base_dir: Option<String>,
    pub parent_package: Option<String>,
    pub package_header: Option<String>,
    pub primary: bool,
    pub optional: bool,
    pub deleted: bool,
    /// The option was chosen on the command line (or by an `override` entry), not by this entry itself.
    pub overridden: bool,
    pub source: Source,
}

impl InputDefault {
    pub fn config(path: &str, package: Option<String>, source: Source) -> Self {
        let package = package.map(|p| if p == "_here_" { String::new() } else { p });
        InputDefault {
            entry: Entry::Config {
                path: path.to_string(),
            },
            package,
            parent_base_dir: None,
            parent_package: None,
            package_header: None,
            primary: false,
            optional: false,
            deleted: false,
            overridden: false,
            source,
        }
    }

    pub fn group(group: &str, value: GroupValue, package: Option<String>, source: Source) -> Self {
        let mut d = InputDefault::config("", package, source);
        d.entry = Entry::Group {
            group: group.to_string(),
            value,
            is_override: false,
            external_append: false,
        };
        d
    }

    pub fn is_self(&self) -> bool {
        match &self.entry {
            Entry::Config { path } => path == "_self_",
            Entry::Group { value, .. } => *value == GroupValue::Name(Some("_self_".into())),
        }
    }
    pub fn is_override(&self) -> bool {
        matches!(
            self.entry,
            Entry::Group {
                is_override: true,
                ..
            }
        )
    }
    pub fn is_external_append(&self) -> bool {
        matches!(
            self.entry,
            Entry::Group {
                external_append: true,
                ..
            }
        )
    }
    pub fn is_group(&self) -> bool {
        matches!(self.entry, Entry::Group { .. })
    }

    pub fn get_name(&self) -> Option<String> {
        match &self.entry {
            Entry::Config { path } => Some(path.rsplit('/').next().unwrap_or(path).to_string()),
            Entry::Group {
                value: GroupValue::Name(n),
                ..
            } => n.clone(),
            Entry::Group { .. } => None,
        }
    }

    fn options(&self) -> Option<&Vec<String>> {
        match &self.entry {
            Entry::Group {
                value: GroupValue::Options(o),
                ..
            } => Some(o),
            _ => None,
        }
    }

    pub fn is_missing(&self) -> bool {
        self.get_name().as_deref() == Some("???")
    }

    pub fn is_interpolation(&self) -> bool {
        match &self.entry {
            Entry::Config { .. } => self.get_config_path().contains("${"),
            Entry::Group {
                value: GroupValue::Name(Some(n)),
                ..
            } => n.contains("${"),
            Entry::Group { .. } => false,
        }
    }

    pub fn get_group_path(&self) -> String {
        let base = self.parent_base_dir.clone().unwrap_or_default();
        match &self.entry {
            Entry::Config { path } => {
                let (path, absolute) = match path.strip_prefix('/') {
                    Some(p) => (p, true),
                    None => (path.as_str(), false),
                };
                let group = path.rfind('/').map(|i| &path[..i]).unwrap_or("");
                if absolute || base.is_empty() {
                    group.to_string()
                } else if group.is_empty() {
                    base
                } else {
                    format!("{base}/{group}")
                }
            }
            Entry::Group { group, .. } => match group.strip_prefix('/') {
                Some(g) => g.to_string(),
                None if base.is_empty() => group.clone(),
                None => format!("{base}/{group}"),
            },
        }
    }

    pub fn get_config_path(&self) -> String {
        match &self.entry {
            Entry::Config { path } => {
                let base = self.parent_base_dir.clone().unwrap_or_default();
                match path.strip_prefix('/') {
                    Some(p) => p.to_string(),
                    None if base.is_empty() => path.clone(),
                    None => format!("{base}/{path}"),
                }
            }
            Entry::Group { .. } => {
                format!(
                    "{}/{}",
                    self.get_group_path(),
                    self.get_name().unwrap_or_else(|| "None".into())
                )
            }
        }
    }

    fn relative_group_path(&self) -> String {
        match &self.entry {
            Entry::Config { path } => {
                let path = path.strip_prefix('/').unwrap_or(path);
                path.rfind('/')
                    .map(|i| path[..i].to_string())
                    .unwrap_or_default()
            }
            Entry::Group { group, .. } => group.strip_prefix('/').unwrap_or(group).to_string(),
        }
    }

    pub fn get_default_package(&self) -> String {
        self.get_group_path().replace('/', ".")
    }

    pub fn get_package(&self, default_to_header: bool) -> Option<String> {
        if self.package.is_none() && default_to_header {
            self.package_header.clone()
        } else {
            self.package.clone()
        }
    }

    pub fn get_final_package(&self, default_to_header: bool) -> String {
        let parent = self.parent_package.clone().unwrap_or_default();
        let package = self
            .get_package(default_to_header)
            .unwrap_or_else(|| self.relative_group_path().replace('/', "."));
        let joined = if parent.is_empty() {
            package
        } else if package.is_empty() {
            parent
        } else {
            format!("{parent}.{package}")
        };
        match joined.rfind("_global_") {
            None => joined,
            Some(i) => joined
                .get(i + "_global_".len() + 1..)
                .unwrap_or("")
                .to_string(),
        }
    }

    pub fn update_parent(&mut self, base_dir: &str, parent_package: &str) {
        self.parent_base_dir = Some(base_dir.to_string());
        self.parent_package = Some(parent_package.to_string());
        if let Some(pkg) = &self.package {
            if pkg.contains("_group_") {
                let resolved = pkg.replace("_group_", &self.get_default_package());
                self.package = Some(format!("_global_.{resolved}"));
            }
        }
    }

    /// Package headers are absolute: `# @package foo` means `_global_.foo`.
    pub fn set_package_header(&mut self, header: Option<&str>) {
        let Some(header) = header else { return };
        let header = if header == "_global_" || header.starts_with("_global_.") {
            header.to_string()
        } else if header.is_empty() {
            "_global_".to_string()
        } else {
            format!("_global_.{header}")
        };
        self.package_header = Some(header);
    }

    /// The key a command-line override uses for this entry: `group` or `group@package`.
    pub fn get_override_key(&self) -> String {
        let default_pkg = self.get_default_package();
        let mut final_pkg = self.get_final_package(false);
        let key = self.get_group_path();
        if default_pkg != final_pkg {
            if final_pkg.is_empty() {
                final_pkg = "_global_".into();
            }
            format!("{key}@{final_pkg}")
        } else {
            key
        }
    }

    fn get_relative_override_key(&self) -> String {
        let Entry::Group { group, .. } = &self.entry else {
            return String::new();
        };
        let default_pkg = self.get_default_package();
        match &self.package {
            Some(p) if Some(default_pkg) != self.get_package(true) => format!("{group}@{p}"),
            _ => group.clone(),
        }
    }

    fn set_value(&mut self, new: GroupValue) {
        if let Entry::Group { value, .. } = &mut self.entry {
            *value = new;
        }
    }

    /// How the entry reads in a defaults list (for `--info defaults-tree` and messages).
    pub fn describe(&self) -> String {
        match &self.entry {
            Entry::Config { .. } => self.get_config_path(),
            Entry::Group {
                value: GroupValue::Options(o),
                ..
            } => {
                format!("{}: [{}]", self.get_override_key(), o.join(", "))
            }
            Entry::Group { .. } => format!(
                "{}: {}",
                self.get_override_key(),
                self.get_name().unwrap_or_else(|| "null".into())
            ),
        }
    }
}

/// Read a `defaults:` node into entries, with Hydra's validation.
pub fn parse_defaults_list(
    config_path: &str,
    node: &Node,
) -> Result<Vec<InputDefault>, ConfigError> {
    let items = match &node.value {
        Value::List(items) => items,
        other => {
            let kind = match other {
                Value::Map(_) => "mapping",
                v => v.type_name(),
            };
            return Err(ConfigError::composition(format!(
                "Invalid defaults list in '{config_path}', defaults must be a list (got {kind}){}",
                at(&node.source)
            )));
        }
    };
    let mut out = Vec::new();
    for item in items {
        let default = match &item.value {
            Value::Map(map) => {
                if map.len() > 1 {
                    return Err(ConfigError::composition(format!(
                        "In {config_path}: Too many keys in default item {}{}",
                        item.value.display_python(),
                        at(&item.source)
                    )));
                }
                let Some((key, value)) = map.iter().next() else {
                    return Err(ConfigError::composition(format!(
                        "In {config_path}: Missing group name in {{}}{}",
                        at(&item.source)
                    )));
                };
                let (group_with_keywords, package) = split_group(key);
                let mut words: Vec<&str> = group_with_keywords.split(' ').collect();
                let group = words.pop().unwrap_or_default();
                let mut optional = false;
                let mut is_override = false;
                for w in words {
                    match w {
                        "optional" => optional = true,
                        "override" => is_override = true,
                        _ => break,
                    }
                }
                let group_value = match &value.value {
                    Value::Null => GroupValue::Name(None),
                    Value::Str(s) => GroupValue::Name(Some(s.clone())),
                    Value::Missing => GroupValue::Name(Some("???".into())),
                    Value::List(list) => {
                        let mut names = Vec::new();
                        for v in list {
                            match &v.value {
                                Value::Str(s) => names.push(s.clone()),
                                other => {
                                    return Err(ConfigError::composition(format!(
                                        "Unsupported item value in defaults : {}, nested list items must be strings{}",
                                        python_type(other),
                                        at(&v.source)
                                    )))
                                }
                            }
                        }
                        GroupValue::Options(names)
                    }
                    other => {
                        return Err(ConfigError::composition(format!(
                            "Unsupported item value in defaults : {}. Supported: string or list{}",
                            python_type(other),
                            at(&value.source)
                        )))
                    }
                };
                check_option_names(config_path, &group_value, &value.source)?;
                let mut d = InputDefault::group(group, group_value, package, item.source.clone());
                d.optional = optional;
                if let Entry::Group { is_override: o, .. } = &mut d.entry {
                    *o = is_override;
                }
                d
            }
            Value::Str(s) => {
                let (path, package) = split_group(s);
                if path.split('/').any(|part| part == "..") {
                    check_option_names(
                        config_path,
                        &GroupValue::Name(Some(path.to_string())),
                        &item.source,
                    )?;
                }
                InputDefault::config(path, package, item.source.clone())
            }
            other => {
                return Err(ConfigError::composition(format!(
                    "Unsupported type in defaults : {}{}",
                    python_type(other),
                    at(&item.source)
                )))
            }
        };
        out.push(default);
    }
    Ok(out)
}

/// `..` or a leading `/` would let an option name reach outside its group folder; refuse both.
pub fn check_option_names(
    config_path: &str,
    value: &GroupValue,
    source: &Source,
) -> Result<(), ConfigError> {
    let names: Vec<&String> = match value {
        GroupValue::Name(Some(n)) => vec![n],
        GroupValue::Name(None) => vec![],
        GroupValue::Options(o) => o.iter().collect(),
    };
    for name in names {
        let problem = if name.split('/').any(|part| part == "..") {
            Some("'..' is not allowed in config names")
        } else if name.starts_with('/') || name.contains(":\\") {
            Some("an absolute file path is not a config name")
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(ConfigError::composition(format!(
                "In '{config_path}': invalid option '{name}': {problem}; name an option of the group \
                 (a file in its folder, without .yaml){}",
                at(source)
            )));
        }
    }
    Ok(())
}

fn python_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Int(_) => "int",
        Value::Float(_) => "float",
        Value::Str(_) | Value::Missing => "str",
        Value::List(_) => "ListConfig",
        Value::Map(_) => "DictConfig",
    }
}

/// `group@package` (a `:rename` suffix, legacy, is dropped).
pub fn split_group(text: &str) -> (&str, Option<String>) {
    match text.find('@') {
        None => (text, None),
        Some(i) => {
            let package = &text[i + 1..];
            let package = package.split(':').next().unwrap_or(package);
            (&text[..i], Some(package.to_string()))
        }
    }
}

/// A group choice that came from the command line (or an `override` entry), before it is used.
#[derive(Debug, Clone)]
struct OverrideMeta {
    external: bool,
    source: Source,
    containing_config_path: Option<String>,
    used: bool,
}

#[derive(Debug, Clone)]
struct Deletion {
    name: Option<String>,
    used: bool,
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

    fn add_override(&mut self, parent_config_path: &str, d: &InputDefault) {
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

    fn is_overridden(&self, d: &InputDefault) -> bool {
        d.is_group() && self.choices.contains_key(&d.get_override_key())
    }

    fn override_default_option(&mut self, d: &mut InputDefault) {
        let key = d.get_override_key();
        if let Some(value) = self.choices.get(&key) {
            d.set_value(value.clone());
            d.overridden = true;
            if let Some(meta) = self.meta.get_mut(&key) {
                meta.used = true;
                d.source = meta.source.clone();
            }
        }
    }

    fn ensure_overrides_used(&self) -> Result<(), ConfigError> {
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

    fn ensure_deletions_used(&self) -> Result<(), ConfigError> {
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

    fn set_known_choice(&mut self, d: &InputDefault) -> Result<(), ConfigError> {
        if !d.is_group() {
            return Ok(());
        }
        let key = d.get_override_key();
        let name = d.get_name();
        match self.known_choices.get(&key) {
            None => {
                self.known_choices.insert(key.clone(), name);
            }
            Some(prev) if *prev != name => {
                return Err(ConfigError::composition(format!(
                    "Multiple values for {key}. To override a value use 'override {key}: {}'{}",
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

    fn is_deleted(&self, d: &InputDefault) -> bool {
        if !d.is_group() {
            return false;
        }
        match self.deletions.get(&d.get_override_key()) {
            None => false,
            Some(Deletion { name: None, .. }) => true,
            Some(Deletion { name: Some(n), .. }) => Some(n.clone()) == d.get_name(),
        }
    }

    fn mark_deleted(&mut self, d: &mut InputDefault) {
        d.deleted = true;
        if let Some(del) = self.deletions.get_mut(&d.get_override_key()) {
            del.used = true;
        }
    }
}

/// A node of the defaults tree: an entry and, when it is a config with its own defaults list, its children.
#[derive(Debug, Clone)]
pub struct TreeNode {
    pub node: InputDefault,
    pub children: Option<Vec<Child>>,
}

#[derive(Debug, Clone)]
pub enum Child {
    Leaf(InputDefault),
    Tree(TreeNode),
}

/// One config to merge, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultDefault {
    pub config_path: String,
    pub parent: Option<String>,
    pub package: String,
    pub is_self: bool,
    pub primary: bool,
    pub override_key: Option<String>,
}

/// The flattened defaults list and the tree it came from.
#[derive(Debug)]
pub struct DefaultsList {
    pub defaults: Vec<ResultDefault>,
    pub tree: TreeNode,
    pub known_choices: IndexMap<String, Option<String>>,
}

/// Build the defaults list of `config_name` under the group overrides (Hydra's `create_defaults_list`).
pub fn create_defaults_list(
    repo: &Repository,
    config_name: &str,
    mut overrides: GroupOverrides,
    skip_missing: bool,
) -> Result<DefaultsList, ConfigError> {
    let mut primary = InputDefault::config(config_name, None, Source::Internal);
    primary.primary = true;
    let root = TreeNode {
        node: primary,
        children: None,
    };
    let mut walker = Walker {
        repo,
        overrides: &mut overrides,
        skip_missing,
    };
    let tree = walker.create_tree(root, true, false, None)?;
    let mut defaults = Vec::new();
    tree_to_list(&tree, None, &mut defaults);
    ensure_no_duplicates(&defaults)?;
    overrides.ensure_overrides_used()?;
    overrides.ensure_deletions_used()?;
    Ok(DefaultsList {
        defaults,
        tree,
        known_choices: overrides.known_choices,
    })
}

struct Walker<'a> {
    repo: &'a Repository,
    overrides: &'a mut GroupOverrides,
    skip_missing: bool,
}

impl Walker<'_> {
    fn create_tree(
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
                // Hydra drops a missing optional config silently; we do too, unless the user asked for that
                // option by name: a typo on the command line must not vanish.
                if root.node.optional && !root.node.overridden {
                    root.node.deleted = true;
                    return Ok(root);
                }
                return Err(self.not_found(&root.node, parent_path));
            }
        };
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
                    node.update_parent(&parent_group, &parent_package);
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
        Ok(root)
    }

    fn add_child(
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

    fn update_overrides(
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
    fn check_not_missing(&self, d: &InputDefault) -> Result<bool, ConfigError> {
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

    fn interpolation_map(
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

    fn not_found(&self, d: &InputDefault, parent_path: Option<&str>) -> ConfigError {
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
                    if let Some(s) =
                        super::errors::did_you_mean(&name, options.iter().map(String::as_str))
                    {
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

fn validate_self(
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

/// `${group}` in an option name, looked up among the choices already made.
fn resolve_default_interpolation(
    d: &mut InputDefault,
    known: &HashMap<String, String>,
) -> Result<(), ConfigError> {
    let text = match &d.entry {
        Entry::Config { .. } => d.get_config_path(),
        _ => d.get_name().unwrap_or_default(),
    };
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else {
            break;
        };
        let key = rest[start + 2..start + end].trim();
        match known.get(key) {
            Some(v) => out.push_str(v),
            None => {
                let mut options: Vec<&String> = known.keys().collect();
                options.sort();
                let msg =
                    if options.is_empty() {
                        format!("Error resolving interpolation '{text}'")
                    } else {
                        format!(
                        "Error resolving interpolation '{text}', possible interpolation keys: {}",
                        options.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                    )
                    };
                return Err(ConfigError::composition(format!("{msg}{}", at(&d.source))));
            }
        }
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    match &mut d.entry {
        Entry::Config { path } => *path = out,
        Entry::Group { value, .. } => *value = GroupValue::Name(Some(out)),
    }
    Ok(())
}

fn result_default(tree: Option<&TreeNode>, node: &InputDefault) -> Option<ResultDefault> {
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

fn tree_to_list(tree: &TreeNode, parent: Option<&TreeNode>, out: &mut Vec<ResultDefault>) {
    fn visit(owner: Option<&TreeNode>, node: &InputDefault, out: &mut Vec<ResultDefault>) {
        if node.deleted || node.is_missing() {
            return;
        }
        if let Some(rd) = result_default(owner, node) {
            out.push(rd);
        }
    }
    match &tree.children {
        None => visit(parent, &tree.node, out),
        Some(children) if children.is_empty() => visit(parent, &tree.node, out),
        Some(children) => {
            for child in children {
                match child {
                    Child::Leaf(d) => visit(Some(tree), d, out),
                    Child::Tree(t) => tree_to_list(t, Some(tree), out),
                }
            }
        }
    }
}

fn ensure_no_duplicates(list: &[ResultDefault]) -> Result<(), ConfigError> {
    let mut seen = BTreeSet::new();
    for item in list.iter().filter(|i| !i.is_self) {
        if let Some(key) = &item.override_key {
            if !seen.insert(key.clone()) {
                return Err(ConfigError::composition(format!(
                    "{key} appears more than once in the final defaults list"
                )));
            }
        }
    }
    Ok(())
}

/// Render the tree the way `--info defaults-tree` shows it.
pub fn render_tree(tree: &TreeNode) -> String {
    fn go(node: &TreeNode, depth: usize, out: &mut String) {
        out.push_str(&format!("{}{}\n", "  ".repeat(depth), label(&node.node)));
        for child in node.children.iter().flatten() {
            match child {
                Child::Leaf(d) => {
                    out.push_str(&format!("{}{}\n", "  ".repeat(depth + 1), label(d)))
                }
                Child::Tree(t) => go(t, depth + 1, out),
            }
        }
    }
    fn label(d: &InputDefault) -> String {
        let mut s = if d.is_self() {
            "_self_".to_string()
        } else {
            d.describe()
        };
        if d.deleted {
            s.push_str(" (deleted)");
        }
        if d.optional {
            s = format!("optional {s}");
        }
        s
    }
    let mut out = String::new();
    go(tree, 0, &mut out);
    out
}
