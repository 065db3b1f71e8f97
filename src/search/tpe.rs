//! Optuna's `TPESampler`, followed closely: random trials until `n_startup_trials` have finished, then
//! split the finished trials into the best `gamma(n)` ("below") and the rest ("above"), fit a Parzen
//! estimator to each, draw `n_ei_candidates` from the good one and keep the candidate maximising
//! `l(x) / g(x)`. Pruned trials rank after completed ones by how far they got; running trials of the same
//! batch count as "above" (Optuna's constant liar), so a batch of `n_jobs` trials spreads out.

use super::distribution::{Choice, Distribution};
use super::parzen::{ParzenEstimator, ParzenParams};
use super::study::{Study, Trial, TrialState};
use indexmap::IndexMap;
use rand::Rng;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TpeConfig {
    pub consider_prior: bool,
    pub prior_weight: f64,
    pub consider_magic_clip: bool,
    pub consider_endpoints: bool,
    pub n_startup_trials: usize,
    pub n_ei_candidates: usize,
    /// One joint estimator over all parameters instead of one per parameter.
    pub multivariate: bool,
    pub constant_liar: bool,
}

impl Default for TpeConfig {
    /// hydra-optuna-sweeper's `TPESamplerConfig` defaults (Optuna's, but univariate).
    fn default() -> Self {
        TpeConfig {
            consider_prior: true,
            prior_weight: 1.0,
            consider_magic_clip: true,
            consider_endpoints: false,
            n_startup_trials: 10,
            n_ei_candidates: 24,
            multivariate: false,
            constant_liar: true,
        }
    }
}

/// Optuna's `default_gamma`: the best 10% of finished trials, at most 25.
pub fn default_gamma(n: usize) -> usize {
    (n as f64 * 0.1).ceil().min(25.0) as usize
}

/// Values for trial `number`, or `None` while fewer than `n_startup_trials` trials have finished (the
/// caller then samples at random, as Optuna does).
pub fn sample(
    cfg: &TpeConfig,
    study: &Study,
    number: usize,
    rng: &mut impl Rng,
) -> Option<IndexMap<String, Choice>> {
    if study.finished_count() < cfg.n_startup_trials || study.space.is_empty() {
        return None;
    }
    let names: Vec<&String> = study.space.keys().collect();
    let groups: Vec<Vec<&String>> = if cfg.multivariate {
        vec![names]
    } else {
        names.into_iter().map(|n| vec![n]).collect()
    };
    let mut out = IndexMap::new();
    for group in groups {
        for (name, value) in sample_group(cfg, study, number, &group, rng) {
            out.insert(name, value);
        }
    }
    Some(out)
}

fn sample_group(
    cfg: &TpeConfig,
    study: &Study,
    number: usize,
    group: &[&String],
    rng: &mut impl Rng,
) -> Vec<(String, Choice)> {
    let dists: Vec<&Distribution> = group.iter().map(|n| &study.space[n.as_str()]).collect();
    let usable = |t: &&Trial| {
        let state_ok = match t.state {
            TrialState::Complete => t.value.is_some_and(|v| !v.is_nan()),
            TrialState::Pruned => true,
            TrialState::Running => cfg.constant_liar && t.number != number,
            TrialState::Fail => false,
        };
        state_ok
            && group.iter().zip(&dists).all(|(n, d)| {
                t.params
                    .get(n.as_str())
                    .and_then(|v| d.to_internal(v))
                    .is_some()
            })
    };
    let trials: Vec<&Trial> = study.trials.iter().filter(usable).collect();
    let n = trials
        .iter()
        .filter(|t| t.state != TrialState::Running)
        .count();
    let (below, above) = split(study, &trials, default_gamma(n));
    let observe = |ts: &[&Trial]| -> Vec<Vec<f64>> {
        ts.iter()
            .map(|t| {
                group
                    .iter()
                    .zip(&dists)
                    .map(|(n, d)| d.to_internal(&t.params[n.as_str()]).unwrap_or(f64::NAN))
                    .collect()
            })
            .collect()
    };
    let params = ParzenParams {
        consider_prior: cfg.consider_prior,
        prior_weight: cfg.prior_weight,
        consider_magic_clip: cfg.consider_magic_clip,
        consider_endpoints: cfg.consider_endpoints,
    };
    let l = ParzenEstimator::new(&observe(&below), &dists, params);
    let g = ParzenEstimator::new(&observe(&above), &dists, params);
    let candidates = l.sample(rng, cfg.n_ei_candidates.max(1));
    let best = candidates
        .iter()
        .map(|c| (c, l.log_pdf(c) - g.log_pdf(c)))
        .fold(
            None,
            |best: Option<(&Vec<f64>, f64)>, (c, score)| match best {
                Some((_, s)) if s >= score => best,
                _ => Some((c, score)),
            },
        )
        .map(|(c, _)| c.clone())
        .unwrap_or_default();
    group
        .iter()
        .zip(&dists)
        .zip(best)
        .map(|((n, d), x)| (n.to_string(), d.to_external(x)))
        .collect()
}

