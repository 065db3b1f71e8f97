//! Where configs live: an ordered search path of directories, each mounted at a group prefix
//! (`conf/` at the root, `experiments/` as the `experiment` group), with Hydra's own groups (`hydra/...`,
//! built in) before and after them as Hydra orders its search path. Loads each config once.

use super::conf_files::ConfFiles;
use super::default_entry::{parse_defaults_list, InputDefault};
use super::errors::ConfigError;
use super::hydra::builtin::{BuiltinConfig, BUILTIN};
use super::tree::{Node, Value};
use super::yaml;
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// One directory of the search path.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchRoot {
    pub dir: PathBuf,
    /// Group prefix this directory provides (`""` for a config dir, `experiment` for `experiments/`).
    pub mount: String,
    /// Who added it (`main`, `command-line`, `project`), shown by `--info searchpath`.
    pub provider: String,
}

/// A config file, loaded: its body (without `defaults`), its defaults list and package header.
#[derive(Debug)]
pub struct LoadedConfig {
    pub config_path: String,
    pub file: PathBuf,
    pub body: Node,
    pub defaults: Vec<InputDefault>,
    pub package_header: Option<String>,
    /// True when the body holds keys other than `defaults` that are not `???` (Hydra's `_has_config_content`).
    pub has_content: bool,
}

#[derive(Debug, Default)]
pub struct Repository {
    pub roots: Vec<SearchRoot>,
    /// Configs a package puts on the search path after the user's directories, as a Hydra plugin's
    /// search-path entry does (trainyard's shipped groups, `pkg://trainyard.conf`).
    packages: Vec<&'static [BuiltinConfig]>,
    /// Where the roots' directories are read from: the disk, or memory (the defaults-list fuzzer).
    files: Rc<ConfFiles>,
    cache: RefCell<HashMap<String, Option<Rc<LoadedConfig>>>>,
}

/// Who provides a group's option (`--help` marks the user's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionOrigin {
    /// A file in one of the user's directories, with no built-in of the same name.
    User,
    /// A file in the user's directories in place of a built-in of the same name whose text differs.
    UserShadowing,
    /// Built in (Hydra's own, a plugin's or a package's); a user's file with the same text counts as it.
    Builtin,
}

impl Repository {
    /// The user's directories with Hydra's own configs around them (no package).
    pub fn new(roots: Vec<SearchRoot>) -> Self {
        Repository {
            roots,
            packages: Vec::new(),
            files: Rc::default(),
            cache: RefCell::default(),
        }
    }

    /// The user's directories read from `files` (paths under the roots' `dir`s) instead of the disk.
    pub fn in_memory(roots: Vec<SearchRoot>, files: ConfFiles) -> Self {
        Repository {
            files: Rc::new(files),
            ..Repository::new(roots)
        }
    }

    /// This search path with a package's configs after the user's directories.
    pub fn with_package(mut self, configs: &'static [BuiltinConfig]) -> Self {
        self.packages.push(configs);
        self
    }

    /// The same search path (packages included) with more user directories after these.
    pub fn extended(&self, more: Vec<SearchRoot>) -> Repository {
        let mut roots = self.roots.clone();
        roots.extend(more);
        Repository {
            roots,
            packages: self.packages.clone(),
            files: self.files.clone(),
            cache: RefCell::default(),
        }
    }

    /// Built-in configs in search order: Hydra's own (before the user's), then the packages', then
    /// the plugins' and structured configs (after the user's).
    fn builtins(&self) -> impl Iterator<Item = &'static BuiltinConfig> + '_ {
        let hydra = BUILTIN.iter().filter(|b| b.source.before_user);
        let packages = self.packages.iter().flat_map(|p| p.iter());
        let plugins = BUILTIN.iter().filter(|b| !b.source.before_user);
        hydra.chain(packages).chain(plugins)
    }

