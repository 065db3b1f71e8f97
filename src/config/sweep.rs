//! Multirun expansion in the order of Hydra's BasicSweeper: sweeps declared in YAML (`hydra.sweeper.params`)
//! come first, command-line overrides after (a key given twice keeps its first position, last value wins),
//! then the cartesian product with the leftmost override varying slowest.

use super::errors::ConfigError;
use super::grammar::{parse_override, Element, Override, OverrideKind, ParsedValue, Quote, Sweep};
use super::repository::Repository;
use indexmap::IndexMap;

/// The key as Hydra prints it in a job's override: `+a.b`, `~c`, `db@backup`.
fn key_element(o: &Override) -> String {
    let prefix = match o.kind {
        OverrideKind::Change => "",
        OverrideKind::Add => "+",
        OverrideKind::ForceAdd => "++",
        OverrideKind::Delete => "~",
    };
    match &o.key.package {
        Some(p) => format!("{prefix}{}@{p}", o.key.key_or_group),
        None => format!("{prefix}{}", o.key.key_or_group),
    }
}

/// Each job's overrides, in launch order. Overrides of Hydra's own config (`hydra.*`, `hydra/*`) are not
/// part of a job's overrides (the launcher composes every job with them, as Hydra's `load_sweep_config`
/// does), and sweeping over them is refused as Hydra refuses it.
pub fn expand(
    repo: &Repository,
    yaml_params: &[String],
    cli: &[Override],
) -> Result<Vec<Vec<String>>, ConfigError> {
    let mut parsed = Vec::new();
    for text in yaml_params {
        parsed.push(
            parse_override(text)
                .map_err(|e| ConfigError::Parse(format!("{e}\n    (in hydra.sweeper.params)")))?,
        );
    }
    for o in cli {
        if crate::config::hydra::runtime::is_hydra_override(o) {
            if o.is_sweep() {
                return Err(ConfigError::composition(format!(
                    "Sweeping over Hydra's configuration is not supported : '{}'",
                    o.input
                )));
            }
            continue;
        }
        parsed.push(o.clone());
    }
    let mut lists: IndexMap<String, Vec<String>> = IndexMap::new();
    for o in &parsed {
        let key = key_element(o);
        let values: Vec<String> = match &o.value {
            Some(ParsedValue::Sweep(sweep)) => sweep_values(repo, o, sweep)?
                .iter()
                .map(|v| format!("{key}={}", v.to_override_string()))
                .collect(),
            Some(ParsedValue::Element(e)) => vec![format!("{key}={}", e.to_override_string())],
            None => vec![key.clone()],
        };
        lists.insert(key, values);
    }
    let mut jobs: Vec<Vec<String>> = vec![Vec::new()];
    for values in lists.values() {
        let mut next = Vec::with_capacity(jobs.len() * values.len());
        for job in &jobs {
            for v in values {
                let mut j = job.clone();
                j.push(v.clone());
                next.push(j);
            }
        }
        jobs = next;
    }
    Ok(jobs)
}

fn sweep_values(
    repo: &Repository,
    o: &Override,
    sweep: &Sweep,
) -> Result<Vec<Element>, ConfigError> {
    match sweep {
        Sweep::Glob { include, exclude } => {
            let group = &o.key.key_or_group;
            if !repo.group_exists(group) {
                return Err(ConfigError::composition(format!(
                    "glob() in '{}' needs a config group, and '{group}' is not one",
                    o.input
                )));
            }
            let names = repo.group_options(group);
            Ok(Sweep::glob_filter(include, exclude, &names)
                .into_iter()
                .map(|n| Element::Str {
                    value: n,
                    quote: Quote::None,
                })
                .collect())
        }
        Sweep::Interval { .. } => Err(ConfigError::composition(format!(
            "BasicSweeper does not support sweep type : INTERVAL_SWEEP\n    (in override '{}')",
            o.input
        ))),
        other => other
            .discrete_values()
            .map_err(|e| ConfigError::Parse(e.to_string())),
    }
}
