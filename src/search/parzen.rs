//! Optuna's `_ParzenEstimator`: a mixture over the observed trials (plus a prior kernel) of products of
//! one kernel per parameter: truncated normals for numbers (on a log scale for log distributions,
//! integrated over a step's width for stepped ones), smoothed histograms for categories.

use super::distribution::Distribution;
use super::truncnorm;
use rand::Rng;

/// The TPE knobs that shape the estimator (Optuna's `_ParzenEstimatorParameters`).
#[derive(Debug, Clone, Copy)]
pub struct ParzenParams {
    pub consider_prior: bool,
    pub prior_weight: f64,
    pub consider_magic_clip: bool,
    pub consider_endpoints: bool,
}

/// Optuna's `default_weights`: older observations weigh less once there are more than 25.
pub fn default_weights(n: usize) -> Vec<f64> {
    if n < 25 {
        return vec![1.0; n];
    }
    let ramp = n - 25;
    let mut w: Vec<f64> = (0..ramp)
        .map(|i| {
            let (lo, hi) = (1.0 / n as f64, 1.0);
            if ramp == 1 {
                lo
            } else {
                lo + (hi - lo) * i as f64 / (ramp - 1) as f64
            }
        })
        .collect();
    w.extend(std::iter::repeat_n(1.0, 25));
    w
}

/// One parameter's kernels, one per mixture component.
enum Kernels {
    Categorical(Vec<Vec<f64>>),
    Numerical {
        mus: Vec<f64>,
        sigmas: Vec<f64>,
        /// The bounds in the kernel's space (log for log distributions, widened by half a step).
        low: f64,
        high: f64,
        log: bool,
        /// The step and the untransformed bounds, for stepped distributions.
        step: Option<(f64, f64, f64)>,
    },
}

pub struct ParzenEstimator {
    weights: Vec<f64>,
    kernels: Vec<Kernels>,
}

impl ParzenEstimator {
    /// Fit on `observations[i][p]`: the internal value of parameter `p` in observed trial `i`.
    pub fn new(
        observations: &[Vec<f64>],
        space: &[&Distribution],
        params: ParzenParams,
    ) -> ParzenEstimator {
        let n = observations.len();
        let prior = if params.consider_prior || n == 0 {
            params.prior_weight
        } else {
            0.0
        };
        let mut weights = if n == 0 {
            vec![1.0]
        } else {
            let mut w = default_weights(n);
            w.push(prior);
            w
        };
        let total: f64 = weights.iter().sum();
        weights.iter_mut().for_each(|w| *w /= total);
        let kernels = space
            .iter()
            .enumerate()
            .map(|(p, dist)| {
                let column: Vec<f64> = observations.iter().map(|o| o[p]).collect();
                kernels_for(&column, dist, params)
            })
            .collect();
        ParzenEstimator { weights, kernels }
    }

    /// `size` draws, each a vector of internal values.
    pub fn sample(&self, rng: &mut impl Rng, size: usize) -> Vec<Vec<f64>> {
        (0..size)
            .map(|_| {
                let k = pick(rng, &self.weights);
                self.kernels
                    .iter()
                    .map(|kern| match kern {
                        Kernels::Categorical(rows) => pick(rng, &rows[k]) as f64,
                        Kernels::Numerical {
                            mus,
                            sigmas,
                            low,
                            high,
                            log,
                            step,
                        } => {
                            let (mu, sigma) = (mus[k], sigmas[k]);
                            let u: f64 = rng.random();
                            let mut x = truncnorm::sample(
                                u,
                                (low - mu) / sigma,
                                (high - mu) / sigma,
                                mu,
                                sigma,
                            );
                            if *log {
                                x = x.exp();
                            }
                            if let Some((s, lo, hi)) = step {
                                x = (lo + ((x - lo) / s).round() * s).clamp(*lo, *hi);
                            }
                            x
                        }
                    })
                    .collect()
            })
            .collect()
    }

