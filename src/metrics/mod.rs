//! Stateful metrics with torchmetrics' contract: `update(preds, target)` once per batch, `compute()` over
//! everything since the last `reset()`, and declared states, each with the reduction that combines the
//! ranks' copies (`Reduce`: sum, mean, max, min, or cat for those that keep every sample, as AUROC's
//! scores). A metric never talks to other processes: `MetricSet::compute` hands its states to a
//! `Reducer` (the trainer's ranks) once, then computes on the combined states.
//!
//! Inputs are host arrays (`HostTensor`): `preds` as the model gives them (logits, probabilities, labels
//! or values) and `target` (class indices, as floats, or values), so a metric is the same on every
//! backend. The built-ins follow torchmetrics 1.9's definitions and defaults (`classification`,
//! `regression`, `segmentation`; `torchmetrics` maps their `_target_` names and arguments).

pub mod classification;
pub mod curves;
pub mod inputs;
pub mod regression;
pub mod segmentation;
pub mod torchmetrics;

use crate::tensor::HostTensor;

/// How a state's copies on the ranks combine (torchmetrics' `dist_reduce_fx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduce {
    Sum,
    Mean,
    Max,
    Min,
    /// Concatenated in rank order (every rank's samples kept).
    Cat,
}

/// One declared state: its values (a tensor's, flattened) and how ranks combine it.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    pub name: &'static str,
    pub reduce: Reduce,
    pub values: Vec<f64>,
    /// What `reset` puts back (empty for a `Cat` state).
    pub initial: Vec<f64>,
}

impl State {
    pub fn new(name: &'static str, reduce: Reduce, initial: Vec<f64>) -> State {
        State {
            name,
            reduce,
            values: initial.clone(),
            initial,
        }
    }

    /// A state that grows by concatenation (every sample's value kept).
    pub fn cat(name: &'static str) -> State {
        State::new(name, Reduce::Cat, Vec::new())
    }

    pub fn reset(&mut self) {
        self.values.clone_from(&self.initial);
    }
}

/// What `compute` gives: one number (what is logged), or per-class values and a matrix (a confusion
/// matrix), which are logged per entry (`name_0`, `name_1`, ...) and kept whole for the logbook.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Scalar(f64),
    Vector(Vec<f64>),
    Matrix {
        rows: usize,
        cols: usize,
        values: Vec<f64>,
    },
}

impl Value {
    /// The scalars a row logs for metric `name`: the value itself, or one per entry.
    pub fn logged(&self, name: &str) -> Vec<(String, f64)> {
        match self {
            Value::Scalar(v) => vec![(name.to_string(), *v)],
            Value::Vector(v) => v
                .iter()
                .enumerate()
                .map(|(i, x)| (format!("{name}_{i}"), *x))
                .collect(),
            Value::Matrix { cols, values, .. } => values
                .iter()
                .enumerate()
                .map(|(i, x)| (format!("{name}_{}_{}", i / cols, i % cols), *x))
                .collect(),
        }
    }
}

/// Bad input to a metric: its name and what was wrong.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct MetricError(pub String);

pub type Result<T> = std::result::Result<T, MetricError>;

/// Builds a `MetricError`.
pub fn bad(message: impl Into<String>) -> MetricError {
    MetricError(message.into())
}

/// `Metric::states` and `states_mut` of a metric whose states are the named fields (paths into
/// `self`), in the order its ranks' copies are combined.
macro_rules! states_of {
    ($($($field:ident).+),+ $(,)?) => {
        fn states(&self) -> Vec<&$crate::metrics::State> {
            vec![$(&self.$($field).+),+]
        }

        fn states_mut(&mut self) -> Vec<&mut $crate::metrics::State> {
            vec![$(&mut self.$($field).+),+]
        }
    };
}
pub(crate) use states_of;

