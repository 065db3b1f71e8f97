//! AUROC, exact (torchmetrics' `thresholds=None`): every score and target is kept (`cat` states, so
//! ranks' samples are pooled before the curve), the ROC curve has a point at each distinct score (tied
//! scores are one point, so ties count half), and the area is the trapezoidal rule's. Binary: one score
//! per item (sigmoid applied to a batch of logits); multiclass: one-vs-rest per class over the softmaxed
//! scores, averaged (`macro`, or `weighted` by each class's count in the target).

use super::classification::Average;
use super::inputs;
use super::{bad, states_of, Metric, Result, State, Value};
use crate::tensor::HostTensor;

pub struct Auroc {
    /// `None`: binary; `Some(C)`: multiclass over C classes.
    pub num_classes: Option<usize>,
    pub average: Average,
    pub ignore_index: Option<i64>,
    /// Scores, item-major (C per item for multiclass).
    scores: State,
    target: State,
}

impl Auroc {
    pub fn new(num_classes: Option<usize>, average: Average, ignore_index: Option<i64>) -> Auroc {
        Auroc {
            num_classes,
            average,
            ignore_index,
            scores: State::cat("preds"),
            target: State::cat("target"),
        }
    }
}

/// The area under the ROC curve of `scores` for the items whose `target` is `positive`.
pub fn binary_auroc(scores: &[f64], target: &[f64], positive: f64) -> f64 {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]));
    // Cumulative true and false positives at the last item of each run of equal scores.
    let (mut tps, mut fps) = (vec![0.0], vec![0.0]);
    let (mut tp, mut fp) = (0.0, 0.0);
    for (i, &item) in order.iter().enumerate() {
        if target[item] == positive {
            tp += 1.0;
        } else {
            fp += 1.0;
        }
        let last_of_run = order
            .get(i + 1)
            .is_none_or(|next| scores[*next] != scores[item]);
        if last_of_run {
            tps.push(tp);
            fps.push(fp);
        }
    }
    // No positives (or no negatives): torchmetrics' rate is all zeros, and so the area is 0.
    let rate = |counts: &[f64]| -> Vec<f64> {
        let last = *counts.last().unwrap_or(&0.0);
        counts
            .iter()
            .map(|c| if last <= 0.0 { 0.0 } else { c / last })
            .collect()
    };
    let (tpr, fpr) = (rate(&tps), rate(&fps));
    (1..fpr.len())
        .map(|i| (fpr[i] - fpr[i - 1]) * (tpr[i] + tpr[i - 1]) / 2.0)
        .sum()
}

impl Metric for Auroc {
    fn update(&mut self, preds: &HostTensor, target: &HostTensor) -> Result<()> {
        match self.num_classes {
            None => {
                let values = inputs::squeezed_like(preds, target)?;
                let truth = inputs::labels(target, 2, self.ignore_index, "target")?;
                let mut p: Vec<f64> = Vec::with_capacity(values.len());
                let mut t = Vec::with_capacity(values.len());
                for (v, l) in values.iter().zip(&truth) {
                    if Some(*l) != self.ignore_index {
                        p.push(f64::from(*v));
                        t.push(*l as f64);
                    }
                }
                inputs::sigmoid_if_logits(&mut p);
                self.scores.values.extend(p);
                self.target.values.extend(t);
            }
            Some(c) => {
                if preds.shape.len() != target.shape.len() + 1 {
                    return Err(bad(format!(
                        "multiclass AUROC needs class scores (preds of shape (N, {c}, ...)); got {:?} \
                         beside target {:?}",
                        preds.shape, target.shape
                    )));
                }
                let scores = inputs::scores_by_item(preds, c)?;
                let truth = inputs::labels(target, c, self.ignore_index, "target")?;
                let mut kept = Vec::with_capacity(scores.len());
                for (item, l) in scores.chunks(c).zip(&truth) {
                    if Some(*l) != self.ignore_index {
                        kept.extend_from_slice(item);
                        self.target.values.push(*l as f64);
                    }
                }
                inputs::softmax_if_logits(&mut kept, c);
                self.scores.values.extend(kept);
            }
        }
        Ok(())
    }

    fn compute(&self) -> Result<Value> {
        let target = &self.target.values;
        let Some(c) = self.num_classes else {
            return Ok(Value::Scalar(binary_auroc(
                &self.scores.values,
                target,
                1.0,
            )));
        };
        let per_class: Vec<f64> = (0..c)
            .map(|k| {
                let column: Vec<f64> = self
                    .scores
                    .values
                    .iter()
                    .skip(k)
                    .step_by(c)
                    .copied()
                    .collect();
                binary_auroc(&column, target, k as f64)
            })
            .collect();
        Ok(match self.average {
            Average::None => Value::Vector(per_class),
            Average::Weighted => {
                let counts: Vec<f64> = (0..c)
                    .map(|k| target.iter().filter(|t| **t == k as f64).count() as f64)
                    .collect();
                let total: f64 = counts.iter().sum();
                Value::Scalar(
                    per_class
                        .iter()
                        .zip(&counts)
                        .map(|(a, w)| if total == 0.0 { 0.0 } else { a * w / total })
                        .sum(),
                )
            }
            _ => Value::Scalar(per_class.iter().sum::<f64>() / c as f64),
        })
    }

    states_of!(scores, target);

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
    fn ties_count_half_and_a_perfect_ranking_is_one() {
        assert_eq!(
            binary_auroc(&[0.9, 0.8, 0.2, 0.1], &[1.0, 1.0, 0.0, 0.0], 1.0),
            1.0
        );
        assert_eq!(binary_auroc(&[0.5, 0.5], &[1.0, 0.0], 1.0), 0.5);
        // sklearn's example: roc_auc_score([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) = 0.75.
        assert_eq!(
            binary_auroc(&[0.1, 0.4, 0.35, 0.8], &[0.0, 0.0, 1.0, 1.0], 1.0),
            0.75
        );
        // No positive: torchmetrics gives 0.
        assert_eq!(binary_auroc(&[0.1, 0.4], &[0.0, 0.0], 1.0), 0.0);
    }
}
