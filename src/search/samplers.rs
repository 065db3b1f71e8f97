//! The samplers `hydra/sweeper/sampler` chooses: `tpe` (the default), `random`, `grid`. A trial's random
//! numbers come from the seed and the trial's number, so a resumed study samples as an unbroken one would.

use super::distribution::{Choice, Distribution};
use super::study::{Study, TrialState};
use super::tpe::{self, TpeConfig};
use indexmap::IndexMap;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Debug, Clone, PartialEq)]
pub enum Sampler {
    Tpe {
        seed: Option<u64>,
        config: TpeConfig,
    },
    Random {
        seed: Option<u64>,
    },
    Grid {
        seed: Option<u64>,
    },
}

impl Sampler {
    pub fn name(&self) -> &'static str {
        match self {
            Sampler::Tpe { .. } => "TPESampler",
            Sampler::Random { .. } => "RandomSampler",
            Sampler::Grid { .. } => "GridSampler",
        }
    }

    fn rng(&self, number: usize) -> StdRng {
        let seed = match self {
            Sampler::Tpe { seed, .. } | Sampler::Random { seed } | Sampler::Grid { seed } => *seed,
        };
        match seed {
            Some(s) => StdRng::seed_from_u64(s.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ number as u64),
            None => StdRng::from_os_rng(),
        }
    }

    /// The grid's size, when this is the grid sampler (`None` for a continuous space: refused).
    pub fn grid_size(&self, space: &IndexMap<String, Distribution>) -> Option<usize> {
        space
            .values()
            .map(|d| d.grid().map(|g| g.len()))
            .try_fold(1usize, |acc, n| n.map(|n| acc.saturating_mul(n)))
    }

    /// Values for trial `number` of `study`.
    pub fn sample(&self, study: &Study, number: usize) -> IndexMap<String, Choice> {
        let mut rng = self.rng(number);
        match self {
            Sampler::Tpe { config, .. } => tpe::sample(config, study, number, &mut rng)
                .unwrap_or_else(|| sample_random(&study.space, &mut rng)),
            Sampler::Random { .. } => sample_random(&study.space, &mut rng),
            Sampler::Grid { .. } => sample_grid(study, &mut rng),
        }
    }
}

/// Optuna's `RandomSampler`: uniform in each parameter's (log) range, rounded onto its step.
pub fn sample_random(
    space: &IndexMap<String, Distribution>,
    rng: &mut impl Rng,
) -> IndexMap<String, Choice> {
    space
        .iter()
        .map(|(name, d)| (name.clone(), random_value(d, rng)))
        .collect()
}

fn random_value(d: &Distribution, rng: &mut impl Rng) -> Choice {
    let u: f64 = rng.random();
    match d {
        Distribution::Categorical { choices } => {
            choices[((u * choices.len() as f64) as usize).min(choices.len() - 1)].clone()
        }
        Distribution::Float {
            low,
            high,
            log: true,
            ..
        } => Choice::Float(
            (low.ln() + u * (high.ln() - low.ln()))
                .exp()
                .clamp(*low, *high),
        ),
        Distribution::Float {
            low, step: Some(s), ..
        } => {
            let hi = d.stepped_high();
            let x = (low - s / 2.0) + u * (hi - low + s);
            Choice::Float((low + ((x - low) / s).round() * s).clamp(*low, hi))
        }
        Distribution::Float { low, high, .. } => Choice::Float(low + u * (high - low)),
        Distribution::Int { low, log: true, .. } => {
            let hi = d.stepped_high();
            let (a, b) = ((*low as f64 - 0.5).ln(), (hi + 0.5).ln());
            Choice::Int(((a + u * (b - a)).exp().round() as i64).clamp(*low, hi as i64))
        }
        Distribution::Int { low, step, .. } => {
            let hi = d.stepped_high();
            let s = *step as f64;
            let x = (*low as f64 - s / 2.0) + u * (hi - *low as f64 + s);
            let k = ((x - *low as f64) / s).round() as i64;
            Choice::Int((low + k * step).clamp(*low, hi as i64))
        }
    }
}

/// Optuna's `GridSampler`: a random grid point no trial has taken yet (any point once all are taken).
fn sample_grid(study: &Study, rng: &mut impl Rng) -> IndexMap<String, Choice> {
    let axes: Vec<(&String, Vec<Choice>)> = study
        .space
        .iter()
        .map(|(n, d)| (n, d.grid().unwrap_or_default()))
        .collect();
    let size: usize = axes.iter().map(|(_, a)| a.len().max(1)).product();
    let point = |mut id: usize| -> IndexMap<String, Choice> {
        let mut out = IndexMap::new();
        for (name, axis) in axes.iter().rev() {
            let n = axis.len().max(1);
            if let Some(v) = axis.get(id % n) {
                out.insert(name.to_string(), v.clone());
            }
            id /= n;
        }
        out.reverse();
        out
    };
    let taken = |p: &IndexMap<String, Choice>| {
        study
            .trials
            .iter()
            .filter(|t| t.state != TrialState::Fail)
            .any(|t| &t.params == p)
    };
    let free: Vec<usize> = (0..size).filter(|&id| !taken(&point(id))).collect();
    let id = match free.is_empty() {
        true => rng.random_range(0..size),
        false => free[rng.random_range(0..free.len())],
    };
    point(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::study::Direction;

    #[test]
    fn random_values_stay_in_range_on_their_steps() {
        let mut rng = StdRng::seed_from_u64(3);
        let space = IndexMap::from([
            (
                "lr".to_string(),
                Distribution::Float {
                    low: 1e-4,
                    high: 1e-1,
                    log: true,
                    step: None,
                },
            ),
            (
                "bs".to_string(),
                Distribution::Int {
                    low: 16,
                    high: 100,
                    log: false,
                    step: 16,
                },
            ),
            (
                "w".to_string(),
                Distribution::Float {
                    low: 0.5,
                    high: 5.5,
                    log: false,
                    step: Some(1.0),
                },
            ),
        ]);
        let mut seen_top = false;
        for _ in 0..500 {
            let p = sample_random(&space, &mut rng);
            let Choice::Float(lr) = p["lr"] else { panic!() };
            let Choice::Int(bs) = p["bs"] else { panic!() };
            let Choice::Float(w) = p["w"] else { panic!() };
            assert!((1e-4..=1e-1).contains(&lr));
            assert!(bs % 16 == 0 && (16..=96).contains(&bs), "{bs}");
            assert!((w - 0.5).fract() == 0.0 && (0.5..=5.5).contains(&w), "{w}");
            seen_top |= w == 5.5;
        }
        assert!(seen_top, "the end of a stepped range is sampled");
    }

    #[test]
    fn the_grid_sampler_visits_every_point_once() {
        let space = IndexMap::from([
            (
                "a".to_string(),
                Distribution::Int {
                    low: 1,
                    high: 3,
                    log: false,
                    step: 1,
                },
            ),
            (
                "b".to_string(),
                Distribution::Categorical {
                    choices: vec![Choice::Str("x".into()), Choice::Str("y".into())],
                },
            ),
        ]);
        let sampler = Sampler::Grid { seed: Some(1) };
        assert_eq!(sampler.grid_size(&space), Some(6));
        let mut study = Study::new(space, Direction::Minimize);
        for n in 0..6 {
            let p = sampler.sample(&study, n);
            study.add_running(n, p);
        }
        let mut points: Vec<String> = study
            .trials
            .iter()
            .map(|t| format!("{}{}", t.params["a"], t.params["b"]))
            .collect();
        points.sort();
        assert_eq!(points, ["1x", "1y", "2x", "2y", "3x", "3y"]);
    }
}