    /// The mixture's log density at `x` (internal values).
    pub fn log_pdf(&self, x: &[f64]) -> f64 {
        let per_component: Vec<f64> = self
            .weights
            .iter()
            .enumerate()
            .map(|(k, w)| {
                let mut lp = w.ln();
                for (kern, &xi) in self.kernels.iter().zip(x) {
                    lp += match kern {
                        Kernels::Categorical(rows) => rows[k][xi as usize].ln(),
                        Kernels::Numerical {
                            mus,
                            sigmas,
                            low,
                            high,
                            log,
                            step,
                        } => {
                            let (mu, sigma) = (mus[k], sigmas[k]);
                            let (a, b) = ((low - mu) / sigma, (high - mu) / sigma);
                            match step {
                                None => {
                                    let xt = if *log { xi.ln() } else { xi };
                                    truncnorm::logpdf(xt, a, b, mu, sigma)
                                }
                                Some((s, _, _)) => {
                                    let (mut l, mut r) = (xi - s / 2.0, xi + s / 2.0);
                                    if *log {
                                        (l, r) = (l.ln(), r.ln());
                                    }
                                    truncnorm::log_gauss_mass((l - mu) / sigma, (r - mu) / sigma)
                                        - truncnorm::log_gauss_mass(a, b)
                                }
                            }
                        }
                    };
                }
                lp
            })
            .collect();
        let max = per_component
            .iter()
            .cloned()
            .fold(f64::NEG_INFINITY, f64::max);
        let max = if max == f64::NEG_INFINITY { 0.0 } else { max };
        per_component
            .iter()
            .map(|v| (v - max).exp())
            .sum::<f64>()
            .ln()
            + max
    }
}

/// An index drawn with these (normalised) probabilities.
fn pick(rng: &mut impl Rng, probs: &[f64]) -> usize {
    let u: f64 = rng.random();
    let mut acc = 0.0;
    for (i, p) in probs.iter().enumerate() {
        acc += p;
        if u < acc {
            return i;
        }
    }
    probs.iter().rposition(|p| *p > 0.0).unwrap_or(0)
}

fn kernels_for(obs: &[f64], dist: &Distribution, params: ParzenParams) -> Kernels {
    let n_kernels = obs.len() + 1;
    match dist {
        Distribution::Categorical { choices } => {
            let k = choices.len();
            if obs.is_empty() {
                return Kernels::Categorical(vec![vec![1.0 / k as f64; k]]);
            }
            let base = params.prior_weight / n_kernels as f64;
            let mut rows: Vec<Vec<f64>> = obs
                .iter()
                .map(|&o| {
                    let mut row = vec![base; k];
                    row[o as usize] += 1.0;
                    row
                })
                .collect();
            rows.push(vec![base; k]);
            for row in &mut rows {
                let s: f64 = row.iter().sum();
                if s > 0.0 {
                    row.iter_mut().for_each(|v| *v /= s);
                } else {
                    row.iter_mut().for_each(|v| *v = 1.0 / k as f64);
                }
            }
            Kernels::Categorical(rows)
        }
        _ => numerical_kernels(obs, dist, params),
    }
}

fn numerical_kernels(obs: &[f64], dist: &Distribution, params: ParzenParams) -> Kernels {
    let (low0, high0, log, step) = match dist {
        Distribution::Float { low, log, step, .. } => (*low, dist.stepped_high(), *log, *step),
        Distribution::Int { low, log, step, .. } => {
            (*low as f64, dist.stepped_high(), *log, Some(*step as f64))
        }
        Distribution::Categorical { .. } => unreachable!("categorical kernels are built apart"),
    };
    let (mut low, mut high) = (low0, high0);
    if let Some(s) = step {
        low -= s / 2.0;
        high += s / 2.0;
    }
    let mus: Vec<f64> = if log {
        (low, high) = (low.ln(), high.ln());
        obs.iter().map(|o| o.ln()).collect()
    } else {
        obs.to_vec()
    };
    let mut sigmas = compute_sigmas(&mus, low, high, params);
    let mut mus = mus;
    mus.push(0.5 * (low + high));
    sigmas.push(high - low);
    Kernels::Numerical {
        mus,
        sigmas,
        low,
        high,
        log,
        step: step.map(|s| (s, low0, high0)),
    }
}