    /// Built-in configs below `group` (at any depth).
    fn builtin_in_group<'a>(
        &'a self,
        group: &'a str,
    ) -> impl Iterator<Item = &'static BuiltinConfig> + 'a {
        self.builtins().filter(move |b| {
            b.config_path
                .strip_prefix(group)
                .is_some_and(|rest| rest.starts_with('/'))
        })
    }

    /// Directories that could hold `group` (a group path like `model` or `experiment`), in search order.
    /// A relative entry's `..` (`- ../default` in `db/mysql.yaml` is `db/../default`) steps up as a file
    /// path does, never above a search root.
    fn dirs_for(&self, group: &str) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let Some(group) = without_dot_dot(group) else {
            return out;
        };
        let group = group.as_str();
        for root in &self.roots {
            if root.mount.is_empty() {
                out.push(root.dir.join(group));
            } else if group == root.mount {
                out.push(root.dir.clone());
            } else if let Some(rest) = group.strip_prefix(&format!("{}/", root.mount)) {
                out.push(root.dir.join(rest));
            }
        }
        out
    }

    /// Where `config_path` lives: Hydra's own YAML first, then the user's directories (`db/mysql` →
    /// `<root>/db/mysql.yaml`), then plugin and structured configs; the first match wins.
    fn locate(&self, config_path: &str) -> Option<Located> {
        let path = config_path
            .strip_suffix(".yaml")
            .or_else(|| config_path.strip_suffix(".yml"))
            .unwrap_or(config_path);
        let builtin = |before_user: bool| {
            self.builtins()
                .find(|b| b.source.before_user == before_user && b.config_path == path)
                .map(Located::Builtin)
        };
        builtin(true)
            .or_else(|| self.find_file(config_path).map(Located::File))
            .or_else(|| builtin(false))
    }

    /// The file in the user's directories holding `config_path`, first match in the search path.
    pub fn find_file(&self, config_path: &str) -> Option<PathBuf> {
        let (group, name) = match config_path.rfind('/') {
            Some(i) => (&config_path[..i], &config_path[i + 1..]),
            None => ("", config_path),
        };
        let file_name = if name.ends_with(".yaml") || name.ends_with(".yml") {
            name.to_string()
        } else {
            format!("{name}.yaml")
        };
        self.dirs_for(group)
            .into_iter()
            .map(|d| d.join(&file_name))
            .find(|p| self.files.is_file(p))
    }

    pub fn config_exists(&self, config_path: &str) -> bool {
        self.locate(config_path).is_some()
    }

    pub fn group_exists(&self, group: &str) -> bool {
        !group.is_empty()
            && (self.builtin_in_group(group).next().is_some()
                || self.dirs_for(group).iter().any(|d| self.files.is_dir(d)))
    }

    /// Config names in a group, sorted and unique across the search path.
    pub fn group_options(&self, group: &str) -> Vec<String> {
        let mut names = BTreeSet::new();
        for b in self.builtin_in_group(group) {
            let name = &b.config_path[group.len() + 1..];
            if !name.contains('/') {
                names.insert(name.to_string());
            }
        }
        for dir in self.dirs_for(group) {
            for entry in self.files.entries(&dir) {
                if !entry.is_file {
                    continue;
                }
                let file = entry.name;
                if let Some(stem) = file
                    .strip_suffix(".yaml")
                    .or_else(|| file.strip_suffix(".yml"))
                {
                    names.insert(stem.to_string());
                }
            }
        }
        names.into_iter().collect()
    }

    /// `group_options` with who provides each: the user's file (shadowing a built-in or not) or a
    /// built-in.
    pub fn group_option_origins(&self, group: &str) -> Vec<(String, OptionOrigin)> {
        self.group_options(group)
            .into_iter()
            .map(|name| {
                let path = format!("{group}/{name}");
                let builtin = self
                    .builtins()
                    .find(|b| b.config_path == path && !b.source.before_user);
                let origin = match (self.find_file(&path), builtin) {
                    (None, _) => OptionOrigin::Builtin,
                    (Some(_), None) => OptionOrigin::User,
                    (Some(file), Some(b)) => {
                        let same = self.files.read(&file).is_ok_and(|t| t == b.text);
                        if same {
                            OptionOrigin::Builtin
                        } else {
                            OptionOrigin::UserShadowing
                        }
                    }
                };
                (name, origin)
            })
            .collect()
    }

    /// Sub-groups of `parent` (`""` for top-level groups), sorted and unique.
    pub fn list_groups(&self, parent: &str) -> Vec<String> {
        let mut names = BTreeSet::new();
        for b in self.builtins() {
            let rest = match parent {
                "" => Some(b.config_path),
                p => b
                    .config_path
                    .strip_prefix(p)
                    .and_then(|r| r.strip_prefix('/')),
            };
            if let Some((group, _)) = rest.and_then(|r| r.split_once('/')) {
                names.insert(group.to_string());
            }
        }
        for root in &self.roots {
            if parent.is_empty() && !root.mount.is_empty() {
                if self.files.is_dir(&root.dir) {
                    names.insert(root.mount.clone());
                }
                continue;
            }
        }
        for dir in self.dirs_for(parent) {
            for entry in self.files.entries(&dir) {
                let name = entry.name;
                if entry.is_dir && !name.starts_with('.') && !name.starts_with("__") {
                    names.insert(name);
                }
            }
        }
        names.into_iter().collect()
    }

    /// Load a config (cached). `Ok(None)` when no file exists for it.
    pub fn load(&self, config_path: &str) -> Result<Option<Rc<LoadedConfig>>, ConfigError> {
        if let Some(hit) = self.cache.borrow().get(config_path) {
            return Ok(hit.clone());
        }
        let loaded = match self.locate(config_path) {
            None => None,
            Some(Located::File(file)) => Some(Rc::new(load_file(config_path, &file, &self.files)?)),
            Some(Located::Builtin(b)) => Some(load_builtin(config_path, b)?),
        };
        self.cache
            .borrow_mut()
            .insert(config_path.to_string(), loaded.clone());
        Ok(loaded)
    }

    /// The search path in Hydra's order (its own configs, the user's, then plugins and structured
    /// configs), as `hydra.runtime.config_sources` lists it.
    pub fn sources(&self) -> Vec<ConfigSource> {
        let builtin = |before_user: bool| {
            let mut seen: Vec<ConfigSource> = Vec::new();
            for b in self
                .builtins()
                .filter(|b| b.source.before_user == before_user)
            {
                let (schema, path) = b.source.path.split_once("://").unwrap_or(("file", ""));
                let source = ConfigSource {
                    provider: b.source.provider.to_string(),
                    schema: schema.to_string(),
                    path: path.to_string(),
                    mount: String::new(),
                };
                if !seen.contains(&source) {
                    seen.push(source);
                }
            }
            seen
        };
        let users = self.roots.iter().map(|r| ConfigSource {
            provider: r.provider.clone(),
            schema: "file".into(),
            path: r.dir.display().to_string(),
            mount: r.mount.clone(),
        });
        builtin(true)
            .into_iter()
            .chain(users)
            .chain(builtin(false))
            .collect()
    }

    /// The search path, as `--info searchpath` and error messages print it.
    pub fn describe(&self) -> String {
        self.sources()
            .iter()
            .map(|s| {
                let mount = match s.mount.as_str() {
                    "" => String::new(),
                    m => format!(" (as group '{m}')"),
                };
                format!(
                    "\tprovider={}, path={}://{}{mount}",
                    s.provider, s.schema, s.path
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// One entry of the search path.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigSource {
    pub provider: String,
    /// `file`, `pkg` or `structured`.
    pub schema: String,
    pub path: String,
    /// The group a directory is mounted as (`experiment` for `experiments/`), or empty.
    pub mount: String,
}

/// Where a config was found.
enum Located {
    File(PathBuf),
    Builtin(&'static BuiltinConfig),
}

/// `a/b/../c` as `a/c`; `None` when the path climbs above its root (`../x`).
fn without_dot_dot(path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            ".." => {
                parts.pop()?;
            }
            "" | "." if !parts.is_empty() => {}
            part => parts.push(part),
        }
    }
    Some(parts.join("/"))
}

thread_local! {
    /// Built-in configs as loaded, by (config path asked for, the built-in's address): their text is
    /// static, so each is parsed once per thread however many repositories ask (a sweep composes once
    /// per job; the defaults-list fuzzer millions of times).
    static BUILTINS_LOADED: RefCell<HashMap<(String, usize), Rc<LoadedConfig>>> = RefCell::default();
}

fn load_builtin(
    config_path: &str,
    b: &'static BuiltinConfig,
) -> Result<Rc<LoadedConfig>, ConfigError> {
    let key = (config_path.to_string(), b as *const BuiltinConfig as usize);
    if let Some(hit) = BUILTINS_LOADED.with(|cache| cache.borrow().get(&key).cloned()) {
        return Ok(hit);
    }
    let sep = if b.source.path.ends_with("://") {
        ""
    } else {
        "/"
    };
    let shown = format!("{}{sep}{}.yaml", b.source.path, b.config_path);
    let loaded = Rc::new(load_text(config_path, b.text, &shown, &shown)?);
    BUILTINS_LOADED.with(|cache| cache.borrow_mut().insert(key, loaded.clone()));
    Ok(loaded)
}

fn load_file(
    config_path: &str,
    file: &Path,
    files: &ConfFiles,
) -> Result<LoadedConfig, ConfigError> {
    let text = files
        .read(file)
        .map_err(|e| ConfigError::Io(format!("Could not read '{}': {e}", file.display())))?;
    load_text(
        config_path,
        &text,
        &display_path(file),
        &file.display().to_string(),
    )
}

fn load_text(
    config_path: &str,
    text: &str,
    shown: &str,
    file: &str,
) -> Result<LoadedConfig, ConfigError> {
    let shown = shown.to_string();
    let text = text.to_string();
    let package_header = yaml::package_header(&text)
        .map_err(|e| ConfigError::composition(format!("In '{config_path}' ({shown}): {e}")))?;
    let mut body = yaml::parse(&text, &shown)?.unwrap_or_else(Node::empty_map);
    let defaults = match &mut body.value {
        Value::Map(map) => match map.shift_remove("defaults") {
            Some(list) => parse_defaults_list(config_path, &list)?,
            None => Vec::new(),
        },
        // A group option may be a list (placed at its package); a primary config may not (checked when
        // composing, as Hydra does).
        Value::List(_) => Vec::new(),
        // OmegaConf reads a file holding one plain string `s` as `{s: null}`.
        Value::Str(s) => {
            let key = s.clone();
            let mut map = super::tree::Map::new();
            map.insert(key, Node::new(Value::Null, body.source.clone()));
            body.value = Value::Map(map);
            Vec::new()
        }
        _ => {
            return Err(ConfigError::composition(format!(
                "In '{config_path}' ({shown}): a config file must hold a mapping or a list at the top, found a {}",
                body.type_name()
            )))
        }
    };
    let has_content = match &body.value {
        Value::Map(m) => m.values().any(|v| !v.is_missing()),
        _ => true,
    };
    Ok(LoadedConfig {
        config_path: config_path.to_string(),
        file: PathBuf::from(file),
        body,
        defaults,
        package_header,
        has_content,
    })
}

/// A path as the user would write it: relative to the current directory when below it.
pub fn display_path(file: &Path) -> String {
    if let Ok(cwd) = std::env::current_dir() {
        if let Ok(rel) = file.strip_prefix(&cwd) {
            return rel.display().to_string();
        }
    }
    file.display().to_string()
}
