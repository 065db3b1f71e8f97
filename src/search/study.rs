//! A study: the search space, the direction, and its trials (asked, running, told), as Optuna keeps them.

use super::distribution::{Choice, Distribution};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Minimize,
    Maximize,
}

impl Direction {
    /// Is `a` better than `b`?
    pub fn better(self, a: f64, b: f64) -> bool {
        match self {
            Direction::Minimize => a < b,
            Direction::Maximize => a > b,
        }
    }

    /// The value as a loss (smaller is better).
    pub fn loss(self, v: f64) -> f64 {
        match self {
            Direction::Minimize => v,
            Direction::Maximize => -v,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrialState {
    Running,
    Complete,
    Pruned,
    Fail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    pub number: usize,
    pub state: TrialState,
    /// The sampled values, in the search space's order.
    pub params: IndexMap<String, Choice>,
    pub value: Option<f64>,
    /// What the trial reported along the way (the pruner's input), by step (epoch).
    pub intermediate: BTreeMap<u64, f64>,
}

impl Trial {
    /// The last reported step and its value.
    pub fn last_intermediate(&self) -> Option<(u64, f64)> {
        self.intermediate.iter().next_back().map(|(s, v)| (*s, *v))
    }
}

#[derive(Debug, Clone, Default)]
pub struct Study {
    pub space: IndexMap<String, Distribution>,
    pub direction: Option<Direction>,
    pub trials: Vec<Trial>,
}

impl Study {
    pub fn new(space: IndexMap<String, Distribution>, direction: Direction) -> Study {
        Study {
            space,
            direction: Some(direction),
            trials: Vec::new(),
        }
    }

    pub fn direction(&self) -> Direction {
        self.direction.unwrap_or(Direction::Minimize)
    }

    pub fn trial(&self, number: usize) -> Option<&Trial> {
        self.trials.iter().find(|t| t.number == number)
    }

    pub fn trial_mut(&mut self, number: usize) -> Option<&mut Trial> {
        self.trials.iter_mut().find(|t| t.number == number)
    }

    /// Completed or pruned trials: what samplers learn from (Optuna's startup count too).
    pub fn finished_count(&self) -> usize {
        self.trials
            .iter()
            .filter(|t| matches!(t.state, TrialState::Complete | TrialState::Pruned))
            .count()
    }

    /// The best completed trial.
    pub fn best_trial(&self) -> Option<&Trial> {
        let dir = self.direction();
        self.trials
            .iter()
            .filter(|t| t.state == TrialState::Complete)
            .filter_map(|t| t.value.filter(|v| !v.is_nan()).map(|v| (t, v)))
            .fold(None, |best: Option<(&Trial, f64)>, (t, v)| match best {
                Some((_, bv)) if !dir.better(v, bv) => best,
                _ => Some((t, v)),
            })
            .map(|(t, _)| t)
    }

    /// Add a trial with these values (running until told).
    pub fn add_running(&mut self, number: usize, params: IndexMap<String, Choice>) {
        self.trials.retain(|t| t.number != number);
        self.trials.push(Trial {
            number,
            state: TrialState::Running,
            params,
            value: None,
            intermediate: BTreeMap::new(),
        });
        self.trials.sort_by_key(|t| t.number);
    }
}
