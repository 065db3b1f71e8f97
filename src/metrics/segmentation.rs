//! The Dice score of segmentation masks (torchmetrics' `segmentation.DiceScore`): per sample and class
//! `2·|pred ∩ target| / (|pred| + |target|)`, kept per sample (`cat` states: the ranks' samples pooled),
//! undefined (NaN) where a class is in neither mask and left out of the averages then. `preds` are class
//! scores `(N, C, ...)` (argmax taken) or class indices `(N, ...)`; `target` class indices or one-hot
//! masks. Mean IoU is `JaccardIndex` (`classification`).

use super::classification::Average;
use super::inputs;
use super::{bad, states_of, Metric, Result, State, Value};
use crate::tensor::HostTensor;

/// torchmetrics' `aggregation_level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregation {
    /// Each sample's score, then their mean.
    Samplewise,
    /// Sums over every sample, then one score.
    Global,
}

pub struct DiceScore {
    pub num_classes: usize,
    pub include_background: bool,
    pub average: Average,
    pub aggregation: Aggregation,
    numerator: State,
    denominator: State,
    support: State,
}

impl DiceScore {
    pub fn new(
        num_classes: usize,
        include_background: bool,
        average: Average,
        aggregation: Aggregation,
    ) -> DiceScore {
        DiceScore {
            num_classes,
            include_background,
            average,
            aggregation,
            numerator: State::cat("numerator"),
            denominator: State::cat("denominator"),
            support: State::cat("support"),
        }
    }

    fn kept(&self) -> usize {
        self.num_classes - usize::from(!self.include_background)
    }

    /// Each item's class, from scores or one-hot masks `(N, C, ...)` or from indices `(N, ...)`.
    fn classes(&self, t: &HostTensor, rank: usize, what: &str) -> Result<Vec<i64>> {
        match t.shape.len() {
            r if r == rank + 1 => {
                let scores = inputs::scores_by_item(t, self.num_classes)?;
                Ok(inputs::argmax(&scores, self.num_classes))
            }
            r if r == rank => inputs::labels(t, self.num_classes, None, what),
            _ => Err(bad(format!(
                "{what} of shape {:?}: expected class indices (N, ...) or (N, {}, ...) scores",
                t.shape, self.num_classes
            ))),
        }
    }
}

/// Per sample and class: the score, NaN where the class is in neither mask.
fn nan_divide(num: f64, den: f64) -> f64 {
    if den == 0.0 {
        f64::NAN
    } else {
        num / den
    }
}

/// The mean of the values that are not NaN (NaN when all are).
fn nanmean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values
        .filter(|v| !v.is_nan())
        .fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 {
        f64::NAN
    } else {
        sum / n as f64
    }
}

impl Metric for DiceScore {
    fn update(&mut self, preds: &HostTensor, target: &HostTensor) -> Result<()> {
        // The target's rank decides: indices (N, ...) or one-hot (N, C, ...).
        let index_rank = if target.shape.len() >= 3
            && target.shape[1] == self.num_classes
            && preds.shape.len() == target.shape.len()
        {
            target.shape.len() - 1
        } else {
            target.shape.len()
        };
        let truth = self.classes(target, index_rank, "target")?;
        let predicted = self.classes(preds, index_rank, "preds")?;
        if truth.len() != predicted.len() || target.shape.is_empty() {
            return Err(bad(format!(
                "preds of shape {:?} and target of shape {:?} do not describe the same masks",
                preds.shape, target.shape
            )));
        }
        let n = target.shape[0];
        let per_sample = truth.len() / n.max(1);
        let skip = usize::from(!self.include_background);
        for s in 0..n {
            let (mut inter, mut pred_sum, mut target_sum) = (
                vec![0.0; self.num_classes],
                vec![0.0; self.num_classes],
                vec![0.0; self.num_classes],
            );
            for i in s * per_sample..(s + 1) * per_sample {
                let (p, t) = (predicted[i] as usize, truth[i] as usize);
                pred_sum[p] += 1.0;
                target_sum[t] += 1.0;
                if p == t {
                    inter[p] += 1.0;
                }
            }
            for c in skip..self.num_classes {
                self.numerator.values.push(2.0 * inter[c]);
                self.denominator.values.push(pred_sum[c] + target_sum[c]);
                self.support.values.push(target_sum[c]);
            }
        }
        Ok(())
    }

    fn compute(&self) -> Result<Value> {
        let k = self.kept();
        let (mut num, mut den, mut sup) = (
            self.numerator.values.clone(),
            self.denominator.values.clone(),
            self.support.values.clone(),
        );
        if self.aggregation == Aggregation::Global {
            let total = |v: &[f64]| -> Vec<f64> {
                (0..k).map(|c| v.iter().skip(c).step_by(k).sum()).collect()
            };
            (num, den, sup) = (total(&num), total(&den), total(&sup));
        }
        let samples = num.len() / k.max(1);
        let per_sample: Vec<Vec<f64>> = (0..samples)
            .map(|s| {
                let r = s * k..(s + 1) * k;
                let (n, d, w) = (&num[r.clone()], &den[r.clone()], &sup[r]);
                match self.average {
                    Average::Micro => vec![nan_divide(n.iter().sum(), d.iter().sum())],
                    Average::Weighted => {
                        let dice: Vec<f64> =
                            n.iter().zip(d).map(|(a, b)| nan_divide(*a, *b)).collect();
                        if dice.iter().all(|v| v.is_nan()) {
                            return vec![f64::NAN];
                        }
                        let total: f64 = w.iter().sum();
                        vec![dice
                            .iter()
                            .zip(w)
                            .map(|(x, wt)| nan_divide(*wt, total) * x)
                            .filter(|v| !v.is_nan())
                            .sum()]
                    }
                    Average::None | Average::Binary => {
                        n.iter().zip(d).map(|(a, b)| nan_divide(*a, *b)).collect()
                    }
                    Average::Macro => {
                        vec![nanmean(n.iter().zip(d).map(|(a, b)| nan_divide(*a, *b)))]
                    }
                }
            })
            .collect();
        let width = per_sample.first().map_or(1, Vec::len);
        let over_samples: Vec<f64> = (0..width)
            .map(|c| nanmean(per_sample.iter().map(|v| v[c])))
            .collect();
        Ok(match self.average {
            Average::None | Average::Binary => Value::Vector(over_samples),
            _ => Value::Scalar(over_samples[0]),
        })
    }

    states_of!(numerator, denominator, support);

    fn higher_is_better(&self) -> bool {
        true
    }

    fn is_scalar(&self) -> bool {
        self.average != Average::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_in_neither_mask_is_left_out() {
        // One 2x2 mask, 3 classes: target [0, 0, 1, 1], preds [0, 1, 1, 1]; class 2 in neither.
        let mut dice = DiceScore::new(3, true, Average::Macro, Aggregation::Samplewise);
        let target = HostTensor {
            shape: vec![1, 2, 2],
            data: vec![0.0, 0.0, 1.0, 1.0],
        };
        let preds = HostTensor {
            shape: vec![1, 2, 2],
            data: vec![0.0, 1.0, 1.0, 1.0],
        };
        dice.update(&preds, &target).unwrap();
        // class 0: 2·1/(1+2) = 2/3; class 1: 2·2/(3+2) = 4/5; mean of the two.
        let Value::Scalar(v) = dice.compute().unwrap() else {
            panic!()
        };
        assert!((v - (2.0 / 3.0 + 0.8) / 2.0).abs() < 1e-12, "{v}");
    }
}
