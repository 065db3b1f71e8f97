//! `hydra/sweeper=optuna`, read as hydra-optuna-sweeper 1.3 reads it: the sampler (`tpe`, `random`,
//! `grid`), `direction`, `n_trials`, `n_jobs`, `storage`, `study_name`, `max_failure_rate`, the search
//! space from `params` (and the deprecated `search_space`) plus the command line's overrides, and, beyond
//! the plugin, `pruner` (Optuna's MedianPruner). Every mistake is refused before the first trial, naming
//! the key and where it was set.

use crate::config::errors::{at, did_you_mean, ConfigError};
use crate::config::grammar::{parse_override, Element, Num, Override, ParsedValue, Sweep};
use crate::config::tree::{Node, Value};
use crate::search::tpe::TpeConfig;
use crate::search::{Choice, Direction, Distribution, MedianPruner, Sampler};
use indexmap::IndexMap;

#[derive(Debug, Clone)]
pub struct OptunaSettings {
    pub sampler: Sampler,
    pub direction: Direction,
    pub storage: Option<String>,
    pub study_name: Option<String>,
    pub n_trials: usize,
    pub n_jobs: usize,
    pub max_failure_rate: f64,
    pub pruner: Option<MedianPruner>,
    /// The searched parameters, in the order they were given.
    pub space: IndexMap<String, Distribution>,
    /// Overrides every trial gets as they are (`key=value` text).
    pub fixed: Vec<String>,
}

fn err(message: String, node: Option<&Node>) -> ConfigError {
    ConfigError::Schema(match node {
        Some(n) => format!("{message}{}", at(&n.source)),
        None => message,
    })
}

fn number(node: &Node, key: &str) -> Result<Option<f64>, ConfigError> {
    match node.get(key).map(|n| &n.value) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Int(i)) => Ok(Some(*i as f64)),
        Some(Value::Float(f)) => Ok(Some(*f)),
        Some(other) => Err(err(
            format!(
                "hydra.sweeper.{key}: expected a number, got '{}'",
                other.display_python()
            ),
            node.get(key),
        )),
    }
}

fn flag(node: &Node, key: &str, default: bool) -> bool {
    match node.get(key).map(|n| &n.value) {
        Some(Value::Bool(b)) => *b,
        _ => default,
    }
}

impl OptunaSettings {
    /// Read the resolved `hydra.sweeper` node; `cli` are the command line's job overrides (not `hydra.*`).
    pub fn read(sweeper: &Node, cli: &[Override]) -> Result<OptunaSettings, ConfigError> {
        let count = |key: &str, default: usize| -> Result<usize, ConfigError> {
            match number(sweeper, key)? {
                None => Ok(default),
                Some(x) if x >= 1.0 && x.fract() == 0.0 => Ok(x as usize),
                Some(x) => Err(err(
                    format!("hydra.sweeper.{key} must be a positive int, got {x}"),
                    sweeper.get(key),
                )),
            }
        };
        let max_failure_rate = number(sweeper, "max_failure_rate")?.unwrap_or(0.0);
        if !(0.0..=1.0).contains(&max_failure_rate) {
            return Err(err(
                format!("hydra.sweeper.max_failure_rate must be in [0, 1], got {max_failure_rate}"),
                sweeper.get("max_failure_rate"),
            ));
        }
        let (space, fixed) = search_space(sweeper, cli)?;
        let sampler = sampler(sweeper.get("sampler"))?;
        if let Sampler::Grid { .. } = sampler {
            if let Some((name, d)) = space.iter().find(|(_, d)| d.grid().is_none()) {
                return Err(err(
                    format!(
                        "hydra/sweeper/sampler=grid: '{name}' is a {}; GridSampler only supports \
                         discrete distributions (choice(), range(), int(interval()))",
                        d.describe()
                    ),
                    None,
                ));
            }
        }
        Ok(OptunaSettings {
            sampler,
            direction: direction(sweeper.get("direction"))?,
            storage: sweeper
                .get("storage")
                .and_then(Node::as_str)
                .map(str::to_string),
            study_name: sweeper
                .get("study_name")
                .and_then(Node::as_str)
                .map(str::to_string),
            n_trials: count("n_trials", 20)?,
            n_jobs: count("n_jobs", 2)?,
            max_failure_rate,
            pruner: pruner(sweeper.get("pruner"))?,
            space,
            fixed,
        })
    }
}

