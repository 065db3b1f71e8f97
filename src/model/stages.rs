//! Model stages: the cut of a forward pass into consecutive pieces (stem, each residual or transformer
//! block, head), each owning the parameters under its name prefixes. FSDP wraps a unit per stage
//! (`strategy::fsdp`), and the unit-by-unit schedule runs them one at a time (`backend::units`).

/// Each stage's parameters (name, shape), in forward order.
pub type StageLayouts = Vec<Vec<(String, Vec<usize>)>>;

/// The stages of a plain stack of numbered blocks (`<block>.0`, `<block>.1`, ...) between a stem with no
/// parameters and a `head`: the small zoo models.
pub fn numbered_stages(block: &str, count: usize, head: &[&str]) -> Vec<Vec<String>> {
    let mut stages = vec![Vec::new()];
    stages.extend((0..count).map(|i| vec![format!("{block}.{i}")]));
    stages.push(head.iter().map(|s| s.to_string()).collect());
    stages
}

/// Does the parameter `name` live under `prefix` (the prefix itself, or `prefix.` followed by more)?
fn under(name: &str, prefix: &str) -> bool {
    name == prefix
        || name
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// Split `params` into the stages' units (each in `params`' order). Every parameter must fall in exactly
/// one stage: anything else is a model description that disagrees with its own forward pass.
pub fn unit_layouts(
    stages: &[Vec<String>],
    params: &[(String, Vec<usize>)],
) -> anyhow::Result<StageLayouts> {
    let mut units: StageLayouts = vec![Vec::new(); stages.len()];
    for (name, shape) in params {
        let owners: Vec<usize> = stages
            .iter()
            .enumerate()
            .filter(|(_, prefixes)| prefixes.iter().any(|p| under(name, p)))
            .map(|(i, _)| i)
            .collect();
        match owners[..] {
            [unit] => units[unit].push((name.clone(), shape.clone())),
            [] => anyhow::bail!("FSDP units: parameter '{name}' belongs to no stage of the model"),
            _ => anyhow::bail!("FSDP units: parameter '{name}' belongs to stages {owners:?}"),
        }
    }
    Ok(units)
}

/// The parameter layout of a unit spanning `stages`: theirs, concatenated in order.
pub fn unit_layout(
    layouts: &StageLayouts,
    stages: std::ops::Range<usize>,
) -> Vec<(String, Vec<usize>)> {
    layouts[stages].concat()
}

/// FSDP's size-based wrap policy over a model's stages (their parameter layouts, in forward order):
/// consecutive stages join a unit until it holds at least `min_num_params` parameters; a smaller
/// remainder joins the last unit. `None`: one unit per stage. Returns the stages of each unit.
pub fn group_stages(
    stages: &StageLayouts,
    min_num_params: Option<usize>,
) -> Vec<std::ops::Range<usize>> {
    let Some(min) = min_num_params else {
        return (0..stages.len()).map(|k| k..k + 1).collect();
    };
    let numel = |k: usize| -> usize {
        stages[k]
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum()
    };
    let mut units: Vec<std::ops::Range<usize>> = Vec::new();
    let (mut start, mut count) = (0, 0);
    for k in 0..stages.len() {
        count += numel(k);
        if count >= min.max(1) {
            units.push(start..k + 1);
            (start, count) = (k + 1, 0);
        }
    }
    if start < stages.len() {
        match units.last_mut() {
            Some(last) => last.end = stages.len(),
            None => units.push(start..stages.len()),
        }
    }
    units
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn shapes(names: &[&str]) -> Vec<(String, Vec<usize>)> {
        names.iter().map(|n| (n.to_string(), vec![1])).collect()
    }

    #[test]
    fn parameters_fall_in_the_stage_of_their_prefix() {
        let stages = vec![
            vec!["conv1".to_string(), "bn1".to_string()],
            vec!["layer1.0".to_string()],
            vec!["layer1.1".to_string()],
            vec!["fc".to_string()],
        ];
        let units = unit_layouts(
            &stages,
            &shapes(&[
                "bn1.weight",
                "conv1.weight",
                "fc.bias",
                "layer1.0.conv1.weight",
                "layer1.1.bn2.bias",
            ]),
        )
        .unwrap();
        let names: Vec<Vec<&str>> = units
            .iter()
            .map(|u| u.iter().map(|(n, _)| n.as_str()).collect())
            .collect();
        assert_eq!(
            names,
            vec![
                vec!["bn1.weight", "conv1.weight"],
                vec!["layer1.0.conv1.weight"],
                vec!["layer1.1.bn2.bias"],
                vec!["fc.bias"],
            ]
        );
    }

    #[rstest]
    #[case::orphan(&["head.weight", "stray.weight"], "'stray.weight' belongs to no stage")]
    #[case::prefix_is_not_a_name_prefix(&["blocks.10.w"], "'blocks.10.w' belongs to no stage")]
    fn a_parameter_outside_every_stage_is_an_error(#[case] names: &[&str], #[case] want: &str) {
        let stages = numbered_stages("blocks", 2, &["head"]);
        let e = unit_layouts(&stages, &shapes(names))
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{e}");
    }

    #[test]
    fn numbered_stages_have_an_empty_stem_and_a_head() {
        assert_eq!(
            numbered_stages("layers", 2, &["head"]),
            vec![
                vec![],
                vec!["layers.0".to_string()],
                vec!["layers.1".to_string()],
                vec!["head".to_string()]
            ]
        );
    }

    fn sized_stages() -> StageLayouts {
        [0usize, 5, 5, 20, 2]
            .iter()
            .enumerate()
            .map(|(k, &n)| match n {
                0 => Vec::new(),
                n => vec![(format!("s{k}"), vec![n])],
            })
            .collect()
    }

    #[rstest]
    #[case::one_per_stage(None, vec![0..1, 1..2, 2..3, 3..4, 4..5])]
    #[case::grouped_remainder_joins_the_last(Some(10), vec![0..3, 3..5])]
    #[case::each_stage_enough(Some(1), vec![0..2, 2..3, 3..4, 4..5])]
    #[case::more_than_the_model(Some(1000), vec![0..5])]
    fn the_size_policy_groups_consecutive_stages(
        #[case] min: Option<usize>,
        #[case] expected: Vec<std::ops::Range<usize>>,
    ) {
        assert_eq!(group_stages(&sized_stages(), min), expected);
    }
}
