//! Classification metrics over a confusion matrix (one summed state: a class-by-class count, 2×2 for a
//! binary task), from which torchmetrics' statistics follow: per class `tp` (the diagonal), `fp` (the
//! column's rest), `fn` (the row's rest) and `tn`. Accuracy, Precision, Recall, F-beta/F1, the confusion
//! matrix and the Jaccard index (mean IoU) reduce them with torchmetrics' averages (`micro`, `macro`,
//! `weighted`, `none`; `binary`) and its rules for classes that never occur.

use super::inputs;
use super::{bad, states_of, Metric, Reduce, Result, State, Value};
use crate::tensor::HostTensor;

/// Binary (one score per item, a threshold) or multiclass (`num_classes` scores per item, or labels).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Task {
    Binary { threshold: f64 },
    Multiclass { num_classes: usize, top_k: usize },
}

impl Task {
    fn classes(self) -> usize {
        match self {
            Task::Binary { .. } => 2,
            Task::Multiclass { num_classes, .. } => num_classes,
        }
    }
}

/// How per-class scores become one (torchmetrics' `average`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Average {
    Binary,
    Micro,
    Macro,
    Weighted,
    /// Every class's score (`average=None` / `"none"`).
    None,
}

/// The confusion matrix of everything seen: `rows` the target class, `cols` the predicted one.
#[derive(Debug, Clone)]
pub struct Confusion {
    pub task: Task,
    pub ignore_index: Option<i64>,
    pub counts: State,
}

impl Confusion {
    pub fn new(task: Task, ignore_index: Option<i64>) -> Confusion {
        let c = task.classes();
        Confusion {
            task,
            ignore_index,
            counts: State::new("confmat", Reduce::Sum, vec![0.0; c * c]),
        }
    }

    /// Adds a batch: preds as scores (one more dimension than target), or labels (binary: scores or
    /// probabilities thresholded).
    pub fn update(&mut self, preds: &HostTensor, target: &HostTensor) -> Result<()> {
        let c = self.task.classes();
        let (predicted, truth) = match self.task {
            Task::Binary { threshold } => {
                let values = inputs::squeezed_like(preds, target)?;
                let mut p: Vec<f64> = values.iter().map(|v| f64::from(*v)).collect();
                inputs::sigmoid_if_logits(&mut p);
                let predicted = p.iter().map(|v| i64::from(*v > threshold)).collect();
                let truth = inputs::labels(target, 2, self.ignore_index, "target")?;
                (predicted, truth)
            }
            Task::Multiclass { num_classes, top_k } => {
                let truth = inputs::labels(target, num_classes, self.ignore_index, "target")?;
                let predicted = if preds.shape.len() == target.shape.len() + 1 {
                    let scores = inputs::scores_by_item(preds, num_classes)?;
                    match top_k {
                        1 => inputs::argmax(&scores, num_classes),
                        // torchmetrics' refined top-k: the target where it is among the k best, else
                        // the best.
                        k => scores
                            .chunks(num_classes)
                            .zip(&truth)
                            .map(|(item, t)| {
                                let best = inputs::top_k(item, k);
                                match best.iter().any(|b| *b as i64 == *t) {
                                    true => *t,
                                    false => best[0] as i64,
                                }
                            })
                            .collect(),
                    }
                } else if top_k > 1 {
                    return Err(bad(format!(
                        "top_k={top_k} needs class scores (preds of shape (N, {num_classes}, ...)); got \
                         labels of shape {:?}",
                        preds.shape
                    )));
                } else {
                    inputs::labels(preds, num_classes, None, "preds")?
                };
                (predicted, truth)
            }
        };
        if predicted.len() != truth.len() {
            return Err(bad(format!(
                "preds of shape {:?} give {} predictions for target of shape {:?} ({} items)",
                preds.shape,
                predicted.len(),
                target.shape,
                truth.len()
            )));
        }
        for (p, t) in predicted.iter().zip(&truth) {
            if Some(*t) == self.ignore_index {
                continue;
            }
            self.counts.values[*t as usize * c + *p as usize] += 1.0;
        }
        Ok(())
    }

    fn classes(&self) -> usize {
        self.task.classes()
    }

    /// Per class: (tp, fp, tn, fn).
    pub fn stats(&self) -> Vec<[f64; 4]> {
        let c = self.classes();
        let m = &self.counts.values;
        let total: f64 = m.iter().sum();
        (0..c)
            .map(|k| {
                let tp = m[k * c + k];
                let fp: f64 = (0..c).map(|r| m[r * c + k]).sum::<f64>() - tp;
                let fn_: f64 = (0..c).map(|col| m[k * c + col]).sum::<f64>() - tp;
                [tp, fp, total - tp - fp - fn_, fn_]
            })
            .collect()
    }
}

/// `num / den`, `zero_division` where `den` is 0 (torchmetrics' `_safe_divide`).
fn safe_divide(num: f64, den: f64, zero_division: f64) -> f64 {
    if den == 0.0 {
        zero_division
    } else {
        num / den
    }
}

