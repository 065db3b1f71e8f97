//! The `hydra` node's run-time fields, filled as Hydra fills them: at composition (`hydra.overrides`,
//! `runtime.choices`, `runtime.cwd`, `job.name`, `job.override_dirname`, ...; `config_loader_impl.py`) and
//! when a job is placed (`runtime.output_dir`, `job.num`/`job.id` in a sweep, `mode`; `core/utils.py`).

use super::super::compose::{Composed, RunMode};
use super::super::errors::{at, ConfigError};
use super::super::grammar::Override;
use super::super::repository::Repository;
use super::super::tree::{Map, Node, Source, Value};
use std::path::{Path, PathBuf};

/// The Hydra release whose behaviour trainyard follows (`hydra.runtime.version`; tools that read
/// `.hydra/hydra.yaml` look at it).
pub const HYDRA_VERSION: &str = "1.3.2";
pub const HYDRA_VERSION_BASE: &str = "1.3";

/// What is known about a job once it is placed.
#[derive(Debug, Clone)]
pub struct JobRuntime {
    /// Unknown while the output directory itself is being worked out (it may read the job's number).
    pub output_dir: Option<PathBuf>,
    /// The job's number in its sweep; `None` for a single run (where `hydra.job.num` stays `???`).
    pub num: Option<usize>,
    pub mode: RunMode,
}

/// An override that configures Hydra itself (`hydra.run.dir=...`, `hydra/launcher=...`).
pub fn is_hydra_override(o: &Override) -> bool {
    let k = &o.key.key_or_group;
    k.starts_with("hydra.") || k.starts_with("hydra/")
}

/// Fill what Hydra fills right after composing (`_load_configuration_impl`).
pub fn fill_composed(
    composed: &mut Composed,
    repo: &Repository,
    config_name: &str,
    overrides: &[Override],
) -> Result<(), ConfigError> {
    let strings = |items: Vec<&Override>| {
        Value::List(
            items
                .into_iter()
                .map(|o| internal(Value::Str(o.input.clone())))
                .collect(),
        )
    };
    let (hydra_overrides, task_overrides): (Vec<&Override>, Vec<&Override>) =
        overrides.iter().partition(|o| is_hydra_override(o));
    let cfg = &mut composed.config;
    append(cfg, "hydra.overrides.hydra", strings(hydra_overrides));
    append(cfg, "hydra.overrides.task", strings(task_overrides.clone()));

    let mut choices = Map::new();
    for (group, option) in &composed.choices {
        let value = option.clone().map(Value::Str).unwrap_or(Value::Null);
        choices.insert(group.clone(), internal(value));
    }
    merge_at(cfg, "hydra.runtime.choices", internal(Value::Map(choices)));

    copy_env(cfg)?;
    let cwd = std::env::current_dir()
        .map_err(|e| ConfigError::Io(format!("no current directory: {e}")))?;
    set(
        cfg,
        "hydra.runtime.version",
        Value::Str(HYDRA_VERSION.into()),
    );
    set(
        cfg,
        "hydra.runtime.version_base",
        Value::Str(HYDRA_VERSION_BASE.into()),
    );
    set(cfg, "hydra.runtime.cwd", Value::Str(path_text(&cwd)));
    set(cfg, "hydra.runtime.config_sources", config_sources(repo));
    if cfg.get("hydra.job.name").is_none_or(Node::is_missing) {
        // Hydra names the job after its script (`train.py` → `train`); a trainyard job after its primary
        // config (`train.yaml` → `train`), which is the same name in the usual layout.
        set(cfg, "hydra.job.name", Value::Str(config_name.to_string()));
    }
    let dirname = override_dirname(cfg, &task_overrides)?;
    set(cfg, "hydra.job.override_dirname", Value::Str(dirname));
    set(
        cfg,
        "hydra.job.config_name",
        Value::Str(config_name.to_string()),
    );
    Ok(())
}

/// Set `hydra.mode` as the override `hydra.mode=<MODE>` that Hydra appends for a run whose config names
/// no mode would: the value, and the override in `hydra.overrides.hydra`.
pub fn record_mode(config: &mut Node, mode: RunMode) {
    let text = match mode {
        RunMode::Run => "RUN",
        RunMode::Multirun => "MULTIRUN",
    };
    set(config, "hydra.mode", Value::Str(text.into()));
    append(
        config,
        "hydra.overrides.hydra",
        Value::List(vec![internal(Value::Str(format!("hydra.mode={text}")))]),
    );
}

/// Fill what is known once a job is placed: its output directory, its number in a sweep, the run mode.
pub fn fill_job(hydra: &mut Node, job: &JobRuntime) {
    let mut root = Node::empty_map();
    if let Some(m) = root.as_map_mut() {
        m.insert("hydra".into(), std::mem::replace(hydra, Node::empty_map()));
    }
    if let Some(dir) = &job.output_dir {
        set(
            &mut root,
            "hydra.runtime.output_dir",
            Value::Str(path_text(dir)),
        );
    }
    if let Some(num) = job.num {
        set(&mut root, "hydra.job.num", Value::Int(num as i64));
        set(&mut root, "hydra.job.id", Value::Str(num.to_string()));
    }
    let mode = match job.mode {
        RunMode::Run => "RUN",
        RunMode::Multirun => "MULTIRUN",
    };
    set(&mut root, "hydra.mode", Value::Str(mode.into()));
    *hydra = super::split_hydra(root).1;
}

