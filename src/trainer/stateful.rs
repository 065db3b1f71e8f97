//! The run's stateful metrics (`metrics:`) in the loop: one instance of each per phase, updated with the
//! model's outputs and the batch's targets after every training step and every validation or test batch,
//! computed at the phase's end over every rank (the states combined once, `metrics::sync`) and reset.
//! Scalars join the phase's row (`val/f1`); per-class values and matrices (a confusion matrix) are kept
//! as `metrics/<phase>_<name>.json` in the run directory, the latest epoch's, for the logbook.

use crate::data::loader::Batch;
use crate::metrics::{MetricSet, Reducer, Value};
use crate::schema::{Experiment, MetricSpec};
use crate::strategy::{Ranks, Strategy};
use crate::tensor::HostTensor;
use std::path::Path;

/// A phase of the run, as its keys are prefixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Train,
    Val,
    Test,
}

impl Phase {
    fn prefix(self) -> &'static str {
        match self {
            Phase::Train => "train",
            Phase::Val => "val",
            Phase::Test => "test",
        }
    }
}

pub struct StatefulMetrics {
    specs: Vec<MetricSpec>,
    train: MetricSet,
    val: MetricSet,
    test: MetricSet,
}

fn set_of(specs: &[MetricSpec]) -> anyhow::Result<MetricSet> {
    Ok(MetricSet {
        metrics: specs
            .iter()
            .map(|s| Ok((s.name.clone(), s.build()?)))
            .collect::<anyhow::Result<_>>()?,
    })
}

impl StatefulMetrics {
    /// `None` when the run configures no metric and keeps no confusion matrix.
    pub fn of(exp: &Experiment) -> anyhow::Result<Option<StatefulMetrics>> {
        let mut val = set_of(&exp.metrics)?;
        if let Some(confusion) = implicit_confusion(exp)? {
            val.metrics.push((IMPLICIT_CONFUSION.into(), confusion));
        }
        if val.is_empty() {
            return Ok(None);
        }
        Ok(Some(StatefulMetrics {
            train: set_of(&exp.metrics)?,
            val,
            test: set_of(&exp.metrics)?,
            specs: exp.metrics.clone(),
        }))
    }

    fn set(&mut self, phase: Phase) -> &mut MetricSet {
        match phase {
            Phase::Train => &mut self.train,
            Phase::Val => &mut self.val,
            Phase::Test => &mut self.test,
        }
    }

    /// After a batch of `phase` (a training step, a validation or test batch): the model's outputs for it
    /// and its targets go into every metric. Returns the values of the metrics logged each step
    /// (`on_step`), over this batch alone (this rank's, as Lightning logs a metric's forward).
    pub fn after_batch(
        &mut self,
        phase: Phase,
        strategy: &mut dyn Strategy,
        batch: &Batch,
    ) -> anyhow::Result<Vec<(String, f64)>> {
        let Some(outputs) = strategy.take_outputs()? else {
            // The implicit confusion matrix is a convenience: without outputs it is left out.
            if self.specs.is_empty() {
                return Ok(Vec::new());
            }
            anyhow::bail!(
                "metrics: this strategy's engine kept no outputs to measure (a metric needs the model's \
                 outputs of each batch)"
            );
        };
        let target = targets(batch);
        self.set(phase).update(&outputs, &target)?;
        let mut step = Vec::new();
        if phase == Phase::Train {
            for spec in self.specs.iter().filter(|s| s.on_step && s.scalar) {
                let mut alone = spec.build()?;
                alone
                    .update(&outputs, &target)
                    .map_err(|e| anyhow::anyhow!("metrics.{}: {e}", spec.name))?;
                if let Ok(Value::Scalar(v)) = alone.compute() {
                    step.push((format!("train/{}_step", spec.name), v));
                }
            }
        }
        Ok(step)
    }