fn direction(node: Option<&Node>) -> Result<Direction, ConfigError> {
    let text =
        match node.map(|n| &n.value) {
            None | Some(Value::Null) => return Ok(Direction::Minimize),
            Some(Value::Str(s)) => s.clone(),
            Some(Value::List(l)) if l.len() == 1 => return direction(l.first()),
            Some(Value::List(_)) => return Err(err(
                "hydra.sweeper.direction: a list of directions (multi-objective search) is not \
                 supported by trainyard; give one direction, minimize or maximize"
                    .into(),
                node,
            )),
            Some(other) => other.display_python(),
        };
    match text.to_ascii_lowercase().as_str() {
        "minimize" => Ok(Direction::Minimize),
        "maximize" => Ok(Direction::Maximize),
        _ => {
            let hint = did_you_mean(&text.to_ascii_lowercase(), ["minimize", "maximize"])
                .map(|s| format!(" Did you mean '{s}'?"))
                .unwrap_or_default();
            Err(err(
                format!(
                    "hydra.sweeper.direction='{text}' is not a direction: use minimize or maximize.{hint}"
                ),
                node,
            ))
        }
    }
}

fn target(node: &Node) -> String {
    node.get("_target_")
        .and_then(Node::as_str)
        .unwrap_or("")
        .to_string()
}

fn sampler(node: Option<&Node>) -> Result<Sampler, ConfigError> {
    let Some(node) = node.filter(|n| !matches!(n.value, Value::Null | Value::Missing)) else {
        return Ok(Sampler::Tpe {
            seed: None,
            config: TpeConfig::default(),
        });
    };
    let seed = match number(node, "seed")? {
        Some(s) if s >= 0.0 => Some(s as u64),
        Some(s) => {
            return Err(err(
                format!("hydra.sweeper.sampler.seed must be >= 0, got {s}"),
                node.get("seed"),
            ))
        }
        None => None,
    };
    let t = target(node);
    let short = t.rsplit('.').next().unwrap_or("");
    match short {
        "TPESampler" => {
            let d = TpeConfig::default();
            let get = |k: &str, dflt: usize| -> Result<usize, ConfigError> {
                Ok(number(node, k)?.map_or(dflt, |x| x.max(0.0) as usize))
            };
            Ok(Sampler::Tpe {
                seed,
                config: TpeConfig {
                    consider_prior: flag(node, "consider_prior", d.consider_prior),
                    prior_weight: number(node, "prior_weight")?.unwrap_or(d.prior_weight),
                    consider_magic_clip: flag(node, "consider_magic_clip", d.consider_magic_clip),
                    consider_endpoints: flag(node, "consider_endpoints", d.consider_endpoints),
                    n_startup_trials: get("n_startup_trials", d.n_startup_trials)?,
                    n_ei_candidates: get("n_ei_candidates", d.n_ei_candidates)?.max(1),
                    multivariate: flag(node, "multivariate", d.multivariate),
                    constant_liar: flag(node, "constant_liar", d.constant_liar),
                },
            })
        }
        "RandomSampler" => Ok(Sampler::Random { seed }),
        "GridSampler" => Ok(Sampler::Grid { seed }),
        _ => Err(err(
            format!(
                "hydra.sweeper.sampler: {t} is not a sampler trainyard runs; choose \
                 hydra/sweeper/sampler=tpe (the default), random or grid"
            ),
            node.get("_target_").or(Some(node)),
        )),
    }
}

