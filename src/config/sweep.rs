//! Multirun expansion in the order of Hydra's BasicSweeper: sweeps declared in YAML (`hydra.sweeper.params`)
//! come first, command-line overrides after (a key given twice keeps its first position, last value wins),
//! then the cartesian product with the leftmost override varying slowest. Beyond Hydra, sweeps tagged
//! `zip` (`a=tag(zip, choice(1,2,3)) b=tag(zip, choice(x,y,z))`) move in lockstep as one axis of the
//! product: 3 jobs (a=1 b=x, a=2 b=y, a=3 b=z) instead of 9.

use super::errors::ConfigError;
use super::grammar::{parse_override, Element, Override, OverrideKind, ParsedValue, Quote, Sweep};
use super::repository::Repository;
use indexmap::IndexMap;

/// The key as Hydra prints it in a job's override: `+a.b`, `~c`, `db@backup`.
pub fn key_element(o: &Override) -> String {
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

/// A YAML value of `hydra.sweeper.params` as override text (`32,64,128` stays a sweep, `true` stays a
/// bool): what both the basic and the optuna sweeper read params as.
pub fn param_override_text(v: &crate::config::tree::Node) -> String {
    use crate::config::tree::Value;
    match &v.value {
        Value::Str(s) => s.clone(),
        other => other
            .display_python()
            .replace("True", "true")
            .replace("False", "false")
            .replace("None", "null"),
    }
}

/// A sweep over Hydra's own config (`hydra.job.chdir=true,false`, `hydra/launcher=a,b`) is refused before
/// any job starts, by every sweeper, as Hydra's basic and optuna sweepers refuse it.
pub fn refuse_sweeps_over_hydra(cli: &[Override]) -> Result<(), ConfigError> {
    match cli
        .iter()
        .find(|o| o.is_sweep() && crate::config::hydra::runtime::is_hydra_override(o))
    {
        Some(o) => Err(ConfigError::composition(format!(
            "Sweeping over Hydra's configuration is not supported : '{}'",
            o.input
        ))),
        None => Ok(()),
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
    refuse_sweeps_over_hydra(cli)?;
    for o in cli {
        if !crate::config::hydra::runtime::is_hydra_override(o) {
            parsed.push(o.clone());
        }
    }
    // Per key: its values and, for a `tag(zip...)` sweep, the group it moves in lockstep with.
    let mut lists: IndexMap<String, (Vec<String>, Option<String>, &Override)> = IndexMap::new();
    for o in &parsed {
        let key = key_element(o);
        let (values, zip): (Vec<String>, _) = match &o.value {
            Some(ParsedValue::Sweep(sweep)) => (
                sweep_values(repo, o, sweep)?
                    .iter()
                    .map(|v| format!("{key}={}", v.to_override_string()))
                    .collect(),
                zip_group(sweep),
            ),
            Some(ParsedValue::Element(e)) => {
                (vec![format!("{key}={}", e.to_override_string())], None)
            }
            None => (vec![key.clone()], None),
        };
        lists.insert(key, (values, zip, o));
    }
    let axes = zip_axes(&lists)?;
    let mut jobs: Vec<Vec<String>> = vec![Vec::new()];
    for values in axes.values() {
        let mut next = Vec::with_capacity(jobs.len() * values.len());
        for job in &jobs {
            for v in values {
                let mut j = job.clone();
                j.extend(v.iter().cloned());
                next.push(j);
            }
        }
        jobs = next;
    }
    Ok(jobs)
}

/// The zip group a sweep is tagged with: `zip` or `zip_<name>` (several groups zip separately).
fn zip_group(sweep: &Sweep) -> Option<String> {
    sweep
        .tags()
        .iter()
        .find(|t| *t == "zip" || t.starts_with("zip_"))
        .cloned()
}

/// The product's axes, in the order of their first key: a plain key is an axis of its own; the keys of a
/// zip group form one axis whose i-th point takes every member's i-th value (equal lengths required).
fn zip_axes(
    lists: &IndexMap<String, (Vec<String>, Option<String>, &Override)>,
) -> Result<IndexMap<String, Vec<Vec<String>>>, ConfigError> {
    let mut axes: IndexMap<String, Vec<Vec<String>>> = IndexMap::new();
    let mut first_member: IndexMap<String, &Override> = IndexMap::new();
    for (key, (values, zip, o)) in lists {
        let Some(group) = zip else {
            axes.insert(
                key.clone(),
                values.iter().map(|v| vec![v.clone()]).collect(),
            );
            continue;
        };
        let axis_key = format!("tag({group})");
        match axes.get_mut(&axis_key) {
            None => {
                first_member.insert(group.clone(), o);
                axes.insert(axis_key, values.iter().map(|v| vec![v.clone()]).collect());
            }
            Some(points) if points.len() == values.len() => {
                for (point, v) in points.iter_mut().zip(values) {
                    point.push(v.clone());
                }
            }
            Some(points) => {
                return Err(ConfigError::composition(format!(
                    "tag({group}, ...) sweeps move in lockstep, so they need the same number of values: \
                     '{}' has {} and '{}' has {}. Give both the same length, or tag them with different \
                     groups (zip_a, zip_b) to zip them separately",
                    first_member[group].input,
                    points.len(),
                    o.input,
                    values.len()
                )))
            }
        }
    }
    Ok(axes)
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

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn jobs(cli: &[&str]) -> Result<Vec<String>, ConfigError> {
        let repo = Repository::new(Vec::new());
        let parsed: Vec<Override> = cli.iter().map(|t| parse_override(t).unwrap()).collect();
        Ok(expand(&repo, &[], &parsed)?
            .into_iter()
            .map(|j| j.join(" "))
            .collect())
    }

    #[rstest]
    #[case::pairs(&["a=tag(zip, choice(1,2,3))", "b=tag(zip, choice(x,y,z))"], &["a=1 b=x", "a=2 b=y", "a=3 b=z"])]
    #[case::zip_with_product(
        &["a=tag(zip, range(1,3))", "c=p,q", "b=tag(zip, choice(x,y))"],
        &["a=1 b=x c=p", "a=1 b=x c=q", "a=2 b=y c=p", "a=2 b=y c=q"]
    )]
    #[case::two_groups(
        &["a=tag(zip_1, choice(1,2))", "b=tag(zip_2, choice(x,y))", "c=tag(zip_1, choice(5,6))"],
        &["a=1 c=5 b=x", "a=1 c=5 b=y", "a=2 c=6 b=x", "a=2 c=6 b=y"]
    )]
    #[case::other_tags_do_not_zip(&["a=tag(log, choice(1,2))", "b=choice(x,y)"], &["a=1 b=x", "a=1 b=y", "a=2 b=x", "a=2 b=y"])]
    fn zip_tagged_sweeps_move_in_lockstep(#[case] cli: &[&str], #[case] want: &[&str]) {
        assert_eq!(jobs(cli).unwrap(), want);
    }

    #[test]
    fn zips_of_unequal_length_are_refused_naming_both() {
        let err = jobs(&["a=tag(zip, choice(1,2,3))", "b=tag(zip, choice(x,y))"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("'a=tag(zip, choice(1,2,3))' has 3")
                && err.contains("'b=tag(zip, choice(x,y))' has 2"),
            "{err}"
        );
    }
}