/// `hydra.job.override_dirname`: the task overrides (minus `exclude_keys`), sorted, joined with
/// `item_sep`, every `=` replaced by `kv_sep` (Hydra's `get_overrides_dirname`).
fn override_dirname(cfg: &Node, task_overrides: &[&Override]) -> Result<String, ConfigError> {
    let setting = |key: &str, default: &str| -> Result<String, ConfigError> {
        let path = format!("hydra.job.config.override_dirname.{key}");
        match cfg.get(&path) {
            None => Ok(default.to_string()),
            Some(Node {
                value: Value::Str(s),
                ..
            }) => Ok(s.clone()),
            Some(other) => Err(ConfigError::composition(format!(
                "{path} must be a string, got {}{}",
                other.value.display_python(),
                at(&other.source)
            ))),
        }
    };
    let kv_sep = setting("kv_sep", "=")?;
    let item_sep = setting("item_sep", ",")?;
    let excluded: Vec<String> = match cfg
        .get("hydra.job.config.override_dirname.exclude_keys")
        .map(|n| &n.value)
    {
        Some(Value::List(items)) => items.iter().map(|n| n.value.display_python()).collect(),
        _ => Vec::new(),
    };
    let mut lines: Vec<&str> = task_overrides
        .iter()
        .filter(|o| !excluded.contains(&o.key.key_or_group))
        .map(|o| o.input.as_str())
        .collect();
    lines.sort();
    Ok(lines.join(&item_sep).replace('=', &kv_sep))
}

/// `hydra.job.env_copy`: each named variable copied from the launching environment into `env_set`.
fn copy_env(cfg: &mut Node) -> Result<(), ConfigError> {
    let Some(Node {
        value: Value::List(names),
        ..
    }) = cfg.get("hydra.job.env_copy").cloned()
    else {
        return Ok(());
    };
    for name in names {
        let key = name.value.display_python();
        let value = std::env::var(&key).map_err(|_| {
            ConfigError::composition(format!(
                "hydra.job.env_copy names '{key}', which is not set in this environment{}",
                at(&name.source)
            ))
        })?;
        merge_at(
            cfg,
            "hydra.job.env_set",
            internal(Value::Map(Map::from_iter([(
                key,
                internal(Value::Str(value)),
            )]))),
        );
    }
    Ok(())
}

/// `hydra.runtime.config_sources`, as Hydra lists its search path (`path`, `schema`, `provider`).
fn config_sources(repo: &Repository) -> Value {
    let items = repo
        .sources()
        .into_iter()
        .map(|s| {
            let mut m = Map::new();
            m.insert("path".into(), internal(Value::Str(s.path)));
            m.insert("schema".into(), internal(Value::Str(s.schema)));
            m.insert("provider".into(), internal(Value::Str(s.provider)));
            internal(Value::Map(m))
        })
        .collect();
    Value::List(items)
}

fn path_text(p: &Path) -> String {
    p.display().to_string()
}

fn internal(value: Value) -> Node {
    Node::new(value, Source::Internal)
}

/// Set `path` (dotted) to `value`, creating the maps on the way.
fn set(root: &mut Node, path: &str, value: Value) {
    let (parent, last) = match path.rsplit_once('.') {
        Some((p, l)) => (Some(p), l),
        None => (None, path),
    };
    let parent = match parent {
        Some(p) => ensure_map(root, p),
        None => root,
    };
    if let Value::Map(m) = &mut parent.value {
        m.insert(last.to_string(), internal(value));
    }
}

/// Merge `node` into the map at `path` (keys already there are kept unless `node` has them too).
fn merge_at(root: &mut Node, path: &str, node: Node) {
    ensure_map(root, path).merge(node);
}

/// Append the items of `list` to the list at `path` (or set it).
fn append(root: &mut Node, path: &str, list: Value) {
    let Value::List(items) = list else { return };
    match root.get_mut(path) {
        Some(Node {
            value: Value::List(existing),
            ..
        }) => existing.extend(items),
        _ => set(root, path, Value::List(items)),
    }
}

fn ensure_map<'a>(root: &'a mut Node, path: &str) -> &'a mut Node {
    let mut node = root;
    for part in path.split('.') {
        if !matches!(node.value, Value::Map(_)) {
            node.value = Value::Map(Map::new());
        }
        let Value::Map(m) = &mut node.value else {
            unreachable!("made a map above")
        };
        let child = m
            .entry(part.to_string())
            .or_insert_with(|| internal(Value::Map(Map::new())));
        if !matches!(child.value, Value::Map(_)) {
            child.value = Value::Map(Map::new());
        }
        node = child;
    }
    node
}