fn pruner(node: Option<&Node>) -> Result<Option<MedianPruner>, ConfigError> {
    let Some(node) = node.filter(|n| !matches!(n.value, Value::Null)) else {
        return Ok(None);
    };
    let t = target(node);
    match t.rsplit('.').next().unwrap_or("") {
        "NopPruner" => Ok(None),
        "MedianPruner" => {
            let d = MedianPruner::default();
            let get = |k: &str, dflt: f64| -> Result<f64, ConfigError> {
                Ok(number(node, k)?.unwrap_or(dflt).max(0.0))
            };
            Ok(Some(MedianPruner {
                n_startup_trials: get("n_startup_trials", d.n_startup_trials as f64)? as usize,
                n_warmup_steps: get("n_warmup_steps", d.n_warmup_steps as f64)? as u64,
                interval_steps: get("interval_steps", d.interval_steps as f64)?.max(1.0) as u64,
                n_min_trials: get("n_min_trials", d.n_min_trials as f64)?.max(1.0) as usize,
            }))
        }
        _ => Err(err(
            format!(
                "hydra.sweeper.pruner: '{t}' is not a pruner trainyard runs; use \
                 hydra/sweeper/pruner=median (optuna.pruners.MedianPruner) or null"
            ),
            Some(node),
        )),
    }
}

/// The plugin's `create_params_from_overrides`: `hydra.sweeper.params` first, then the command line;
/// sweeps become distributions, plain values fixed overrides (a later one replaces an earlier one).
fn search_space(
    sweeper: &Node,
    cli: &[Override],
) -> Result<(IndexMap<String, Distribution>, Vec<String>), ConfigError> {
    let mut space = IndexMap::new();
    let mut fixed: IndexMap<String, String> = IndexMap::new();
    if let Some(Value::Map(m)) = sweeper.get("search_space").map(|n| &n.value) {
        for (name, node) in m {
            space.insert(name.to_string(), from_config(name, node)?);
        }
    }
    let mut all: Vec<(Override, Option<&Node>)> = Vec::new();
    if let Some(Value::Map(m)) = sweeper.get("params").map(|n| &n.value) {
        for (k, v) in m {
            let text = format!("{k}={}", crate::config::sweep::param_override_text(v));
            let o = parse_override(&text)
                .map_err(|e| err(format!("{e}\n    (in hydra.sweeper.params.{k})"), Some(v)))?;
            all.push((o, Some(v)));
        }
    }
    all.extend(cli.iter().map(|o| (o.clone(), None)));
    for (o, node) in all {
        let key = crate::config::sweep::key_element(&o);
        match &o.value {
            Some(ParsedValue::Sweep(s)) => {
                let d = from_sweep(&o, s).map_err(|m| err(m, node))?;
                d.check()
                    .map_err(|m| err(format!("'{}': {m}", o.input), node))?;
                fixed.shift_remove(&key);
                space.insert(key, d);
            }
            Some(ParsedValue::Element(e)) => {
                space.shift_remove(&key);
                fixed.insert(key.clone(), format!("{key}={}", e.to_override_string()));
            }
            None => {
                fixed.insert(key.clone(), key.clone());
            }
        }
    }
    Ok((space, fixed.into_values().collect()))
}

fn choice(e: &Element, input: &str) -> Result<Choice, String> {
    Ok(match e {
        Element::Null => Choice::Null,
        Element::Bool(b) => Choice::Bool(*b),
        Element::Int(i) => Choice::Int(*i),
        Element::Float(f) => Choice::Float(*f),
        Element::Str { value, .. } => Choice::Str(value.clone()),
        _ => {
            return Err(format!(
                "'{input}': a choice sweep expects str, int, float, bool, or None values; got {}",
                e.to_override_string()
            ))
        }
    })
}

