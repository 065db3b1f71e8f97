//! The `hydra` node, checked and read. Hydra composes its node into a typed schema (`HydraConf`), so a
//! misspelt key or a wrong type fails at composition; trainyard checks the same schema here (with the file
//! and line of the offending value) and reads what it acts on into [`HydraSettings`]. Keys whose meaning
//! needs Python (Hydra callbacks) are refused with the reason.

use super::super::compose::RunMode;
use super::super::errors::{at, did_you_mean, ConfigError};
use super::super::repository::{display_path, Repository};
use super::super::tree::{Node, Source, Value};
use std::collections::BTreeMap;

/// The shape of `HydraConf` (hydra/conf/__init__.py): a field's type, or a nested struct.
#[derive(Clone, Copy)]
enum Field {
    Str,
    OptStr,
    OptBool,
    Int,
    OptInt,
    Float,
    /// A mapping of anything, not null (`Dict[str, Any]`: the logging configs).
    Dict,
    /// `RUN`, `MULTIRUN` or null.
    Mode,
    StrList,
    /// `Optional[List[str]]`.
    OptStrList,
    StrMap,
    /// Free-form (`Any`, `Dict[str, Any]`): logging configs, sweeper and launcher nodes, choices.
    Any,
    Struct(&'static str, &'static [(&'static str, Field)]),
}

use Field::*;

const OVERRIDE_DIRNAME: &[(&str, Field)] = &[
    ("kv_sep", Str),
    ("item_sep", Str),
    ("exclude_keys", StrList),
];
const JOB_CONFIG: &[(&str, Field)] = &[(
    "override_dirname",
    Struct("OverrideDirname", OVERRIDE_DIRNAME),
)];
const JOB: &[(&str, Field)] = &[
    ("name", Str),
    ("chdir", OptBool),
    ("override_dirname", Str),
    ("id", Str),
    ("num", Int),
    ("config_name", OptStr),
    ("env_set", StrMap),
    ("env_copy", StrList),
    ("config", Struct("JobConfig", JOB_CONFIG)),
];
const RUNTIME: &[(&str, Field)] = &[
    ("version", Str),
    ("version_base", Str),
    ("cwd", Str),
    ("config_sources", Any),
    ("output_dir", Str),
    ("choices", Any),
];
const HYDRA_CONF: &[(&str, Field)] = &[
    ("mode", Mode),
    ("searchpath", StrList),
    ("run", Struct("RunDir", &[("dir", Str)])),
    (
        "sweep",
        Struct("SweepDir", &[("dir", Str), ("subdir", Str)]),
    ),
    ("hydra_logging", Dict),
    ("job_logging", Dict),
    ("sweeper", Any),
    ("launcher", Any),
    ("callbacks", Any),
    ("env", Any),
    (
        "help",
        Struct(
            "HelpConf",
            &[
                ("app_name", Str),
                ("header", Str),
                ("footer", Str),
                ("template", Str),
            ],
        ),
    ),
    (
        "hydra_help",
        Struct("HydraHelpConf", &[("hydra_help", Str), ("template", Str)]),
    ),
    ("output_subdir", OptStr),
    (
        "overrides",
        Struct("OverridesConf", &[("hydra", StrList), ("task", StrList)]),
    ),
    ("job", Struct("JobConf", JOB)),
    ("runtime", Struct("RuntimeConf", RUNTIME)),
    ("verbose", Any),
];

/// The sweeper and launcher options Hydra types (their structured configs); a project's own option is free.
const BASIC_SWEEPER: &[(&str, Field)] = &[
    ("_target_", Str),
    ("max_batch_size", OptInt),
    ("params", Any),
];
const BASIC_LAUNCHER: &[(&str, Field)] = &[("_target_", Str)];
/// hydra-submitit-launcher's `BaseQueueConf` fields, shared by its local and SLURM launchers.
const SUBMITIT_BASE: &[(&str, Field)] = &[
    ("_target_", Str),
    ("submitit_folder", Str),
    ("timeout_min", Int),
    ("cpus_per_task", OptInt),
    ("gpus_per_node", OptInt),
    ("tasks_per_node", Int),
    ("mem_gb", OptInt),
    ("nodes", Int),
    ("name", Str),
    ("stderr_to_stdout", OptBool),
];
const SUBMITIT_SLURM: &[(&str, Field)] = &[
    ("partition", OptStr),
    ("qos", OptStr),
    ("comment", OptStr),
    ("constraint", OptStr),
    ("exclude", OptStr),
    ("gres", OptStr),
    ("cpus_per_gpu", OptInt),
    ("gpus_per_task", OptInt),
    ("mem_per_gpu", OptStr),
    ("mem_per_cpu", OptStr),
    ("account", OptStr),
    ("signal_delay_s", Int),
    ("max_num_timeout", Int),
    ("additional_parameters", Dict),
    ("array_parallelism", Int),
    ("setup", OptStrList),
    ("srun_args", OptStrList),
];
const JOBLIB_LAUNCHER: &[(&str, Field)] = &[
    ("_target_", Str),
    ("n_jobs", Int),
    ("backend", OptStr),
    ("prefer", Str),
    ("require", OptStr),
    ("verbose", Int),
    ("timeout", Any),
    ("pre_dispatch", Str),
    ("batch_size", Str),
    ("temp_folder", OptStr),
    ("max_nbytes", OptStr),
    ("mmap_mode", Str),
];
const OPTUNA_SWEEPER: &[(&str, Field)] = &[
    ("_target_", Str),
    ("sampler", Any),
    ("direction", Any),
    ("storage", Any),
    ("study_name", OptStr),
    ("n_trials", Int),
    ("n_jobs", Int),
    ("max_failure_rate", Float),
    ("search_space", Any),
    ("params", Any),
    ("custom_search_space", OptStr),
    // trainyard's addition (not in the plugin): `+hydra/sweeper/pruner=median` or a `pruner:` node.
    ("pruner", Any),
];

/// Names the config a value came from, for errors phrased as Hydra phrases them (`In 'cfg': ...`).
pub type Owner<'a> = &'a dyn Fn(&Source) -> Option<String>;

/// Check the composed `hydra` node against `HydraConf` (and the chosen sweeper's and launcher's schema),
/// converting values as OmegaConf does (`"true"` for a bool, `3` for a string field). Called on the composed
/// config (with the `hydra` key).
pub fn check_schema(
    config: &mut Node,
    choices: &indexmap::IndexMap<String, Option<String>>,
    owner: Owner,
) -> Result<(), ConfigError> {
    let Some(hydra) = config.child_mut("hydra") else {
        return Ok(());
    };
    check_struct(hydra, "hydra", "HydraConf", HYDRA_CONF, owner)?;
    let choice = |g: &str| choices.get(g).cloned().flatten();
    let sweeper = match choice("hydra/sweeper").as_deref() {
        Some("basic") => Some(("BasicSweeperConf", BASIC_SWEEPER)),
        Some("optuna") => Some(("OptunaSweeperConf", OPTUNA_SWEEPER)),
        _ => None,
    };
    if let (Some((name, fields)), Some(node)) = (sweeper, hydra.child_mut("sweeper")) {
        check_struct(node, "hydra.sweeper", name, fields, owner)?;
    }
    let slurm: Vec<(&str, Field)> = SUBMITIT_BASE
        .iter()
        .chain(SUBMITIT_SLURM)
        .copied()
        .collect();
    let launcher: Option<(&str, &[(&str, Field)])> = match choice("hydra/launcher").as_deref() {
        Some("basic") => Some(("BasicLauncherConf", BASIC_LAUNCHER)),
        Some("submitit_slurm") => Some(("SlurmQueueConf", &slurm)),
        Some("submitit_local") => Some(("LocalQueueConf", SUBMITIT_BASE)),
        Some("joblib") => Some(("JobLibLauncherConf", JOBLIB_LAUNCHER)),
        _ => None,
    };
    if let (Some((name, fields)), Some(node)) = (launcher, hydra.child_mut("launcher")) {
        check_struct(node, "hydra.launcher", name, fields, owner)?;
    }
    Ok(())
}

/// An error as Hydra words it: `Error merging override ...` for a command-line value, `In '<config>':
/// <Kind> raised while composing config:` for a value from a file; then OmegaConf's message.
fn schema_error(kind: &str, message: String, source: &Source, owner: Owner) -> ConfigError {
    let text = match source {
        Source::Override(input) => format!("Error merging override {input}\n{message}"),
        _ => match owner(source) {
            Some(config) => {
                format!(
                    "In '{config}': {kind} raised while composing config:\n{message}{}",
                    at(source)
                )
            }
            None => format!("{message}{}", at(source)),
        },
    };
    ConfigError::composition(text)
}

fn check_struct(
    node: &mut Node,
    path: &str,
    type_name: &str,
    fields: &[(&str, Field)],
    owner: Owner,
) -> Result<(), ConfigError> {
    let source = node.source.clone();
    let Value::Map(map) = &mut node.value else {
        if node.is_missing() || node.is_interpolation() {
            return Ok(());
        }
        return Err(type_error(path, &node.value, type_name, &source));
    };
    for (key, child) in map.iter_mut() {
        let full = format!("{path}.{key}");
        let Some((_, field)) = fields.iter().find(|(k, _)| k == key) else {
            let mut msg =
                format!("Key '{key}' not in '{type_name}'\n    full_key: {full}\n    object_type={type_name}");
            if let Some(s) = did_you_mean(key, fields.iter().map(|(k, _)| *k)) {
                msg.push_str(&format!("\nDid you mean '{s}'?"));
            }
            return Err(schema_error("ConfigKeyError", msg, &child.source, owner));
        };
        check_field(child, &full, field, owner)?;
    }
    Ok(())
}

fn check_field(
    node: &mut Node,
    path: &str,
    field: &Field,
    owner: Owner,
) -> Result<(), ConfigError> {
    if node.is_missing() || node.is_interpolation() {
        return Ok(());
    }
    let src = node.source.clone();
    match (field, &mut node.value) {
        (OptStrList, Value::Null) => return Ok(()),
        (StrList | OptStrList, Value::List(items)) => {
            for (i, item) in items.iter_mut().enumerate() {
                check_field(item, &format!("{path}[{i}]"), &Str, owner)?;
            }
            return Ok(());
        }
        (StrMap, Value::Map(items)) => {
            for (k, item) in items.iter_mut() {
                check_field(item, &format!("{path}.{k}"), &Str, owner)?;
            }
            return Ok(());
        }
        _ => {}
    }
    let converted = match (field, &node.value) {
        (Any, _) => return Ok(()),
        (Struct(name, fields), _) => return check_struct(node, path, name, fields, owner),
        (OptStr | OptBool | OptInt | Mode, Value::Null) => return Ok(()),
        (Dict, Value::Map(_)) => return Ok(()),
        (Dict | Str | Int | Float, Value::Null) => {
            let msg = format!("field '{path}' is not Optional\n    full_key: {path}");
            return Err(schema_error("ValidationError", msg, &src, owner));
        }
        (Float, Value::Float(_)) => return Ok(()),
        (Float, Value::Int(i)) => Value::Float(*i as f64),
        (Str | OptStr, Value::Str(_)) => return Ok(()),
        (Str | OptStr, v @ (Value::Int(_) | Value::Float(_) | Value::Bool(_))) => {
            Value::Str(v.display_python())
        }
        (OptBool, Value::Bool(_)) => return Ok(()),
        (OptBool, v) => match as_bool(v) {
            Some(b) => Value::Bool(b),
            None => {
                let msg = format!(
                    "Value '{}' is not a valid bool (type {})\n    full_key: {path}",
                    v.display_python(),
                    v.type_name()
                );
                return Err(schema_error("ValidationError", msg, &src, owner));
            }
        },
        (Int | OptInt, Value::Int(_)) => return Ok(()),
        (Int | OptInt, v) => match v.display_python().trim().parse() {
            Ok(i) => Value::Int(i),
            Err(_) => {
                let msg = format!(
                    "Value '{}' of type '{}' could not be converted to Integer\n    full_key: {path}",
                    v.display_python(),
                    v.type_name()
                );
                return Err(schema_error("ValidationError", msg, &src, owner));
            }
        },
        (Mode, Value::Str(s)) if s == "RUN" || s == "MULTIRUN" => return Ok(()),
        (Mode, v) => {
            let msg = format!(
                "Invalid value '{}', expected one of [RUN, MULTIRUN]\n    full_key: {path}",
                v.display_python()
            );
            return Err(schema_error("ValidationError", msg, &src, owner));
        }
        (StrList | OptStrList, v) => return Err(type_error(path, v, "a list of strings", &src)),
        (StrMap | Dict, v) => return Err(type_error(path, v, "a mapping", &src)),
        (Str | OptStr | Float, v) => return Err(type_error(path, v, "a scalar", &src)),
    };
    node.value = converted;
    Ok(())
}

/// OmegaConf's `BooleanNode` conversion.
fn as_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::Int(i) => Some(*i != 0),
        Value::Str(s) => match s.to_ascii_lowercase().as_str() {
            "y" | "yes" | "on" | "true" | "1" => Some(true),
            "n" | "no" | "off" | "false" | "0" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

fn type_error(path: &str, v: &Value, expected: &str, source: &Source) -> ConfigError {
    ConfigError::composition(format!(
        "{path} must be {expected}, got {} '{}'{}",
        v.type_name(),
        v.display_python(),
        at(source)
    ))
}

/// Hydra reads `hydra.searchpath` from the primary config before composing; set anywhere else it would do
/// nothing, so it is refused (Hydra ignores it silently).
pub fn check_only_primary_sets_searchpath(
    repo: &Repository,
    composed: &super::super::compose::Composed,
    owner: Owner,
) -> Result<(), ConfigError> {
    let Some(node) = composed.config.get("hydra.searchpath") else {
        return Ok(());
    };
    let Source::File { path, .. } = &node.source else {
        return Ok(());
    };
    let primary = composed
        .defaults
        .defaults
        .iter()
        .find(|d| d.primary)
        .and_then(|d| repo.load(&d.config_path).ok().flatten())
        .map(|l| display_path(&l.file));
    let builtin = path.contains("://");
    if builtin || primary.as_deref() == Some(path.as_ref()) {
        return Ok(());
    }
    let config = owner(&node.source).unwrap_or_else(|| path.to_string());
    Err(ConfigError::composition(format!(
        "In '{config}': Overriding hydra.searchpath is only supported from the primary config \
         (Hydra reads it before composing){}",
        at(&node.source)
    )))
}

/// How a job's log lines look: Hydra's logging groups mapped onto trainyard's console and log file.
#[derive(Debug, Clone, PartialEq)]
pub enum LoggingStyle {
    /// `default`, `stdout` or a project's own option: plain console lines and the log file.
    Plain,
    /// `colorlog`: the same, coloured when the console is a terminal.
    Colour,
    /// `disabled` or `none`: errors only on the console, no log file.
    Quiet,
}

impl LoggingStyle {
    fn from_choice(choice: Option<&str>) -> Self {
        match choice {
            Some("colorlog") => LoggingStyle::Colour,
            Some("disabled" | "none") | None => LoggingStyle::Quiet,
            Some(_) => LoggingStyle::Plain,
        }
    }
}

/// What trainyard acts on from the `hydra` node of one job (read after the node is resolved).
#[derive(Debug, Clone)]
pub struct HydraSettings {
    pub mode: Option<RunMode>,
    /// `hydra.job.chdir`: run the job with the output directory as its working directory.
    pub chdir: bool,
    pub env_set: BTreeMap<String, String>,
    /// `hydra.verbose`: true, a logger name or a list of them turns on debug output.
    pub verbose: bool,
    pub job_logging: LoggingStyle,
    pub hydra_logging: LoggingStyle,
    pub launcher: String,
    pub sweeper: String,
    pub max_batch_size: Option<usize>,
}

impl HydraSettings {
    /// Read the settings from a `hydra` node (the node itself, not the config holding it).
    pub fn read(hydra: &Node) -> Result<HydraSettings, ConfigError> {
        let get = |k: &str| hydra.get(k).filter(|n| !n.is_missing());
        let choice = |group: &str| {
            get(&format!("runtime.choices.{group}"))
                .and_then(Node::as_str)
                .map(str::to_string)
        };
        let mode = match get("mode").map(|n| &n.value) {
            Some(Value::Str(s)) if s == "MULTIRUN" => Some(RunMode::Multirun),
            Some(Value::Str(s)) if s == "RUN" => Some(RunMode::Run),
            _ => None,
        };
        if let Some(Value::Map(callbacks)) = get("callbacks").map(|n| &n.value) {
            if let Some((name, node)) = callbacks.iter().next() {
                return Err(ConfigError::composition(format!(
                    "hydra.callbacks.{name}: Hydra callbacks are Python classes run by Hydra; trainyard \
                     cannot run them. Remove the callback (trainyard's own callbacks live under \
                     `callbacks:`){}",
                    at(&node.source)
                )));
            }
        }
        let env_set = match get("job.env_set").map(|n| &n.value) {
            Some(Value::Map(m)) => m
                .iter()
                .map(|(k, v)| (k.clone(), v.value.display_python()))
                .collect(),
            _ => BTreeMap::new(),
        };
        let verbose = match get("verbose").map(|n| &n.value) {
            Some(Value::Bool(b)) => *b,
            Some(Value::Str(s)) => !s.is_empty(),
            Some(Value::List(l)) => !l.is_empty(),
            _ => false,
        };
        if let Some(node) = get("output_subdir") {
            if node.as_str() != Some(".hydra") {
                return Err(ConfigError::composition(format!(
                    "hydra.output_subdir is '{}': trainyard keeps a run's records in `.hydra/` (the logbook, \
                     `ckpt_path=last` and sweeps read them there), so it cannot be moved or turned off. \
                     Remove the setting{}",
                    node.value.display_python(),
                    at(&node.source)
                )));
            }
        }
        let max_batch_size = match get("sweeper.max_batch_size") {
            None => None,
            Some(Node {
                value: Value::Null, ..
            }) => None,
            Some(Node {
                value: Value::Int(n),
                ..
            }) if *n > 0 => Some(*n as usize),
            Some(other) => {
                return Err(ConfigError::composition(format!(
                    "hydra.sweeper.max_batch_size must be a positive int or null, got '{}'{}",
                    other.value.display_python(),
                    at(&other.source)
                )))
            }
        };
        Ok(HydraSettings {
            mode,
            chdir: matches!(get("job.chdir").map(|n| &n.value), Some(Value::Bool(true))),
            env_set,
            verbose,
            job_logging: LoggingStyle::from_choice(choice("hydra/job_logging").as_deref()),
            hydra_logging: LoggingStyle::from_choice(choice("hydra/hydra_logging").as_deref()),
            launcher: choice("hydra/launcher").unwrap_or_else(|| "basic".into()),
            sweeper: choice("hydra/sweeper").unwrap_or_else(|| "basic".into()),
            max_batch_size,
        })
    }
}
