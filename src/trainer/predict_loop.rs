//! `train predict` (Lightning's `trainer.predict`): every input of a split through the model once, each
//! rank its own share (unpadded, as validation), the rows gathered on rank 0 in the split's order and
//! written to a CSV or parquet file (`storage::predictions`).

use super::EvalSet;
use crate::data::loader::{Batch, EpochLoader};
use crate::data::Dataset;
use crate::metrics::Reducer;
use crate::storage::predictions::{Kind, Table};
use crate::strategy::Strategy;
use crate::tensor::HostTensor;
use anyhow::Context;

/// Per-input outputs wider than this are dense predictions (a mask, an image), not a row.
const MAX_VALUES: usize = 64;

/// What the model's outputs mean for a row: a class (and its probability) or values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Task {
    /// Class targets; the model's outputs are logits (one logit: binary, its sigmoid).
    Classes,
    /// Value targets (`width` of them per input) and as many outputs.
    Values { width: usize },
}

impl Task {
    /// Numbers per row: the index, then the task's columns.
    fn row_width(self) -> usize {
        match self {
            Task::Classes => 4,
            Task::Values { width } => 1 + 2 * width,
        }
    }

    fn columns(self) -> Vec<(String, Kind)> {
        let mut columns = vec![("index".to_string(), Kind::Int)];
        match self {
            Task::Classes => columns.extend([
                ("target".to_string(), Kind::Int),
                ("pred".to_string(), Kind::Int),
                ("prob".to_string(), Kind::Real),
            ]),
            Task::Values { width: 1 } => columns.extend([
                ("target".to_string(), Kind::Real),
                ("value".to_string(), Kind::Real),
            ]),
            Task::Values { width } => {
                columns.extend((0..width).map(|i| (format!("target_{i}"), Kind::Real)));
                columns.extend((0..width).map(|i| (format!("value_{i}"), Kind::Real)));
            }
        }
        columns
    }
}

/// This rank's share of `set` predicted (`batches` of them, then its part in the others' collectives up
/// to `rounds`), gathered over `reducer`'s ranks: the table on rank 0 (rows in index order, ids from
/// `dataset`), `None` on the others.
pub fn predict(
    strategy: &mut dyn Strategy,
    reducer: &dyn Reducer,
    set: &EvalSet,
    (batches, rounds): (usize, usize),
    dataset: &dyn Dataset,
) -> anyhow::Result<Option<Table>> {
    strategy.before_validation()?;
    let order = set.sampler.order(0);
    let mut chunks = order.indices.chunks(set.spec.batch_size.max(1));
    let mut local = Vec::new();
    let mut task = None;
    let mut done = 0;
    for batch in EpochLoader::new(&set.spec, 0, &order).take(batches) {
        let batch = batch?;
        let indices = chunks.next().unwrap_or_default();
        strategy.evaluate(&batch)?;
        let outputs = strategy.take_outputs()?.context(
            "predict: this strategy's engine kept no outputs of its forward pass to write",
        )?;
        anyhow::ensure!(
            outputs.shape.first() == Some(&indices.len()),
            "predict: a batch of {} inputs gave {:?} outputs (with data.skip_corrupt=true a damaged \
             input leaves its batch short, and its rows could not be told apart: predict with \
             data.skip_corrupt=false)",
            indices.len(),
            outputs.shape
        );
        let this = task_of(&batch, &outputs)?;
        anyhow::ensure!(
            *task.get_or_insert(this) == this,
            "predict: the model's outputs changed shape between batches ({outputs:?})"
        );
        push_rows(&mut local, this, indices, &batch, &outputs);
        done += 1;
    }
    for _ in done..rounds {
        strategy.evaluate_idle()?;
    }
    // Every rank knows the task from the model; one whose share was empty learns it from rank 0.
    let mut code = [0.0];
    if reducer.rank() == 0 {
        code[0] = match task {
            Some(Task::Classes) => 1.0,
            Some(Task::Values { width }) => 2.0 + width as f64,
            None => 0.0,
        };
    }
    reducer.sum(&mut code)?;
    let task = match code[0] as usize {
        0 => return Ok(None),
        1 => Task::Classes,
        n => Task::Values { width: n - 2 },
    };
    let all = reducer.gather(&local)?;
    if reducer.rank() != 0 {
        return Ok(None);
    }
    Ok(Some(table(task, &all, dataset)))
}