/// Optuna's `_split_trials`: the best `n_below` completed trials, then pruned ones by the last step
/// they reached and their value there; running trials always above. Both halves in trial order.
fn split<'a>(
    study: &Study,
    trials: &[&'a Trial],
    n_below: usize,
) -> (Vec<&'a Trial>, Vec<&'a Trial>) {
    let dir = study.direction();
    let mut complete: Vec<&Trial> = trials
        .iter()
        .copied()
        .filter(|t| t.state == TrialState::Complete)
        .collect();
    complete.sort_by(|a, b| {
        dir.loss(a.value.unwrap_or(f64::NAN))
            .total_cmp(&dir.loss(b.value.unwrap_or(f64::NAN)))
    });
    let mut pruned: Vec<&Trial> = trials
        .iter()
        .copied()
        .filter(|t| t.state == TrialState::Pruned)
        .collect();
    let score = |t: &Trial| match t.last_intermediate() {
        Some((step, v)) if v.is_nan() => (-(step as f64), f64::INFINITY),
        Some((step, v)) => (-(step as f64), dir.loss(v)),
        None => (1.0, 0.0),
    };
    pruned.sort_by(|a, b| {
        let (sa, sb) = (score(a), score(b));
        sa.0.total_cmp(&sb.0).then(sa.1.total_cmp(&sb.1))
    });
    let n_complete = n_below.min(complete.len());
    let n_pruned = (n_below - n_complete).min(pruned.len());
    let mut below: Vec<&Trial> = complete[..n_complete].to_vec();
    below.extend(&pruned[..n_pruned]);
    let mut above: Vec<&Trial> = complete[n_complete..].to_vec();
    above.extend(&pruned[n_pruned..]);
    above.extend(
        trials
            .iter()
            .copied()
            .filter(|t| t.state == TrialState::Running),
    );
    below.sort_by_key(|t| t.number);
    above.sort_by_key(|t| t.number);
    (below, above)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::study::Direction;
    use rand::SeedableRng;
    use std::collections::BTreeMap;

    fn trial(number: usize, x: f64, value: f64, state: TrialState) -> Trial {
        Trial {
            number,
            state,
            params: IndexMap::from([("x".to_string(), Choice::Float(x))]),
            value: Some(value),
            intermediate: BTreeMap::new(),
        }
    }

    #[test]
    fn gamma_is_optunas() {
        assert_eq!(
            [0, 1, 10, 11, 100, 1000].map(default_gamma),
            [0, 1, 1, 2, 10, 25]
        );
    }

    #[test]
    fn the_best_trials_are_below_running_ones_above() {
        let space = IndexMap::from([(
            "x".to_string(),
            Distribution::Float {
                low: 0.0,
                high: 1.0,
                log: false,
                step: None,
            },
        )]);
        let mut study = Study::new(space, Direction::Maximize);
        study.trials = vec![
            trial(0, 0.1, 1.0, TrialState::Complete),
            trial(1, 0.2, 5.0, TrialState::Complete),
            trial(2, 0.3, 3.0, TrialState::Complete),
            trial(3, 0.4, 0.0, TrialState::Running),
        ];
        let ts: Vec<&Trial> = study.trials.iter().collect();
        let (below, above) = split(&study, &ts, 2);
        assert_eq!(below.iter().map(|t| t.number).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(above.iter().map(|t| t.number).collect::<Vec<_>>(), [0, 3]);
    }

    #[test]
    fn after_startup_tpe_samples_near_the_good_trials() {
        let space = IndexMap::from([(
            "x".to_string(),
            Distribution::Float {
                low: 0.0,
                high: 10.0,
                log: false,
                step: None,
            },
        )]);
        let mut study = Study::new(space, Direction::Minimize);
        for i in 0..30 {
            let x = i as f64 / 3.0;
            study
                .trials
                .push(trial(i, x, (x - 7.0).powi(2), TrialState::Complete));
        }
        let cfg = TpeConfig::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let near = (0..50)
            .filter(|_| {
                let p = sample(&cfg, &study, 30, &mut rng).unwrap();
                matches!(p["x"], Choice::Float(x) if (x - 7.0).abs() < 1.5)
            })
            .count();
        assert!(near > 40, "{near} of 50 samples near the optimum");
        study.trials.truncate(5);
        assert!(
            sample(&cfg, &study, 5, &mut rng).is_none(),
            "startup: random"
        );
    }
}