/// A tensor for the metrics' unit tests.
#[cfg(test)]
pub(crate) fn tensor(shape: &[usize], data: &[f32]) -> HostTensor {
    HostTensor {
        shape: shape.to_vec(),
        data: data.to_vec(),
    }
}

/// A stateful metric (torchmetrics' `Metric`).
pub trait Metric: Send {
    /// Accumulates one batch into the states.
    fn update(&mut self, preds: &HostTensor, target: &HostTensor) -> Result<()>;
    /// The value over the states as they are (after the ranks' copies were combined).
    fn compute(&self) -> Result<Value>;
    fn states(&self) -> Vec<&State>;
    fn states_mut(&mut self) -> Vec<&mut State>;
    /// Whether a larger value is better (ModelCheckpoint's and EarlyStopping's `mode` default).
    fn higher_is_better(&self) -> bool;
    /// Whether `compute` gives one number (what a monitor or a search can read); per-class values and
    /// matrices are not.
    fn is_scalar(&self) -> bool {
        true
    }
    fn reset(&mut self) {
        for s in self.states_mut() {
            s.reset();
        }
    }
}

/// Combines the ranks' copies of a state (the trainer's process group; `Local` for one process).
pub trait Reducer {
    fn world_size(&self) -> usize;
    /// Element-wise over the ranks, in place.
    fn sum(&self, values: &mut [f64]) -> anyhow::Result<()>;
    fn max(&self, values: &mut [f64]) -> anyhow::Result<()>;
    fn min(&self, values: &mut [f64]) -> anyhow::Result<()>;
    /// Every rank's `values` concatenated in rank order (lengths may differ).
    fn gather(&self, values: &[f64]) -> anyhow::Result<Vec<f64>> {
        let world = self.world_size();
        let rank = self.rank();
        let mut lengths = vec![0.0; world];
        lengths[rank] = values.len() as f64;
        self.sum(&mut lengths)?;
        let offset: usize = lengths[..rank].iter().map(|l| *l as usize).sum();
        let total: usize = lengths.iter().map(|l| *l as usize).sum();
        let mut all = vec![0.0; total];
        all[offset..offset + values.len()].copy_from_slice(values);
        self.sum(&mut all)?;
        Ok(all)
    }
    fn rank(&self) -> usize;
}

/// One process: nothing to combine.
pub struct Local;

impl Reducer for Local {
    fn world_size(&self) -> usize {
        1
    }
    fn rank(&self) -> usize {
        0
    }
    fn sum(&self, _: &mut [f64]) -> anyhow::Result<()> {
        Ok(())
    }
    fn max(&self, _: &mut [f64]) -> anyhow::Result<()> {
        Ok(())
    }
    fn min(&self, _: &mut [f64]) -> anyhow::Result<()> {
        Ok(())
    }
    fn gather(&self, values: &[f64]) -> anyhow::Result<Vec<f64>> {
        Ok(values.to_vec())
    }
}

/// Every state of `metric` combined over the ranks, in place: exactly one collective per state (the
/// gather of a `Cat` state, two).
pub fn sync(metric: &mut dyn Metric, reducer: &dyn Reducer) -> anyhow::Result<()> {
    if reducer.world_size() <= 1 {
        return Ok(());
    }
    for state in metric.states_mut() {
        match state.reduce {
            Reduce::Sum => reducer.sum(&mut state.values)?,
            Reduce::Mean => {
                reducer.sum(&mut state.values)?;
                let n = reducer.world_size() as f64;
                state.values.iter_mut().for_each(|v| *v /= n);
            }
            Reduce::Max => reducer.max(&mut state.values)?,
            Reduce::Min => reducer.min(&mut state.values)?,
            Reduce::Cat => state.values = reducer.gather(&state.values)?,
        }
    }
    Ok(())
}

/// A run's metrics by name (`metrics.<name>` in the config), updated each batch and computed once per
/// epoch (or step) and phase.
pub struct MetricSet {
    pub metrics: Vec<(String, Box<dyn Metric>)>,
}