/// The plugin's `create_optuna_distribution_from_override`.
fn from_sweep(o: &Override, sweep: &Sweep) -> Result<Distribution, String> {
    match sweep {
        Sweep::Choice { list, .. } => Ok(Distribution::Categorical {
            choices: list
                .iter()
                .map(|e| choice(e, &o.input))
                .collect::<Result<_, _>>()?,
        }),
        Sweep::Range { shuffle: true, .. } => Ok(Distribution::Categorical {
            choices: sweep
                .discrete_values()
                .map_err(|e| e.to_string())?
                .iter()
                .map(|e| choice(e, &o.input))
                .collect::<Result<_, _>>()?,
        }),
        Sweep::Range {
            start, stop, step, ..
        } => match (start, stop, step) {
            (Num::Int(a), Num::Int(b), Num::Int(s)) => Ok(Distribution::Int {
                low: *a,
                high: *b,
                log: false,
                step: *s,
            }),
            _ => Ok(Distribution::Float {
                low: start.as_f64(),
                high: stop.as_f64(),
                log: false,
                step: Some(step.as_f64()),
            }),
        },
        Sweep::Interval { start, end, tags } => {
            let log = tags.iter().any(|t| t == "log");
            match (start, end) {
                (Num::Int(a), Num::Int(b)) => Ok(Distribution::Int {
                    low: *a,
                    high: *b,
                    log,
                    step: 1,
                }),
                _ => Ok(Distribution::Float {
                    low: start.as_f64(),
                    high: end.as_f64(),
                    log,
                    step: None,
                }),
            }
        }
        Sweep::Glob { .. } => Err(format!(
            "'{}': glob() selects config group options for a grid sweep; the optuna sweeper cannot \
             search over it (use choice(...) with the option names)",
            o.input
        )),
    }
}