    /// The phase's values over every rank since its last end, its metrics reset: the scalars as
    /// `phase/name`; the others written under `output_dir/metrics/` (rank 0).
    pub fn end_phase(
        &mut self,
        phase: Phase,
        ranks: &Ranks,
        epoch: u64,
        output_dir: &Path,
    ) -> anyhow::Result<Vec<(String, f64)>> {
        let values = self.set(phase).compute_and_reset(&RanksReducer(ranks))?;
        let mut row = Vec::new();
        for (name, value) in values {
            match value {
                Value::Scalar(v) => row.push((format!("{}/{name}", phase.prefix()), v)),
                other if ranks.is_global_zero() => {
                    write_value(output_dir, phase, &name, epoch, &other)?
                }
                _ => {}
            }
        }
        Ok(row)
    }
}

/// The validation confusion matrix every classification run keeps for the logbook (a file, not a
/// column), unless it configures one itself.
const IMPLICIT_CONFUSION: &str = "confusion_matrix";

/// Classes up to which a classification run keeps its confusion matrix without being asked (a larger
/// matrix is no picture).
const IMPLICIT_CONFUSION_CLASSES: usize = 100;

/// Classification (cross-entropy over class labels) with a readable number of classes, and no confusion
/// matrix configured: the implicit one.
fn implicit_confusion(exp: &Experiment) -> anyhow::Result<Option<Box<dyn crate::metrics::Metric>>> {
    let classes = exp.data.num_classes;
    let classification = exp.loss.is_none()
        && exp
            .data
            .registered
            .as_ref()
            .is_none_or(|d| d.target_shape.is_none());
    let configured = exp
        .metrics
        .iter()
        .any(|m| m.target.ends_with("ConfusionMatrix"));
    if !classification || configured || !(2..=IMPLICIT_CONFUSION_CLASSES).contains(&classes) {
        return Ok(None);
    }
    let build = crate::registry::metric("torchmetrics.ConfusionMatrix").expect("a built-in metric");
    build(&serde_json::json!({"task": "multiclass", "num_classes": classes})).map(Some)
}

/// The batch's targets: class labels, or a registered dataset's value targets with their shape.
fn targets(batch: &Batch) -> HostTensor {
    match batch.tensors.as_ref().and_then(|t| t.targets.as_ref()) {
        Some((values, shape)) => HostTensor {
            shape: std::iter::once(batch.len())
                .chain(shape.iter().copied())
                .collect(),
            data: values.clone(),
        },
        None => HostTensor {
            shape: vec![batch.labels.len()],
            data: batch.labels.iter().map(|l| *l as f32).collect(),
        },
    }
}

/// `metrics/<phase>_<name>.json`: a per-class vector or a matrix (rows: the target class), atomically.
fn write_value(
    dir: &Path,
    phase: Phase,
    name: &str,
    epoch: u64,
    value: &Value,
) -> anyhow::Result<()> {
    let json = match value {
        Value::Scalar(v) => serde_json::json!({"value": v}),
        Value::Vector(v) => serde_json::json!({"per_class": v}),
        Value::Matrix { rows, cols, values } => serde_json::json!({
            "rows": rows,
            "cols": cols,
            "matrix": values.chunks(*cols).collect::<Vec<_>>(),
        }),
    };
    let mut json = json;
    json["name"] = name.into();
    json["phase"] = phase.prefix().into();
    json["epoch"] = epoch.into();
    let path = dir
        .join("metrics")
        .join(format!("{}_{name}.json", phase.prefix()));
    crate::storage::records::write_atomic(&path, serde_json::to_string_pretty(&json)?.as_bytes())
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))
}

/// The trainer's ranks as the metrics' reducer.
pub(super) struct RanksReducer<'a>(pub(super) &'a Ranks);

impl Reducer for RanksReducer<'_> {
    fn world_size(&self) -> usize {
        self.0.world_size
    }
    fn rank(&self) -> usize {
        self.0.rank
    }
    fn sum(&self, values: &mut [f64]) -> anyhow::Result<()> {
        self.0.sum(values)
    }
    fn max(&self, values: &mut [f64]) -> anyhow::Result<()> {
        match self.0.comm() {
            Some(c) => c.all_reduce_f64(values, crate::comm::collective::ReduceOp::Max),
            None => Ok(()),
        }
    }
    fn min(&self, values: &mut [f64]) -> anyhow::Result<()> {
        match self.0.comm() {
            Some(c) => c.all_reduce_f64(values, crate::comm::collective::ReduceOp::Min),
            None => Ok(()),
        }
    }
}

