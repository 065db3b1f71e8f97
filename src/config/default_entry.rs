//! The entries of a defaults list (Hydra's `core/default_element.py`): a group choice or a config path,
//! with its package, optional/override flags and where it was written; parsing a config's `defaults:`
//! into them, and the checks Hydra makes on option names.

use crate::config::errors::{at, ConfigError};
use crate::config::tree::{Node, Source, Value};

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

    pub(super) fn options(&self) -> Option<&Vec<String>> {
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

    pub(super) fn relative_group_path(&self) -> String {
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

    pub(super) fn get_relative_override_key(&self) -> String {
        let Entry::Group { group, .. } = &self.entry else {
            return String::new();
        };
        let default_pkg = self.get_default_package();
        match &self.package {
            Some(p) if Some(default_pkg) != self.get_package(true) => format!("{group}@{p}"),
            _ => group.clone(),
        }
    }

    pub(super) fn set_value(&mut self, new: GroupValue) {
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
                if path == "_self_" && package.is_some() {
                    return Err(ConfigError::composition(format!(
                        "_self_@PACKAGE is not supported: in '{config_path}', `{s}` (_self_ always merges \
                         at the config's own package; set the package in the config's header instead){}",
                        at(&item.source)
                    )));
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

pub(super) fn python_type(v: &Value) -> &'static str {
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
