//! Optuna's `MedianPruner` (its `PercentilePruner` at 50): stop a trial whose best value so far is worse
//! than the median of what completed trials reported at the same step.

use super::study::{Direction, Study, Trial, TrialState};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MedianPruner {
    /// No pruning until this many trials have completed.
    pub n_startup_trials: usize,
    /// No pruning before this step (epoch) of a trial.
    pub n_warmup_steps: u64,
    /// Judge every `interval_steps` steps after the warm-up.
    pub interval_steps: u64,
    /// Completed trials that must have reported the step before it is judged.
    pub n_min_trials: usize,
}

impl Default for MedianPruner {
    fn default() -> Self {
        MedianPruner {
            n_startup_trials: 5,
            n_warmup_steps: 0,
            interval_steps: 1,
            n_min_trials: 1,
        }
    }
}

impl MedianPruner {
    /// Should `trial` (with its latest report in its `intermediate`) stop now? The reason when so.
    pub fn prune(&self, study: &Study, trial: &Trial) -> Option<String> {
        let completed: Vec<&Trial> = study
            .trials
            .iter()
            .filter(|t| t.state == TrialState::Complete && t.number != trial.number)
            .collect();
        if completed.is_empty() || completed.len() < self.n_startup_trials {
            return None;
        }
        let (step, _) = trial.last_intermediate()?;
        if step < self.n_warmup_steps || !self.first_in_interval(trial, step) {
            return None;
        }
        let dir = study.direction();
        let values = trial.intermediate.values().filter(|v| !v.is_nan());
        let best = match dir {
            Direction::Minimize => values.fold(f64::NAN, |a, &b| a.min(b)),
            Direction::Maximize => values.fold(f64::NAN, |a, &b| a.max(b)),
        };
        if best.is_nan() {
            return Some(format!("pruned at epoch {step}: it reported only NaN"));
        }
        let mut others: Vec<f64> = completed
            .iter()
            .filter_map(|t| t.intermediate.get(&step).copied())
            .filter(|v| !v.is_nan())
            .collect();
        if others.len() < self.n_min_trials.max(1) {
            return None;
        }
        others.sort_by(f64::total_cmp);
        let median = percentile(&others, 50.0);
        let worse = match dir {
            Direction::Minimize => best > median,
            Direction::Maximize => best < median,
        };
        worse.then(|| {
            format!(
                "pruned at epoch {step}: best so far {best:.6} is worse than the median {median:.6} of \
                 {} completed trials at that epoch",
                others.len()
            )
        })
    }

    /// Optuna's `_is_first_in_interval_step`: the first report at or after the latest interval mark.
    fn first_in_interval(&self, trial: &Trial, step: u64) -> bool {
        let interval = self.interval_steps.max(1);
        let nearest_lower =
            (step - self.n_warmup_steps) / interval * interval + self.n_warmup_steps;
        let second_last = trial
            .intermediate
            .keys()
            .rev()
            .nth(1)
            .map_or(-1i64, |s| *s as i64);
        second_last < nearest_lower as i64
    }
}

/// NumPy's default (linear) percentile of sorted values.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let pos = q / 100.0 * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use indexmap::IndexMap;
    use std::collections::BTreeMap;

    fn trial(number: usize, state: TrialState, curve: &[f64]) -> Trial {
        Trial {
            number,
            state,
            params: IndexMap::new(),
            value: curve.last().copied(),
            intermediate: curve
                .iter()
                .enumerate()
                .map(|(i, v)| (i as u64, *v))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    #[test]
    fn a_trial_below_the_median_of_completed_ones_is_pruned() {
        let mut study = Study::new(IndexMap::new(), Direction::Maximize);
        for (i, c) in [[0.5, 0.6], [0.4, 0.7], [0.6, 0.8]].iter().enumerate() {
            study.trials.push(trial(i, TrialState::Complete, c));
        }
        let pruner = MedianPruner {
            n_startup_trials: 3,
            ..MedianPruner::default()
        };
        let bad = trial(3, TrialState::Running, &[0.3]);
        assert!(pruner
            .prune(&study, &bad)
            .unwrap()
            .contains("median 0.500000"));
        let good = trial(4, TrialState::Running, &[0.55]);
        assert_eq!(pruner.prune(&study, &good), None);
        let strict = MedianPruner {
            n_startup_trials: 4,
            ..MedianPruner::default()
        };
        assert_eq!(
            strict.prune(&study, &bad),
            None,
            "still in the startup trials"
        );
        let warm = MedianPruner {
            n_startup_trials: 3,
            n_warmup_steps: 1,
            ..MedianPruner::default()
        };
        assert_eq!(warm.prune(&study, &bad), None, "still warming up");
    }

    #[test]
    fn percentile_is_numpys_linear_one() {
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 50.0), 2.5);
        assert_eq!(percentile(&[1.0], 50.0), 1.0);
    }
}