/// `row` with each stateful metric's placeholder (`RunMetrics` puts NaN under its key) set to its value
/// in `values`, and the placeholders with no value dropped (a step row has no epoch metric).
pub fn complete(row: &mut Vec<(String, f64)>, values: &[(String, f64)], names: &[(String, bool)]) {
    for (key, value) in values {
        if let Some(slot) = row.iter_mut().find(|(k, _)| k == key) {
            slot.1 = *value;
        }
    }
    row.retain(|(k, v)| {
        let stateful = k
            .split_once('/')
            .is_some_and(|(_, n)| names.iter().any(|(name, _)| name == n));
        !(stateful && v.is_nan())
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::collective::Collective;
    use crate::metrics::sync;
    use std::sync::Arc;

    fn t(shape: &[usize], data: Vec<f32>) -> HostTensor {
        HostTensor {
            shape: shape.to_vec(),
            data,
        }
    }

    /// The metrics a two-rank run combines over uneven shares equal one process on all the samples:
    /// summed states (F1, R², the confusion matrix) and concatenated ones (AUROC, Dice) alike, each
    /// state reduced once (a rank with no sample at all takes part too).
    #[test]
    fn two_ranks_with_uneven_shares_equal_one_process() {
        let targets = [
            (
                "torchmetrics.F1Score",
                serde_json::json!({"task": "multiclass", "num_classes": 3, "average": "macro"}),
            ),
            (
                "torchmetrics.AUROC",
                serde_json::json!({"task": "multiclass", "num_classes": 3}),
            ),
            (
                "torchmetrics.ConfusionMatrix",
                serde_json::json!({"task": "multiclass", "num_classes": 3}),
            ),
            (
                "torchmetrics.JaccardIndex",
                serde_json::json!({"task": "multiclass", "num_classes": 3}),
            ),
        ];
        let logits: Vec<f32> = (0..27)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) / 2.0)
            .collect();
        let labels: Vec<f32> = (0..9).map(|i| (i * 5 % 3) as f32).collect();
        // Rank 0: samples 0..7; rank 1: 7..9 (and a second case where rank 1 has none).
        for split in [7, 9] {
            for (target, args) in &targets {
                let build = crate::registry::metric(target).unwrap();
                let mut whole = build(args).unwrap();
                whole
                    .update(&t(&[9, 3], logits.clone()), &t(&[9], labels.clone()))
                    .unwrap();
                let want = whole.compute().unwrap();
                let comms: Vec<Arc<dyn Collective>> = crate::comm::local::group(2)
                    .into_iter()
                    .map(|c| Arc::new(c) as Arc<dyn Collective>)
                    .collect();
                let got: Vec<Value> = std::thread::scope(|s| {
                    let handles: Vec<_> = comms
                        .into_iter()
                        .enumerate()
                        .map(|(rank, comm)| {
                            let (logits, labels) = (&logits, &labels);
                            s.spawn(move || {
                                let ranks = Ranks::over(comm);
                                let mut m = build(args).unwrap();
                                let (lo, hi) = if rank == 0 { (0, split) } else { (split, 9) };
                                if hi > lo {
                                    let p = t(&[hi - lo, 3], logits[lo * 3..hi * 3].to_vec());
                                    let g = t(&[hi - lo], labels[lo..hi].to_vec());
                                    m.update(&p, &g).unwrap();
                                }
                                sync(m.as_mut(), &RanksReducer(&ranks)).unwrap();
                                m.compute().unwrap()
                            })
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join().unwrap()).collect()
                });
                assert_eq!(got[0], want, "{target}, split at {split}");
                assert_eq!(got[1], want, "{target}, split at {split}");
            }
        }
    }

    #[test]
    fn placeholders_take_values_or_leave_the_row() {
        let mut row = vec![
            ("val/loss".to_string(), 0.5),
            ("val/f1".to_string(), f64::NAN),
            ("val/r2".to_string(), f64::NAN),
        ];
        let names = [("f1".to_string(), true), ("r2".to_string(), true)];
        complete(&mut row, &[("val/f1".into(), 0.75)], &names);
        assert_eq!(
            row,
            vec![("val/loss".to_string(), 0.5), ("val/f1".to_string(), 0.75)]
        );
    }
}