/// The deprecated `hydra.sweeper.search_space` form (`type: int|float|categorical`, `low`, `high`, ...).
fn from_config(name: &str, node: &Node) -> Result<Distribution, ConfigError> {
    let kind = node.get("type").and_then(Node::as_str).unwrap_or("");
    let num = |k: &str| number(node, k);
    let log = flag(node, "log", false);
    let need = |k: &str| -> Result<f64, ConfigError> {
        num(k)?.ok_or_else(|| {
            err(
                format!("hydra.sweeper.search_space.{name}: '{k}' is required for type {kind}"),
                Some(node),
            )
        })
    };
    let d = match kind {
        "categorical" => Distribution::Categorical {
            choices: match node.get("choices").map(|n| &n.value) {
                Some(Value::List(l)) => l
                    .iter()
                    .map(|c| match &c.value {
                        Value::Null => Choice::Null,
                        Value::Bool(b) => Choice::Bool(*b),
                        Value::Int(i) => Choice::Int(*i),
                        Value::Float(f) => Choice::Float(*f),
                        other => Choice::Str(other.display_python()),
                    })
                    .collect(),
                _ => Vec::new(),
            },
        },
        "int" => Distribution::Int {
            low: need("low")? as i64,
            high: need("high")? as i64,
            log,
            step: if log {
                1
            } else {
                num("step")?.map_or(1, |s| s as i64)
            },
        },
        "float" => Distribution::Float {
            low: need("low")?,
            high: need("high")?,
            log,
            step: if log { None } else { num("step")? },
        },
        other => {
            return Err(err(
                format!(
                    "hydra.sweeper.search_space.{name}.type='{other}' is not a distribution type: \
                     use int, float or categorical"
                ),
                Some(node),
            ))
        }
    };
    d.check().map_err(|m| {
        err(
            format!("hydra.sweeper.search_space.{name}: {m}"),
            Some(node),
        )
    })?;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn from(text: &str) -> Distribution {
        let o = parse_override(text).unwrap();
        match &o.value {
            Some(ParsedValue::Sweep(s)) => from_sweep(&o, s).unwrap(),
            _ => panic!("{text} is not a sweep"),
        }
    }

    fn int(low: i64, high: i64, log: bool) -> Distribution {
        Distribution::Int {
            low,
            high,
            log,
            step: 1,
        }
    }

    fn float(low: f64, high: f64, log: bool, step: Option<f64>) -> Distribution {
        Distribution::Float {
            low,
            high,
            log,
            step,
        }
    }

    fn cat(c: Vec<Choice>) -> Distribution {
        Distribution::Categorical { choices: c }
    }

    /// hydra-optuna-sweeper's own `test_create_optuna_distribution_from_override` cases.
    #[rstest]
    #[case("key=choice(1,2)", cat(vec![Choice::Int(1), Choice::Int(2)]))]
    #[case("key=choice(true, false)", cat(vec![Choice::Bool(true), Choice::Bool(false)]))]
    #[case("key=choice('hello', 'world')", cat(vec![Choice::Str("hello".into()), Choice::Str("world".into())]))]
    #[case("key=range(1,3)", int(1, 3, false))]
    #[case("key=interval(1, 5)", float(1.0, 5.0, false, None))]
    #[case("key=int(interval(1, 5))", int(1, 5, false))]
    #[case("key=tag(log, interval(1, 5))", float(1.0, 5.0, true, None))]
    #[case("key=tag(log, int(interval(1, 5)))", int(1, 5, true))]
    #[case("key=range(0.5, 5.5, step=1)", float(0.5, 5.5, false, Some(1.0)))]
    fn the_plugins_search_space_cases(#[case] text: &str, #[case] expected: Distribution) {
        assert_eq!(from(text), expected, "{text}");
    }

    fn int_step(low: i64, high: i64, step: i64) -> Distribution {
        Distribution::Int {
            low,
            high,
            log: false,
            step,
        }
    }

    /// hydra-optuna-sweeper's `test_create_optuna_distribution_from_config` cases (the deprecated
    /// `search_space` form).
    #[rstest]
    #[case("{type: categorical, choices: [1, 2, 3]}", cat(vec![Choice::Int(1), Choice::Int(2), Choice::Int(3)]))]
    #[case("{type: int, low: 0, high: 10}", int(0, 10, false))]
    #[case("{type: int, low: 0, high: 10, step: 2}", int_step(0, 10, 2))]
    #[case("{type: int, low: 0, high: 5}", int(0, 5, false))]
    #[case("{type: int, low: 1, high: 100, log: true}", int(1, 100, true))]
    #[case("{type: float, low: 0, high: 1}", float(0.0, 1.0, false, None))]
    #[case(
        "{type: float, low: 0, high: 10, step: 2}",
        float(0.0, 10.0, false, Some(2.0))
    )]
    #[case(
        "{type: float, low: 1, high: 100, log: true}",
        float(1.0, 100.0, true, None)
    )]
    fn the_plugins_search_space_config_cases(#[case] yaml: &str, #[case] expected: Distribution) {
        let node = crate::config::yaml::parse(yaml, "t.yaml").unwrap().unwrap();
        assert_eq!(from_config("key", &node).unwrap(), expected, "{yaml}");
    }

    #[test]
    fn a_shuffled_range_is_a_categorical_of_its_values() {
        let Distribution::Categorical { mut choices } = from("key=shuffle(range(1,3))") else {
            panic!()
        };
        choices.sort_by_key(|c| c.to_string());
        assert_eq!(choices, vec![Choice::Int(1), Choice::Int(2)]);
    }

    #[test]
    fn sweeps_join_the_space_plain_values_stay_fixed() {
        let cli: Vec<Override> = ["key1=choice(1,2)", "key2=5", "key3=range(1,3)", "+w=1"]
            .iter()
            .map(|t| parse_override(t).unwrap())
            .collect();
        let (space, fixed) = search_space(&Node::empty_map(), &cli).unwrap();
        assert_eq!(space.keys().collect::<Vec<_>>(), ["key1", "key3"]);
        assert_eq!(fixed, ["key2=5", "+w=1"]);
    }

    #[rstest]
    #[case("maximise", "Did you mean 'maximize'?")]
    #[case("minimze", "Did you mean 'minimize'?")]
    fn a_direction_typo_is_refused_with_a_hint(#[case] typo: &str, #[case] hint: &str) {
        let node = Node::new(Value::Str(typo.into()), Default::default());
        let e = direction(Some(&node)).unwrap_err().to_string();
        assert!(e.contains(hint), "{e}");
    }
}