impl MetricSet {
    pub fn update(&mut self, preds: &HostTensor, target: &HostTensor) -> anyhow::Result<()> {
        for (name, m) in &mut self.metrics {
            m.update(preds, target)
                .map_err(|e| anyhow::anyhow!("metrics.{name}: {e}"))?;
        }
        Ok(())
    }

    /// Each metric's value over every rank's batches since the last reset (the states combined once,
    /// then reset here, torchmetrics' `compute` + `reset` at an epoch's end).
    pub fn compute_and_reset(
        &mut self,
        reducer: &dyn Reducer,
    ) -> anyhow::Result<Vec<(String, Value)>> {
        let mut out = Vec::with_capacity(self.metrics.len());
        for (name, m) in &mut self.metrics {
            sync(m.as_mut(), reducer)?;
            let value = m
                .compute()
                .map_err(|e| anyhow::anyhow!("metrics.{name}: {e}"))?;
            m.reset();
            out.push((name.clone(), value));
        }
        Ok(out)
    }

    pub fn is_empty(&self) -> bool {
        self.metrics.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two "ranks" in one process: each rank's reducer sees the other's values through shared sums.
    struct Pair {
        rank: usize,
        other: Vec<f64>,
        other_cat: Vec<f64>,
    }

    impl Reducer for Pair {
        fn world_size(&self) -> usize {
            2
        }
        fn rank(&self) -> usize {
            self.rank
        }
        fn sum(&self, v: &mut [f64]) -> anyhow::Result<()> {
            for (a, b) in v.iter_mut().zip(&self.other) {
                *a += b;
            }
            Ok(())
        }
        fn max(&self, v: &mut [f64]) -> anyhow::Result<()> {
            for (a, b) in v.iter_mut().zip(&self.other) {
                *a = a.max(*b);
            }
            Ok(())
        }
        fn min(&self, v: &mut [f64]) -> anyhow::Result<()> {
            for (a, b) in v.iter_mut().zip(&self.other) {
                *a = a.min(*b);
            }
            Ok(())
        }
        fn gather(&self, v: &[f64]) -> anyhow::Result<Vec<f64>> {
            Ok(match self.rank {
                0 => [v, &self.other_cat].concat(),
                _ => [&self.other_cat[..], v].concat(),
            })
        }
    }

    #[test]
    fn states_combine_by_their_reduction() {
        struct M(Vec<State>);
        impl Metric for M {
            fn update(&mut self, _: &HostTensor, _: &HostTensor) -> Result<()> {
                Ok(())
            }
            fn compute(&self) -> Result<Value> {
                Ok(Value::Vector(
                    self.0.iter().flat_map(|s| s.values.clone()).collect(),
                ))
            }
            fn states(&self) -> Vec<&State> {
                self.0.iter().collect()
            }
            fn states_mut(&mut self) -> Vec<&mut State> {
                self.0.iter_mut().collect()
            }
            fn higher_is_better(&self) -> bool {
                true
            }
        }
        let mut m = M(vec![
            State::new("s", Reduce::Sum, vec![1.0]),
            State::new("m", Reduce::Mean, vec![2.0]),
            State::new("x", Reduce::Max, vec![3.0]),
            State::new("n", Reduce::Min, vec![3.0]),
            State::cat("c"),
        ]);
        m.0[4].values = vec![7.0];
        let pair = Pair {
            rank: 1,
            other: vec![10.0],
            other_cat: vec![5.0, 6.0],
        };
        sync(&mut m, &pair).unwrap();
        assert_eq!(
            m.compute().unwrap(),
            Value::Vector(vec![11.0, 6.0, 10.0, 3.0, 5.0, 6.0, 7.0])
        );
        m.reset();
        assert_eq!(m.0[4].values, Vec::<f64>::new());
        assert_eq!(m.0[0].values, vec![1.0]);
    }
}
