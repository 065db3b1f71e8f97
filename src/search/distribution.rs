//! Search-space distributions, Optuna's `FloatDistribution` / `IntDistribution` / `CategoricalDistribution`.
//! Samplers work on an internal `f64` (the value, or a categorical's index); trials keep the external value.

use serde::{Deserialize, Serialize};
use std::fmt;

/// One categorical choice, as a search space names it (and an override prints it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Choice {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Choice::Null => write!(f, "null"),
            Choice::Bool(b) => write!(f, "{b}"),
            Choice::Int(i) => write!(f, "{i}"),
            Choice::Float(x) => write!(f, "{}", float_text(*x)),
            Choice::Str(s) => write!(f, "{s}"),
        }
    }
}

/// A float as Python prints it (`1.0`, not `1`), so overrides keep the type.
pub fn float_text(x: f64) -> String {
    if x.is_finite() && x == x.trunc() && x.abs() < 1e16 {
        format!("{x:.1}")
    } else {
        format!("{x}")
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Distribution {
    /// `low..=high`, on a log scale or in steps of `step` (from `low`).
    Float {
        low: f64,
        high: f64,
        log: bool,
        step: Option<f64>,
    },
    /// Integers `low..=high` in steps of `step`, or on a log scale (step 1).
    Int {
        low: i64,
        high: i64,
        log: bool,
        step: i64,
    },
    Categorical {
        choices: Vec<Choice>,
    },
}

impl Distribution {
    /// Refuse what Optuna refuses (empty ranges, log with a step or a non-positive low), in its words.
    pub fn check(&self) -> Result<(), String> {
        match self {
            Distribution::Float {
                low,
                high,
                log,
                step,
            } => {
                if low.is_nan() || high.is_nan() || low > high {
                    return Err(format!(
                        "`low <= high` must hold, but got (low, high)=({low}, {high})"
                    ));
                }
                if *log && *low <= 0.0 {
                    return Err(format!(
                        "a log distribution needs `low > 0.0`, but got low={low}"
                    ));
                }
                if let Some(s) = step {
                    if *log {
                        return Err("`step` and `log` cannot be used together".into());
                    }
                    if *s <= 0.0 {
                        return Err(format!("`step` must be positive, but got {s}"));
                    }
                }
                Ok(())
            }
            Distribution::Int {
                low,
                high,
                log,
                step,
            } => {
                if low > high {
                    return Err(format!(
                        "`low <= high` must hold, but got (low, high)=({low}, {high})"
                    ));
                }
                if *log && (*low < 1 || *step != 1) {
                    return Err("a log int distribution needs `low >= 1` and step 1".into());
                }
                if *step <= 0 {
                    return Err(format!("`step` must be positive, but got {step}"));
                }
                Ok(())
            }
            Distribution::Categorical { choices } if choices.is_empty() => {
                Err("a categorical distribution needs at least one choice".into())
            }
            Distribution::Categorical { .. } => Ok(()),
        }
    }

    /// The highest value a stepped range reaches (Optuna rounds `high` down onto the grid).
    pub fn stepped_high(&self) -> f64 {
        match self {
            Distribution::Float {
                low,
                high,
                step: Some(s),
                ..
            } => low + ((high - low) / s + 1e-9).floor() * s,
            Distribution::Float { high, .. } => *high,
            Distribution::Int {
                low, high, step, ..
            } => (low + (high - low) / step * step) as f64,
            Distribution::Categorical { choices } => (choices.len() - 1) as f64,
        }
    }

    /// The value a sampler's internal number stands for.
    pub fn to_external(&self, internal: f64) -> Choice {
        match self {
            Distribution::Float { .. } => Choice::Float(internal),
            Distribution::Int { .. } => Choice::Int(internal.round() as i64),
            Distribution::Categorical { choices } => {
                choices[(internal.round().max(0.0) as usize).min(choices.len() - 1)].clone()
            }
        }
    }

    /// A trial's value as a sampler's internal number (`None` when it is not in this distribution).
    pub fn to_internal(&self, value: &Choice) -> Option<f64> {
        match (self, value) {
            (Distribution::Categorical { choices }, v) => {
                choices.iter().position(|c| c == v).map(|i| i as f64)
            }
            (_, Choice::Int(i)) => Some(*i as f64),
            (_, Choice::Float(x)) => Some(*x),
            _ => None,
        }
    }

    /// Every value, for the grid sampler; `None` for a continuous distribution.
    pub fn grid(&self) -> Option<Vec<Choice>> {
        match self {
            Distribution::Categorical { choices } => Some(choices.clone()),
            Distribution::Int {
                low,
                high,
                step,
                log: _,
            } => Some(
                (0..=(high - low) / step)
                    .map(|i| Choice::Int(low + i * step))
                    .collect(),
            ),
            Distribution::Float {
                low, step: Some(s), ..
            } => {
                let n = ((self.stepped_high() - low) / s).round() as i64;
                Some((0..=n).map(|i| Choice::Float(low + i as f64 * s)).collect())
            }
            Distribution::Float { .. } => None,
        }
    }

    /// How the plugin's docs name the distribution (for messages and the logbook).
    pub fn describe(&self) -> String {
        match self {
            Distribution::Float {
                low,
                high,
                log: true,
                ..
            } => format!("log-uniform float [{low}, {high}]"),
            Distribution::Float {
                low,
                high,
                step: Some(s),
                ..
            } => format!("float [{low}, {high}] step {s}"),
            Distribution::Float { low, high, .. } => format!("uniform float [{low}, {high}]"),
            Distribution::Int {
                low,
                high,
                log: true,
                ..
            } => format!("log-uniform int [{low}, {high}]"),
            Distribution::Int {
                low, high, step, ..
            } => format!("int [{low}, {high}] step {step}"),
            Distribution::Categorical { choices } => format!(
                "choice({})",
                choices
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stepped_ranges_include_their_end_and_round_high_down() {
        let d = Distribution::Int {
            low: 1,
            high: 10,
            log: false,
            step: 3,
        };
        assert_eq!(
            d.grid().unwrap(),
            vec![
                Choice::Int(1),
                Choice::Int(4),
                Choice::Int(7),
                Choice::Int(10)
            ]
        );
        let f = Distribution::Float {
            low: 0.5,
            high: 5.7,
            log: false,
            step: Some(1.0),
        };
        assert_eq!(f.stepped_high(), 5.5);
        assert_eq!(f.grid().unwrap().len(), 6);
        assert!(Distribution::Float {
            low: 0.0,
            high: 1.0,
            log: true,
            step: None
        }
        .check()
        .is_err());
    }

    #[test]
    fn choices_print_as_overrides_keep_their_type() {
        assert_eq!(Choice::Float(1.0).to_string(), "1.0");
        assert_eq!(Choice::Float(0.001).to_string(), "0.001");
        assert_eq!(Choice::Int(3).to_string(), "3");
        assert_eq!(Choice::Bool(true).to_string(), "true");
    }
}
