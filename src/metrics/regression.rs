//! Regression metrics over summed states (so the ranks' shares combine exactly): mean squared error
//! (`squared=False`: its root), mean absolute error, and R² with torchmetrics' handling of near-constant
//! targets and its `adjusted` and `multioutput` options. `preds` and `target` have the same shape (a
//! model's `(N, 1)` beside `(N,)` targets is taken as that); with one output, everything is flattened.

use super::inputs;
use super::{bad, states_of, Metric, Reduce, Result, State, Value};
use crate::tensor::HostTensor;

/// Mean squared (or absolute) error over every element seen.
pub struct MeanError {
    /// Squared (MSE) or absolute (MAE) differences.
    pub squared_differences: bool,
    /// With squared differences: the root of the mean (RMSE) when false (torchmetrics' `squared`).
    pub squared: bool,
    sum: State,
    total: State,
}

impl MeanError {
    pub fn mse(squared: bool) -> MeanError {
        MeanError {
            squared_differences: true,
            squared,
            sum: State::new("sum_squared_error", Reduce::Sum, vec![0.0]),
            total: State::new("total", Reduce::Sum, vec![0.0]),
        }
    }

    pub fn mae() -> MeanError {
        MeanError {
            squared_differences: false,
            squared: true,
            sum: State::new("sum_abs_error", Reduce::Sum, vec![0.0]),
            total: State::new("total", Reduce::Sum, vec![0.0]),
        }
    }
}

impl Metric for MeanError {
    fn update(&mut self, preds: &HostTensor, target: &HostTensor) -> Result<()> {
        let p = inputs::squeezed_like(preds, target)?;
        for (a, b) in p.iter().zip(&target.data) {
            let d = f64::from(*a) - f64::from(*b);
            self.sum.values[0] += if self.squared_differences {
                d * d
            } else {
                d.abs()
            };
        }
        self.total.values[0] += target.data.len() as f64;
        Ok(())
    }

    fn compute(&self) -> Result<Value> {
        let mean = self.sum.values[0] / self.total.values[0];
        Ok(Value::Scalar(match self.squared {
            true => mean,
            false => mean.sqrt(),
        }))
    }

    states_of!(sum, total);

    fn higher_is_better(&self) -> bool {
        false
    }
}

/// torchmetrics' `multioutput`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MultiOutput {
    RawValues,
    UniformAverage,
    VarianceWeighted,
}

/// R² (coefficient of determination), per output summed as torchmetrics keeps it: the targets' sum and
/// sum of squares, the residuals' sum of squares, the count.
pub struct R2Score {
    pub adjusted: usize,
    pub multioutput: MultiOutput,
    outputs: Option<usize>,
    sum_squared_obs: State,
    sum_obs: State,
    rss: State,
    total: State,
}

impl R2Score {
    pub fn new(adjusted: usize, multioutput: MultiOutput) -> R2Score {
        R2Score {
            adjusted,
            multioutput,
            outputs: None,
            // One output until a batch shows more (a rank that sees no sample keeps one: multi-output
            // R² over ranks with empty shares is not supported).
            sum_squared_obs: State::new("sum_squared_error", Reduce::Sum, vec![0.0]),
            sum_obs: State::new("sum_error", Reduce::Sum, vec![0.0]),
            rss: State::new("residual", Reduce::Sum, vec![0.0]),
            total: State::new("total", Reduce::Sum, vec![0.0]),
        }
    }
}

/// torch.isclose(x, 0, atol=1e-4) (rtol's term is 0 against zero).
fn near_zero(x: f64) -> bool {
    x.abs() <= 1e-4
}