/// Per-class scores averaged as torchmetrics' `_adjust_weights_safe_divide`: `macro` leaves out the
/// classes that never occur (no tp, fp or fn; with top-k, none in the target), `weighted` weighs by
/// support.
fn average(scores: &[f64], stats: &[[f64; 4]], average: Average, top_k: usize) -> Value {
    let weights: Vec<f64> = match average {
        Average::None | Average::Binary | Average::Micro => return Value::Vector(scores.to_vec()),
        Average::Weighted => stats.iter().map(|[tp, _, _, fn_]| tp + fn_).collect(),
        Average::Macro => stats
            .iter()
            .map(|[tp, fp, _, fn_]| {
                let absent = match top_k {
                    1 => tp + fp + fn_ == 0.0,
                    _ => tp + fn_ == 0.0,
                };
                if absent {
                    0.0
                } else {
                    1.0
                }
            })
            .collect(),
    };
    let total: f64 = weights.iter().sum();
    Value::Scalar(
        scores
            .iter()
            .zip(&weights)
            .map(|(s, w)| safe_divide(w * s, total, 0.0))
            .sum(),
    )
}

/// Which statistic a `StatScore` reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Statistic {
    Accuracy,
    Precision,
    Recall,
    FBeta(f64),
}

/// Accuracy, Precision, Recall and F-beta (F1: beta 1), binary or multiclass.
pub struct StatScore {
    pub statistic: Statistic,
    pub average: Average,
    pub zero_division: f64,
    pub confusion: Confusion,
}

impl StatScore {
    fn score(&self, [tp, fp, tn, fn_]: [f64; 4], binary: bool) -> f64 {
        let z = self.zero_division;
        match self.statistic {
            Statistic::Accuracy if binary => safe_divide(tp + tn, tp + tn + fp + fn_, z),
            Statistic::Accuracy | Statistic::Recall => safe_divide(tp, tp + fn_, z),
            Statistic::Precision => safe_divide(tp, tp + fp, z),
            Statistic::FBeta(beta) => {
                let b2 = beta * beta;
                safe_divide((1.0 + b2) * tp, (1.0 + b2) * tp + b2 * fn_ + fp, z)
            }
        }
    }
}

impl Metric for StatScore {
    fn update(&mut self, preds: &HostTensor, target: &HostTensor) -> Result<()> {
        self.confusion.update(preds, target)
    }

    fn compute(&self) -> Result<Value> {
        let stats = self.confusion.stats();
        match self.confusion.task {
            Task::Binary { .. } => Ok(Value::Scalar(self.score(stats[1], true))),
            Task::Multiclass { top_k, .. } => {
                if self.average == Average::Micro {
                    let sum = |i: usize| stats.iter().map(|s| s[i]).sum::<f64>();
                    let micro = [sum(0), sum(1), sum(2), sum(3)];
                    return Ok(Value::Scalar(self.score(micro, false)));
                }
                let scores: Vec<f64> = stats.iter().map(|s| self.score(*s, false)).collect();
                Ok(average(&scores, &stats, self.average, top_k))
            }
        }
    }

    states_of!(confusion.counts);

    fn higher_is_better(&self) -> bool {
        true
    }

    fn is_scalar(&self) -> bool {
        self.average != Average::None
    }
}

/// How a confusion matrix is normalised (torchmetrics' `normalize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Normalize {
    None,
    /// Over each row (the target class).
    True,
    /// Over each column (the predicted class).
    Pred,
    All,
}

/// The confusion matrix itself: rows the target class, columns the predicted one.
pub struct ConfusionMatrix {
    pub normalize: Normalize,
    pub confusion: Confusion,
}

impl Metric for ConfusionMatrix {
    fn update(&mut self, preds: &HostTensor, target: &HostTensor) -> Result<()> {
        self.confusion.update(preds, target)
    }

    fn compute(&self) -> Result<Value> {
        let c = self.confusion.classes();
        let m = &self.confusion.counts.values;
        let values = match self.normalize {
            Normalize::None => m.clone(),
            Normalize::True => (0..c * c)
                .map(|i| safe_divide(m[i], m[i / c * c..i / c * c + c].iter().sum(), 0.0))
                .collect(),
            Normalize::Pred => (0..c * c)
                .map(|i| safe_divide(m[i], (0..c).map(|r| m[r * c + i % c]).sum(), 0.0))
                .collect(),
            Normalize::All => {
                let total: f64 = m.iter().sum();
                m.iter().map(|v| safe_divide(*v, total, 0.0)).collect()
            }
        };
        Ok(Value::Matrix {
            rows: c,
            cols: c,
            values,
        })
    }

    states_of!(confusion.counts);

    fn higher_is_better(&self) -> bool {
        true
    }

    fn is_scalar(&self) -> bool {
        false
    }
}

/// The Jaccard index (intersection over union; mean IoU with `macro`).
pub struct JaccardIndex {
    pub average: Average,
    pub zero_division: f64,
    pub confusion: Confusion,
}

