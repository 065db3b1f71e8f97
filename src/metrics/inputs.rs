//! A batch's `preds` and `target` as torchmetrics reads them: class scores with the class dimension
//! second (`(N, C, ...)`, extra dimensions flattened into items, `preds.transpose(0, 1).reshape(C, -1).T`),
//! labels as integers, logits turned into probabilities only when a batch's values leave [0, 1]
//! (`normalize_logits_if_needed`, decided per batch as torchmetrics decides it per `update`).

use super::{bad, Result};
use crate::tensor::HostTensor;

/// Integral class labels of `t` (flattened), each below `num_classes` unless it is `ignore_index`.
pub fn labels(
    t: &HostTensor,
    num_classes: usize,
    ignore_index: Option<i64>,
    what: &str,
) -> Result<Vec<i64>> {
    t.data
        .iter()
        .map(|&v| {
            let l = v as i64;
            if l as f32 != v {
                return Err(bad(format!(
                    "{what} holds {v}, not a class index (an integer)"
                )));
            }
            if Some(l) != ignore_index && (l < 0 || l as usize >= num_classes) {
                return Err(bad(format!(
                    "{what} holds class {l}, outside 0..{num_classes} (num_classes={num_classes})"
                )));
            }
            Ok(l)
        })
        .collect()
}

/// Class scores of `preds` `(N, C, ...)` as items × classes, item-major: item `n * P + p` is sample
/// `n`'s position `p` of the flattened extra dimensions, as torchmetrics orders them.
pub fn scores_by_item(preds: &HostTensor, classes: usize) -> Result<Vec<f64>> {
    let shape = &preds.shape;
    if shape.len() < 2 || shape[1] != classes {
        return Err(bad(format!(
            "preds of shape {shape:?}: expected (N, {classes}, ...) class scores (num_classes={classes})"
        )));
    }
    let n = shape[0];
    let positions: usize = shape[2..].iter().product();
    let mut out = vec![0.0; n * positions * classes];
    for s in 0..n {
        for c in 0..classes {
            let base = (s * classes + c) * positions;
            for p in 0..positions {
                out[(s * positions + p) * classes + c] = f64::from(preds.data[base + p]);
            }
        }
    }
    Ok(out)
}

/// Softmax over each item's classes, when any score of the batch lies outside [0, 1] (logits); scores
/// already in [0, 1] are taken as probabilities.
pub fn softmax_if_logits(scores: &mut [f64], classes: usize) {
    if scores.iter().all(|v| (0.0..=1.0).contains(v)) {
        return;
    }
    for item in scores.chunks_mut(classes) {
        // As torch.softmax computes it, in float32.
        let max = item.iter().fold(f64::NEG_INFINITY, |m, v| m.max(*v)) as f32;
        let exps: Vec<f32> = item.iter().map(|v| (*v as f32 - max).exp()).collect();
        let sum: f32 = exps.iter().sum();
        for (v, e) in item.iter_mut().zip(exps) {
            *v = f64::from(e / sum);
        }
    }
}

/// Sigmoid of every value, when any lies outside [0, 1] (logits).
pub fn sigmoid_if_logits(values: &mut [f64]) {
    if values.iter().all(|v| (0.0..=1.0).contains(v)) {
        return;
    }
    for v in values.iter_mut() {
        *v = f64::from(1.0 / (1.0 + (-(*v as f32)).exp()));
    }
}

/// Each item's class with the highest score (the first of equal ones, as `torch.argmax`).
pub fn argmax(scores: &[f64], classes: usize) -> Vec<i64> {
    scores
        .chunks(classes)
        .map(|item| {
            let mut best = 0;
            for (c, v) in item.iter().enumerate() {
                if *v > item[best] {
                    best = c;
                }
            }
            best as i64
        })
        .collect()
}

/// The `k` best classes of an item, best first.
pub fn top_k(item: &[f64], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..item.len()).collect();
    order.sort_by(|a, b| item[*b].total_cmp(&item[*a]).then(a.cmp(b)));
    order.truncate(k);
    order
}

/// `preds` with a trailing dimension of 1 that `target` lacks, seen with `target`'s shape (a model's
/// `(N, 1)` output beside `(N,)` labels or values).
pub fn squeezed_like<'a>(preds: &'a HostTensor, target: &HostTensor) -> Result<&'a [f32]> {
    let same = preds.shape == target.shape;
    let trailing_one = preds.shape.len() == target.shape.len() + 1
        && preds.shape.last() == Some(&1)
        && preds.shape[..target.shape.len()] == target.shape[..];
    if same || trailing_one {
        Ok(&preds.data)
    } else {
        Err(bad(format!(
            "preds of shape {:?} and target of shape {:?}: expected the same shape",
            preds.shape, target.shape
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_scores_are_read_class_second() {
        // (N=1, C=2, H=1, W=2): pixel 0 scores (0.1, 0.9), pixel 1 (0.7, 0.3).
        let preds = HostTensor {
            shape: vec![1, 2, 1, 2],
            data: vec![0.1, 0.7, 0.9, 0.3],
        };
        let s = scores_by_item(&preds, 2).unwrap();
        assert_eq!(argmax(&s, 2), vec![1, 0]);
        assert_eq!(top_k(&[0.2, 0.5, 0.5, 0.1], 2), vec![1, 2]);
    }

    #[test]
    fn logits_are_normalised_only_outside_the_unit_interval() {
        let mut p = vec![0.2, 0.8];
        softmax_if_logits(&mut p, 2);
        assert_eq!(p, vec![0.2, 0.8]);
        let mut l = vec![-1.0, 2.0_f64.ln() - 1.0];
        softmax_if_logits(&mut l, 2);
        assert!((l[1] - 2.0 / 3.0).abs() < 1e-6, "{l:?}");
        let mut b = vec![-1.0, 0.5];
        sigmoid_if_logits(&mut b);
        assert!((b[1] - 0.6224593).abs() < 1e-6);
    }
}