impl Metric for R2Score {
    fn update(&mut self, preds: &HostTensor, target: &HostTensor) -> Result<()> {
        let p = inputs::squeezed_like(preds, target)?;
        let outputs = match target.shape.len() {
            0 | 1 => 1,
            2 => target.shape[1],
            _ => {
                return Err(bad(format!(
                    "R2Score expects 1D or 2D preds and target, got target of shape {:?}",
                    target.shape
                )))
            }
        };
        match self.outputs {
            Some(o) if o != outputs => {
                return Err(bad(format!(
                    "R2Score saw {o} output(s) earlier and {outputs} now (target shape {:?})",
                    target.shape
                )))
            }
            Some(_) => {}
            None if outputs == 1 => self.outputs = Some(1),
            None => {
                self.outputs = Some(outputs);
                for s in [&mut self.sum_squared_obs, &mut self.sum_obs, &mut self.rss] {
                    s.initial = vec![0.0; outputs];
                    s.values = vec![0.0; outputs];
                }
            }
        }
        for (i, (a, b)) in p.iter().zip(&target.data).enumerate() {
            let (a, b, o) = (f64::from(*a), f64::from(*b), i % outputs);
            self.sum_obs.values[o] += b;
            self.sum_squared_obs.values[o] += b * b;
            self.rss.values[o] += (b - a) * (b - a);
        }
        self.total.values[0] += (target.data.len() / outputs) as f64;
        Ok(())
    }

    fn compute(&self) -> Result<Value> {
        let n = self.total.values[0];
        if n < 2.0 {
            return Err(bad(
                "R2Score needs at least two samples to calculate r2 score",
            ));
        }
        let tss: Vec<f64> = self
            .sum_squared_obs
            .values
            .iter()
            .zip(&self.sum_obs.values)
            .map(|(sq, s)| sq - s * (s / n))
            .collect();
        let raw: Vec<f64> = self
            .rss
            .values
            .iter()
            .zip(&tss)
            .map(|(rss, tss)| match (near_zero(*rss), near_zero(*tss)) {
                (false, false) => 1.0 - rss / tss,
                (false, true) => 0.0,
                (true, _) => 1.0,
            })
            .collect();
        let r2 = match self.multioutput {
            MultiOutput::RawValues => return Ok(Value::Vector(raw)),
            MultiOutput::UniformAverage => raw.iter().sum::<f64>() / raw.len() as f64,
            MultiOutput::VarianceWeighted => {
                let total: f64 = tss.iter().sum();
                raw.iter().zip(&tss).map(|(r, t)| t / total * r).sum()
            }
        };
        let k = self.adjusted as f64;
        Ok(Value::Scalar(match self.adjusted {
            0 => r2,
            // torchmetrics warns and returns the plain score where the adjustment is undefined.
            _ if k >= n - 1.0 => r2,
            _ => 1.0 - (1.0 - r2) * (n - 1.0) / (n - k - 1.0),
        }))
    }

    states_of!(sum_squared_obs, sum_obs, rss, total);

    fn higher_is_better(&self) -> bool {
        true
    }

    fn is_scalar(&self) -> bool {
        self.multioutput != MultiOutput::RawValues
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::metrics::tensor as t;

    /// torchmetrics' docstring examples.
    #[test]
    fn documented_values() {
        let mut r2 = R2Score::new(0, MultiOutput::UniformAverage);
        r2.update(
            &t(&[4], &[2.5, 0.0, 2.0, 8.0]),
            &t(&[4], &[3.0, -0.5, 2.0, 7.0]),
        )
        .unwrap();
        let Value::Scalar(v) = r2.compute().unwrap() else {
            panic!()
        };
        assert!((v - 0.9486).abs() < 1e-4, "{v}");
        let mut mse = MeanError::mse(true);
        mse.update(
            &t(&[4], &[0.0, 1.0, 2.0, 3.0]),
            &t(&[4], &[0.0, 1.0, 2.0, 2.0]),
        )
        .unwrap();
        assert_eq!(mse.compute().unwrap(), Value::Scalar(0.25));
        let mut one = R2Score::new(0, MultiOutput::UniformAverage);
        one.update(&t(&[1], &[1.0]), &t(&[1], &[2.0])).unwrap();
        assert!(one.compute().is_err());
    }
}