impl Metric for JaccardIndex {
    fn update(&mut self, preds: &HostTensor, target: &HostTensor) -> Result<()> {
        self.confusion.update(preds, target)
    }

    fn compute(&self) -> Result<Value> {
        let stats = self.confusion.stats();
        let z = self.zero_division;
        if let Task::Binary { .. } = self.confusion.task {
            let [tp, fp, _, fn_] = stats[1];
            return Ok(Value::Scalar(safe_divide(tp, tp + fp + fn_, z)));
        }
        let num: Vec<f64> = stats.iter().map(|s| s[0]).collect();
        let den: Vec<f64> = stats.iter().map(|[tp, fp, _, fn_]| tp + fp + fn_).collect();
        let ignored = self
            .confusion
            .ignore_index
            .filter(|i| *i >= 0 && (*i as usize) < num.len())
            .map(|i| i as usize);
        if self.average == Average::Micro {
            let n: f64 = num.iter().sum();
            let d: f64 = den.iter().sum::<f64>() - ignored.map_or(0.0, |i| den[i]);
            return Ok(Value::Scalar(safe_divide(n, d, z)));
        }
        let scores: Vec<f64> = num
            .iter()
            .zip(&den)
            .map(|(n, d)| safe_divide(*n, *d, z))
            .collect();
        let weights: Vec<f64> = match self.average {
            Average::None | Average::Binary | Average::Micro => return Ok(Value::Vector(scores)),
            Average::Weighted => stats.iter().map(|[tp, _, _, fn_]| tp + fn_).collect(),
            Average::Macro => (0..scores.len())
                .map(|k| {
                    let [tp, fp, _, fn_] = stats[k];
                    // A class in neither targets nor predictions, or the ignored one, is left out.
                    if Some(k) == ignored || 2.0 * tp + fp + fn_ == 0.0 {
                        0.0
                    } else {
                        1.0
                    }
                })
                .collect(),
        };
        let total: f64 = weights.iter().sum();
        Ok(Value::Scalar(
            scores
                .iter()
                .zip(&weights)
                .map(|(s, w)| w * s / total)
                .sum(),
        ))
    }

    states_of!(confusion.counts);

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

    use crate::metrics::tensor as t;

    fn multiclass(statistic: Statistic, average: Average, k: usize) -> StatScore {
        StatScore {
            statistic,
            average,
            zero_division: 0.0,
            confusion: Confusion::new(
                Task::Multiclass {
                    num_classes: 3,
                    top_k: k,
                },
                None,
            ),
        }
    }

    /// torchmetrics' documented example: preds [2, 1, 0, 0], target [2, 1, 0, 1].
    #[test]
    fn torchmetrics_docstring_examples() {
        let preds = t(&[4], &[2.0, 1.0, 0.0, 0.0]);
        let target = t(&[4], &[2.0, 1.0, 0.0, 1.0]);
        let mut micro = multiclass(Statistic::Accuracy, Average::Micro, 1);
        micro.update(&preds, &target).unwrap();
        assert_eq!(micro.compute().unwrap(), Value::Scalar(0.75));
        let mut macro_ = multiclass(Statistic::Accuracy, Average::Macro, 1);
        macro_.update(&preds, &target).unwrap();
        // (1 + 1/2 + 1) / 3
        let Value::Scalar(v) = macro_.compute().unwrap() else {
            panic!()
        };
        assert!((v - 2.5 / 3.0).abs() < 1e-12, "{v}");
        let mut f1 = multiclass(Statistic::FBeta(1.0), Average::None, 1);
        f1.update(&preds, &target).unwrap();
        let Value::Vector(v) = f1.compute().unwrap() else {
            panic!()
        };
        assert!(
            (v[0] - 2.0 / 3.0).abs() < 1e-12 && (v[1] - 2.0 / 3.0).abs() < 1e-12 && v[2] == 1.0
        );
    }

    /// A class that never occurs is left out of the macro average; top-2 counts the target among the
    /// two best.
    #[test]
    fn macro_skips_absent_classes_and_top_k_counts_the_k_best() {
        let mut recall = multiclass(Statistic::Recall, Average::Macro, 1);
        recall
            .update(&t(&[2], &[0.0, 0.0]), &t(&[2], &[0.0, 1.0]))
            .unwrap();
        // Class 0: 1/1, class 1: 0/1, class 2 never occurs (left out): 0.5, not 1/3.
        assert_eq!(recall.compute().unwrap(), Value::Scalar(0.5));
        let scores = t(&[2, 3], &[0.1, 0.5, 0.4, 0.6, 0.3, 0.1]);
        let target = t(&[2], &[2.0, 1.0]);
        let mut top2 = multiclass(Statistic::Accuracy, Average::Micro, 2);
        top2.update(&scores, &target).unwrap();
        assert_eq!(top2.compute().unwrap(), Value::Scalar(1.0));
        let mut top1 = multiclass(Statistic::Accuracy, Average::Micro, 1);
        top1.update(&scores, &target).unwrap();
        assert_eq!(top1.compute().unwrap(), Value::Scalar(0.0));
    }
}
