//! The truncated normal distribution in log space, as Optuna's `_truncnorm` computes it (itself after
//! SciPy's): the log of a Gaussian's mass between two points (accurate in both tails), the log density,
//! and the inverse CDF by Newton's method on `log_ndtr`. Standardised: bounds `a`, `b` in units of sigma.

use std::f64::consts::PI;

const LOG_SQRT_2PI: f64 = 0.918_938_533_204_672_8; // ln(sqrt(2 pi))

/// The standard normal CDF.
fn ndtr(a: f64) -> f64 {
    let x = a / std::f64::consts::SQRT_2;
    if x < -std::f64::consts::FRAC_1_SQRT_2 {
        0.5 * libm::erfc(-x)
    } else if x < std::f64::consts::FRAC_1_SQRT_2 {
        0.5 + 0.5 * libm::erf(x)
    } else {
        1.0 - 0.5 * libm::erfc(x)
    }
}

/// `ln(ndtr(a))`, with the asymptotic series far in the left tail.
pub fn log_ndtr(a: f64) -> f64 {
    if a > 6.0 {
        return -ndtr(-a);
    }
    if a > -20.0 {
        return ndtr(a).ln();
    }
    let log_lhs = -0.5 * a * a - (-a).ln() - 0.5 * (2.0 * PI).ln();
    let (mut last, mut rhs, mut numerator, mut denom) = (0.0f64, 1.0f64, 1.0f64, 1.0f64);
    let denom_cons = 1.0 / (a * a);
    let mut sign = 1.0;
    let mut i = 0.0;
    while (last - rhs).abs() > f64::EPSILON {
        i += 1.0;
        last = rhs;
        sign = -sign;
        denom *= denom_cons;
        numerator *= 2.0 * i - 1.0;
        rhs += sign * numerator * denom;
    }
    log_lhs + rhs.ln()
}

fn log_diff(log_p: f64, log_q: f64) -> f64 {
    log_p + (-(log_q - log_p).exp()).ln_1p()
}

fn log_sum(log_p: f64, log_q: f64) -> f64 {
    let m = log_p.max(log_q);
    if m == f64::NEG_INFINITY {
        return m;
    }
    m + ((log_p - m).exp() + (log_q - m).exp()).ln()
}

/// `ln(ndtr(b) - ndtr(a))`, working in the left tail where it is accurate.
pub fn log_gauss_mass(a: f64, b: f64) -> f64 {
    if b <= 0.0 {
        log_diff(log_ndtr(b), log_ndtr(a))
    } else if a > 0.0 {
        log_diff(log_ndtr(-a), log_ndtr(-b))
    } else {
        (-ndtr(a) - ndtr(-b)).ln_1p()
    }
}

/// The log density at `x` of a normal (`loc`, `scale`) truncated to `[a, b]` (standardised bounds).
pub fn logpdf(x: f64, a: f64, b: f64, loc: f64, scale: f64) -> f64 {
    let z = (x - loc) / scale;
    if a == b {
        return f64::NAN;
    }
    if z < a || z > b {
        return f64::NEG_INFINITY;
    }
    -(z * z) / 2.0 - LOG_SQRT_2PI - log_gauss_mass(a, b) - scale.ln()
}

/// `x` such that `log_ndtr(x) = y`.
fn ndtri_exp(y: f64) -> f64 {
    let flipped = y > -1e-2;
    let z = if flipped { (-y.exp_m1()).ln() } else { y };
    let mut x = if z < -5.0 {
        -(-2.0 * (z + LOG_SQRT_2PI)).sqrt()
    } else {
        -(3f64.sqrt() / PI) * (-z).exp_m1().ln()
    };
    for _ in 0..100 {
        let log_ndtr_x = log_ndtr(x);
        let log_pdf_x = -0.5 * x * x - LOG_SQRT_2PI;
        let dx = (log_ndtr_x - z) * (log_ndtr_x - log_pdf_x).exp();
        x -= dx;
        if dx.abs() < 1e-8 * x.abs() {
            break;
        }
    }
    if flipped {
        -x
    } else {
        x
    }
}

/// The point below which a fraction `q` of the standard normal truncated to `[a, b]` lies.
pub fn ppf(q: f64, a: f64, b: f64) -> f64 {
    if a == b {
        return f64::NAN;
    }
    if q == 0.0 {
        return a;
    }
    if q == 1.0 {
        return b;
    }
    let log_mass = log_gauss_mass(a, b);
    if a < 0.0 {
        ndtri_exp(log_sum(log_ndtr(a), q.ln() + log_mass))
    } else {
        -ndtri_exp(log_sum(log_ndtr(-b), (-q).ln_1p() + log_mass))
    }
}

/// A draw from a normal (`loc`, `scale`) truncated to the standardised `[a, b]`, from a uniform `u`.
pub fn sample(u: f64, a: f64, b: f64, loc: f64, scale: f64) -> f64 {
    ppf(u, a, b) * scale + loc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mass_and_quantiles_match_the_normal_distribution() {
        // Reference values from SciPy's truncnorm / norm.
        assert!((log_gauss_mass(-1.0, 1.0) - 0.682_689_492_137_085_9_f64.ln()).abs() < 1e-12);
        assert!((log_gauss_mass(3.0, 40.0) - 0.001_349_898_031_630_094_6_f64.ln()).abs() < 1e-9);
        assert!((log_ndtr(-30.0) - (-454.321_243_956_343_1)).abs() < 1e-9);
        assert!((ppf(0.5, -1.0, 1.0)).abs() < 1e-9);
        assert!((ppf(0.975, -50.0, 50.0) - 1.959_963_984_540_054).abs() < 1e-7);
        // The quantile inverts the CDF, in both tails.
        for (a, b) in [(-2.0, 0.5), (1.0, 4.0), (-8.0, -6.0), (6.0, 9.0)] {
            for q in [0.01, 0.3, 0.7, 0.99] {
                let x = ppf(q, a, b);
                let back = (log_gauss_mass(a, x) - log_gauss_mass(a, b)).exp();
                assert!((back - q).abs() < 1e-6, "a={a} b={b} q={q}: {back}");
                assert!(x >= a && x <= b);
            }
        }
    }

    #[test]
    fn the_density_integrates_to_one_on_its_interval() {
        let (a, b, loc, scale) = (-0.5, 2.0, 1.0, 0.7);
        let (lo, hi) = (loc + a * scale, loc + b * scale);
        let n = 20_000;
        let h = (hi - lo) / n as f64;
        let total: f64 = (0..n)
            .map(|i| logpdf(lo + (i as f64 + 0.5) * h, a, b, loc, scale).exp() * h)
            .sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        assert_eq!(logpdf(hi + 0.1, a, b, loc, scale), f64::NEG_INFINITY);
    }
}