/// Classification when the batch carries classes; values when it carries value targets.
fn task_of(batch: &Batch, outputs: &HostTensor) -> anyhow::Result<Task> {
    let per_input: usize = outputs.shape.iter().skip(1).product();
    if let Some((_, shape)) = batch.tensors.as_ref().and_then(|t| t.targets.as_ref()) {
        let width: usize = shape.iter().product();
        anyhow::ensure!(
            width == per_input && width <= MAX_VALUES,
            "predict writes one row per input; this model gives {:?} outputs per input for {:?} \
             targets (a dense prediction such as a mask has no row form)",
            &outputs.shape[1..],
            shape
        );
        return Ok(Task::Values { width });
    }
    anyhow::ensure!(
        outputs.shape.len() == 2,
        "predict: a classifier's outputs are (batch, classes) logits; this model gives {:?}",
        outputs.shape
    );
    Ok(Task::Classes)
}

/// Each input's row: its index, target and prediction (the likeliest class with its softmax
/// probability; one logit: the sigmoid's side of 0.5).
fn push_rows(out: &mut Vec<f64>, task: Task, indices: &[usize], batch: &Batch, y: &HostTensor) {
    let per_input: usize = y.shape.iter().skip(1).product();
    for (i, index) in indices.iter().enumerate() {
        let row = &y.data[i * per_input..(i + 1) * per_input];
        out.push(*index as f64);
        match task {
            Task::Classes => {
                out.push(f64::from(batch.labels.get(i).copied().unwrap_or(0)));
                let (pred, prob) = likeliest(row);
                out.extend([pred as f64, prob]);
            }
            Task::Values { width } => {
                let targets = batch.tensors.as_ref().and_then(|t| t.targets.as_ref());
                let target = targets.map(|(v, _)| &v[i * width..(i + 1) * width]);
                out.extend((0..width).map(|j| target.map_or(f64::NAN, |t| f64::from(t[j]))));
                out.extend(row.iter().map(|v| f64::from(*v)));
            }
        }
    }
}

/// The class a row of logits picks and its probability.
fn likeliest(logits: &[f32]) -> (usize, f64) {
    if let [logit] = logits {
        let p = 1.0 / (1.0 + (-f64::from(*logit)).exp());
        return match p >= 0.5 {
            true => (1, p),
            false => (0, 1.0 - p),
        };
    }
    let (best, top) = logits
        .iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, v)| match *v > bv {
            true => (i, *v),
            false => (bi, bv),
        });
    let sum: f64 = logits
        .iter()
        .map(|v| (f64::from(*v) - f64::from(top)).exp())
        .sum();
    (best, 1.0 / sum)
}

/// The gathered rows (`task.row_width()` numbers each, ranks' shares one after another) in index order.
fn table(task: Task, all: &[f64], dataset: &dyn Dataset) -> Table {
    let width = task.row_width();
    let mut rows: Vec<&[f64]> = all.chunks(width).collect();
    rows.sort_by(|a, b| a[0].total_cmp(&b[0]));
    let columns = task.columns();
    let numbers = (0..width)
        .map(|c| rows.iter().map(|r| r[c]).collect())
        .collect();
    let ids: Option<Vec<String>> = rows
        .iter()
        .map(|r| dataset.sample_id(r[0] as usize))
        .collect();
    Table {
        ids: ids.unwrap_or_default(),
        columns,
        numbers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(&[0.0, 2.0, 1.0], 1, 0.6652409557748219)]
    #[case(&[3.0, 3.0], 0, 0.5)]
    #[case(&[2.0], 1, 0.8807970779778823)]
    #[case(&[-2.0], 0, 0.8807970779778823)]
    fn likeliest_class_and_probability(
        #[case] logits: &[f32],
        #[case] class: usize,
        #[case] prob: f64,
    ) {
        let (c, p) = likeliest(logits);
        assert_eq!(c, class);
        assert!((p - prob).abs() < 1e-9, "{p}");
    }
}