/// Each kernel's bandwidth: the larger gap to its sorted neighbours (the range's ends count as
/// neighbours only with `consider_endpoints`), clipped by Optuna's "magic clip".
fn compute_sigmas(mus: &[f64], low: f64, high: f64, params: ParzenParams) -> Vec<f64> {
    let n = mus.len();
    if n == 0 {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| mus[a].total_cmp(&mus[b]));
    let mut with_ends = Vec::with_capacity(n + 2);
    with_ends.push(low);
    with_ends.extend(order.iter().map(|&i| mus[i]));
    with_ends.push(high);
    let mut sorted_sigmas: Vec<f64> = (1..=n)
        .map(|i| (with_ends[i] - with_ends[i - 1]).max(with_ends[i + 1] - with_ends[i]))
        .collect();
    if !params.consider_endpoints && with_ends.len() >= 4 {
        sorted_sigmas[0] = with_ends[2] - with_ends[1];
        sorted_sigmas[n - 1] = with_ends[n] - with_ends[n - 1];
    }
    let max_sigma = high - low;
    let min_sigma = if params.consider_magic_clip {
        (high - low) / 100f64.min(1.0 + (n + 1) as f64)
    } else {
        1e-12
    };
    let mut sigmas = vec![0.0; n];
    for (rank, &i) in order.iter().enumerate() {
        sigmas[i] = sorted_sigmas[rank].clamp(min_sigma, max_sigma);
    }
    sigmas
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    const P: ParzenParams = ParzenParams {
        consider_prior: true,
        prior_weight: 1.0,
        consider_magic_clip: true,
        consider_endpoints: false,
    };

    #[test]
    fn weights_ramp_after_25_observations() {
        assert_eq!(default_weights(3), vec![1.0; 3]);
        let w = default_weights(30);
        assert_eq!(w.len(), 30);
        assert!((w[0] - 1.0 / 30.0).abs() < 1e-12 && w[4] == 1.0 && w[29] == 1.0);
    }

    #[test]
    fn bandwidths_follow_optunas_rules() {
        // Optuna: mus [0.2, 0.5, 0.9] on [0, 1] -> sorted gaps; first/last use the inner gap.
        let s = compute_sigmas(&[0.5, 0.2, 0.9], 0.0, 1.0, P);
        assert!((s[1] - 0.3).abs() < 1e-12, "{s:?}");
        assert!((s[0] - 0.4).abs() < 1e-12, "{s:?}");
        assert!((s[2] - 0.4).abs() < 1e-12, "{s:?}");
        // Magic clip: no sigma below range / min(100, 1 + n_kernels).
        let s = compute_sigmas(&[0.5, 0.5001], 0.0, 1.0, P);
        assert!(s.iter().all(|&x| (x - 0.25).abs() < 1e-12), "{s:?}");
    }

    #[test]
    fn the_density_is_a_density_and_samples_stay_in_range() {
        let d = Distribution::Float {
            low: -2.0,
            high: 3.0,
            log: false,
            step: None,
        };
        let pe = ParzenEstimator::new(&[vec![0.0], vec![1.5], vec![2.9]], &[&d], P);
        let n = 20_000;
        let h = 5.0 / n as f64;
        let total: f64 = (0..n)
            .map(|i| pe.log_pdf(&[-2.0 + (i as f64 + 0.5) * h]).exp() * h)
            .sum();
        assert!((total - 1.0).abs() < 1e-4, "{total}");
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        for s in pe.sample(&mut rng, 500) {
            assert!((-2.0..=3.0).contains(&s[0]));
        }
        let i = Distribution::Int {
            low: 1,
            high: 100,
            log: true,
            step: 1,
        };
        let pe = ParzenEstimator::new(&[vec![3.0], vec![50.0]], &[&i], P);
        let mass: f64 = (1..=100).map(|k| pe.log_pdf(&[k as f64]).exp()).sum();
        assert!((mass - 1.0).abs() < 1e-9, "{mass}");
        for s in pe.sample(&mut rng, 500) {
            assert!(s[0] == s[0].round() && (1.0..=100.0).contains(&s[0]));
        }
    }
}
