//! Fully sharded data parallel (PyTorch FSDP's contract, ZeRO's memory plan). All parameters are one flat
//! vector in name order, padded to a multiple of the world size; rank r owns slice r of it, of its
//! gradient and of every optimizer slot. A step runs:
//! 1. all-gather the slices into the full parameters (the engine computes on them);
//! 2. forward and backward on this rank's batch (micro-batches accumulate in the engine);
//! 3. reduce-scatter the gradient, so rank r receives the mean gradient of its slice, and free the full
//!    parameters and gradients (`FULL_SHARD`, `SHARD_GRAD_OP`);
//! 4. the optimizer updates the slice only: its state exists only for the slice.
//!
//! `NO_SHARD` keeps everything whole and all-reduces the gradient (DDP's plan, through the same code).
//! The whole model is one FSDP unit (PyTorch's FSDP without an `auto_wrap_policy`): parameters are
//! gathered for the whole forward and backward, not block by block.
//!
//! Checkpoints: `state_dict_type: full` consolidates parameters and optimizer state under the usual names
//! (every rank takes part; rank 0 writes), so a single-device run loads them; `sharded` checkpoints are
//! one file per rank with the slices (`<name>.safetensors` on rank 0, `<name>.shard<r>.safetensors`).

use crate::backend::optim::{clip_factor, OptTensor, Optimizer};
use crate::backend::{Engine, HostTensor, StateBytes, StateDict, StepStats};
use crate::data::loader::Batch;
use crate::dist::collective::{Collective, ReduceOp};
use crate::schema::{Experiment, ShardingStrategy, StateDictType};
use anyhow::Context;

/// Where each parameter sits in the flat vector, and which slice is this rank's.
#[derive(Debug, Clone, PartialEq)]
pub struct FlatLayout {
    /// Parameters in flat order, with their shapes.
    pub params: Vec<(String, Vec<usize>)>,
    /// Real elements (the rest, up to `shard_len * world`, is zero padding).
    pub numel: usize,
    pub shard_len: usize,
    pub rank: usize,
    pub world: usize,
}

impl FlatLayout {
    pub fn new(params: Vec<(String, Vec<usize>)>, rank: usize, world: usize) -> FlatLayout {
        let numel = params
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum();
        FlatLayout {
            params,
            numel,
            shard_len: numel.div_ceil(world.max(1)),
            rank,
            world: world.max(1),
        }
    }

    pub fn padded(&self) -> usize {
        self.shard_len * self.world
    }

    /// This rank's slice of the padded flat vector.
    pub fn shard_range(&self) -> std::ops::Range<usize> {
        self.rank * self.shard_len..(self.rank + 1) * self.shard_len
    }

    /// Named tensors (a slot per parameter: `<prefix><param><suffix>`) as one padded flat vector; `None`
    /// when no parameter has the slot, an error when only some have it.
    pub fn flatten(
        &self,
        state: &StateDict,
        prefix: &str,
        suffix: &str,
    ) -> anyhow::Result<Option<Vec<f32>>> {
        let mut flat = Vec::with_capacity(self.padded());
        let mut missing = Vec::new();
        for (name, shape) in &self.params {
            let key = format!("{prefix}{name}{suffix}");
            match state.get(&key) {
                Some(t) if &t.shape == shape => flat.extend_from_slice(&t.data),
                Some(t) => anyhow::bail!(
                    "tensor '{key}': checkpoint shape {:?}, model shape {shape:?}",
                    t.shape
                ),
                None => missing.push(key),
            }
        }
        if missing.len() == self.params.len() {
            return Ok(None);
        }
        anyhow::ensure!(
            missing.is_empty(),
            "the checkpoint lacks {} of the model's tensors, e.g. '{}'",
            missing.len(),
            missing[0]
        );
        flat.resize(self.padded(), 0.0);
        Ok(Some(flat))
    }

    /// The inverse of `flatten`: named tensors from a flat vector (padding ignored).
    pub fn unflatten(&self, flat: &[f32], prefix: &str, suffix: &str) -> StateDict {
        crate::backend::layout_ranges(&self.params)
            .map(|(name, shape, range)| {
                let t = HostTensor {
                    shape: shape.to_vec(),
                    data: flat[range].to_vec(),
                };
                (format!("{prefix}{name}{suffix}"), t)
            })
            .collect()
    }
}

/// A host vector under the shared optimizer rules: the slice's arithmetic is element-wise f32, the same
/// as every backend's, so sharded and unsharded runs take the same steps.
#[derive(Debug, Clone, PartialEq)]
pub struct HostVec(pub Vec<f32>);

impl HostVec {
    fn zip(&self, other: &Self, f: impl Fn(f32, f32) -> f32) -> anyhow::Result<Self> {
        anyhow::ensure!(self.0.len() == other.0.len(), "shard lengths differ");
        Ok(HostVec(
            self.0
                .iter()
                .zip(&other.0)
                .map(|(&a, &b)| f(a, b))
                .collect(),
        ))
    }
    fn map(&self, f: impl Fn(f32) -> f32) -> Self {
        HostVec(self.0.iter().map(|&a| f(a)).collect())
    }
}

impl OptTensor for HostVec {
    fn duplicate(&self) -> Self {
        self.clone()
    }
    fn owned_copy(&self) -> anyhow::Result<Self> {
        Ok(self.clone())
    }
    fn affine(&self, mul: f64, add: f64) -> anyhow::Result<Self> {
        let (mul, add) = (mul as f32, add as f32);
        Ok(self.map(|a| a * mul + add))
    }
    fn plus(&self, other: &Self) -> anyhow::Result<Self> {
        self.zip(other, |a, b| a + b)
    }
    fn minus(&self, other: &Self) -> anyhow::Result<Self> {
        self.zip(other, |a, b| a - b)
    }
    fn divide(&self, other: &Self) -> anyhow::Result<Self> {
        self.zip(other, |a, b| a / b)
    }
    fn square(&self) -> anyhow::Result<Self> {
        Ok(self.map(|a| a * a))
    }
    fn root(&self) -> anyhow::Result<Self> {
        Ok(self.map(f32::sqrt))
    }
    fn sum_of_squares(&self) -> anyhow::Result<f64> {
        Ok(self.0.iter().map(|&a| f64::from(a) * f64::from(a)).sum())
    }
}

/// The optimizer's key for the flat slice; a slot `flat.<slot>` holds `<param>.<slot>` of every parameter.
const FLAT: &str = "flat";
/// Checkpoint key of a sharded checkpoint's parameter slice (slots: `optimizer.fsdp.flat_param.<slot>`).
const SHARD_KEY: &str = "fsdp.flat_param";
/// Optimizer slot names the rules use (`backend::optim`).
const SLOTS: &[&str] = &["momentum_buffer", "exp_avg", "exp_avg_sq"];

/// Where rank `rank` keeps its part of a sharded checkpoint whose rank-0 file is `path`
/// (`last.safetensors` → `last.shard1.safetensors`).
pub fn shard_path(path: &std::path::Path, rank: usize) -> std::path::PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!("{stem}.shard{rank}.safetensors"))
}

/// An engine whose parameters, gradients and optimizer state are sharded across ranks; `inner` computes.
pub struct ShardedEngine<'a> {
    inner: Box<dyn Engine + 'a>,
    comm: &'a dyn Collective,
    layout: FlatLayout,
    strategy: ShardingStrategy,
    state_dict_type: StateDictType,
    /// This rank's slice of the flat parameters (`NO_SHARD`: all of them, unpadded).
    shard: HostVec,
    /// The mean gradient of `shard`, from the last reduction until the step.
    grad: Option<HostVec>,
    optimizer: Optimizer<HostVec>,
    /// `inner` holds the current full parameters.
    materialized: bool,
}

impl<'a> ShardedEngine<'a> {
    /// Shard `inner`'s parameters (every rank must build the same model; rank 0's values win when the
    /// trainer broadcasts the state).
    pub fn new(
        exp: &Experiment,
        mut inner: Box<dyn Engine + 'a>,
        comm: &'a dyn Collective,
    ) -> anyhow::Result<Self> {
        let cfg = exp.trainer.fsdp.clone().context(
            "trainer.strategy=fsdp needs a trainer.fsdp section (sharding_strategy, state_dict_type); \
             use trainer=fsdp",
        )?;
        let (rank, world) = match cfg.sharding_strategy {
            ShardingStrategy::NoShard => (0, 1),
            _ => (comm.rank(), comm.world_size()),
        };
        let layout = FlatLayout::new(inner.parameter_shapes(), rank, world);
        let state = inner.state_dict()?;
        let full = layout
            .flatten(&state, "", "")?
            .context("the model has no parameters")?;
        let shard = HostVec(full[layout.shard_range()].to_vec());
        if cfg.sharding_strategy != ShardingStrategy::NoShard {
            inner.release_parameters()?;
        }
        Ok(ShardedEngine {
            materialized: cfg.sharding_strategy == ShardingStrategy::NoShard,
            inner,
            comm,
            layout,
            strategy: cfg.sharding_strategy,
            state_dict_type: cfg.state_dict_type,
            shard,
            grad: None,
            optimizer: Optimizer::new(exp.optimizer.clone()),
        })
    }

    fn sharded(&self) -> bool {
        self.strategy != ShardingStrategy::NoShard
    }

    /// The full flat parameters (every rank takes part when sharded).
    fn gather(&self, slice: &HostVec) -> anyhow::Result<Vec<f32>> {
        if !self.sharded() {
            return Ok(slice.0.clone());
        }
        let mut full = vec![0.0; self.layout.padded()];
        self.comm
            .all_gather_f32(&slice.0, &mut full)
            .context("FSDP: all-gathering the parameter shards")?;
        Ok(full)
    }

    /// Put the full parameters into the engine before it computes (FSDP's unshard).
    fn unshard(&mut self) -> anyhow::Result<()> {
        if self.materialized {
            return Ok(());
        }
        let full = self.gather(&self.shard)?;
        self.inner
            .set_parameters(&self.layout.params, &full[..self.layout.numel])?;
        self.materialized = true;
        Ok(())
    }

    /// Take this rank's slice of a full (named) state: parameters and optimizer slots.
    fn load_full(&mut self, state: &StateDict) -> anyhow::Result<()> {
        let range = self.layout.shard_range();
        let params = self
            .layout
            .flatten(state, "", "")?
            .context("the checkpoint has none of the model's parameters")?;
        self.shard = HostVec(params[range.clone()].to_vec());
        self.optimizer.state.clear();
        for slot in SLOTS {
            if let Some(flat) = self
                .layout
                .flatten(state, "optimizer.", &format!(".{slot}"))?
            {
                self.optimizer.state.insert(
                    format!("{FLAT}.{slot}"),
                    HostVec(flat[range.clone()].to_vec()),
                );
            }
        }
        Ok(())
    }

    /// Take this rank's slice from a sharded checkpoint written by the same world size.
    fn load_sharded(&mut self, state: &StateDict) -> anyhow::Result<()> {
        let shard = state.get(SHARD_KEY).context(
            "this is not a sharded FSDP checkpoint (no fsdp.flat_param); set \
             trainer.fsdp.state_dict_type=full to load a full one",
        )?;
        anyhow::ensure!(
            shard.data.len() == self.layout.shard_len,
            "the sharded checkpoint holds a slice of {} values, this rank's is {}: it was written by a \
             different world size or model; resume with the same trainer.devices × trainer.num_nodes, or \
             save with state_dict_type=full",
            shard.data.len(),
            self.layout.shard_len
        );
        self.shard = HostVec(shard.data.clone());
        self.optimizer.state.clear();
        for slot in SLOTS {
            if let Some(t) = state.get(&format!("optimizer.{SHARD_KEY}.{slot}")) {
                self.optimizer
                    .state
                    .insert(format!("{FLAT}.{slot}"), HostVec(t.data.clone()));
            }
        }
        Ok(())
    }

    /// The engine's state without parameters and optimizer slots: buffers and counters.
    fn inner_extras(&self) -> anyhow::Result<StateDict> {
        let params: std::collections::BTreeSet<&str> =
            self.layout.params.iter().map(|(n, _)| n.as_str()).collect();
        Ok(self
            .inner
            .state_dict()?
            .into_iter()
            .filter(|(k, _)| {
                !params.contains(k.as_str())
                    && (!k.starts_with("optimizer.")
                        || matches!(k.as_str(), "optimizer.forward_calls"))
            })
            .collect())
    }
}

fn counter(value: u64) -> HostTensor {
    HostTensor {
        shape: vec![1],
        data: vec![value as f32],
    }
}

impl Engine for ShardedEngine<'_> {
    fn forward_backward(&mut self, batch: &Batch, grad_scale: f64) -> anyhow::Result<StepStats> {
        self.unshard()?;
        self.inner.forward_backward(batch, grad_scale)
    }

    fn all_reduce_gradients(
        &mut self,
        _comm: &dyn Collective,
        _sync: &super::ddp::GradSync,
    ) -> anyhow::Result<()> {
        // FSDP gives a parameter that took no part a zero gradient (no find_unused_parameters error).
        let mut full = vec![0.0f32; self.layout.padded()];
        self.inner
            .take_gradients(&self.layout.params, &mut full[..self.layout.numel])?;
        let world = self.comm.world_size() as f32;
        let mut mine = if self.sharded() {
            let mut slice = vec![0.0f32; self.layout.shard_len];
            self.comm
                .reduce_scatter_f32(&mut full, &mut slice)
                .context("FSDP: reduce-scattering the gradients")?;
            // Reshard after backward: until the next unshard this rank holds only its slice.
            self.inner.release_parameters()?;
            self.materialized = false;
            slice
        } else {
            self.comm
                .all_reduce_f32(&mut full, ReduceOp::Sum)
                .context("FSDP (NO_SHARD): all-reducing the gradients")?;
            full
        };
        mine.iter_mut().for_each(|g| *g /= world);
        self.grad = Some(match self.grad.take() {
            Some(prev) => prev.plus(&HostVec(mine))?,
            None => HostVec(mine),
        });
        Ok(())
    }

    fn optimizer_step(
        &mut self,
        lr: f64,
        momentum: Option<f64>,
        clip_norm: Option<f64>,
    ) -> anyhow::Result<f64> {
        let grad = self.grad.take().context(
            "FSDP: optimizer step without reduced gradients (all_reduce_gradients must come first)",
        )?;
        // The global norm: each rank's slice contributes its sum of squares (padding is zero).
        let (norm, scale) = if self.sharded() {
            let mut sq = [grad.sum_of_squares()?];
            self.comm.all_reduce_f64(&mut sq, ReduceOp::Sum)?;
            let norm = sq[0].sqrt();
            let scale = match clip_norm {
                Some(max) if norm > max => max / (norm + 1e-6),
                _ => 1.0,
            };
            (norm, scale)
        } else {
            clip_factor([&grad], clip_norm)?
        };
        let grad = if scale != 1.0 {
            grad.affine(scale, 0.0)?
        } else {
            grad
        };
        self.shard = self
            .optimizer
            .update(FLAT, &self.shard, &grad, lr, momentum)?;
        self.optimizer.steps += 1;
        if self.sharded() {
            self.materialized = false;
        } else {
            self.inner
                .set_parameters(&self.layout.params, &self.shard.0[..self.layout.numel])?;
        }
        Ok(norm)
    }

    fn evaluate(&mut self, batch: &Batch) -> anyhow::Result<StepStats> {
        self.unshard()?;
        self.inner.evaluate(batch)
    }

    fn state_dict(&self) -> anyhow::Result<StateDict> {
        let mut out = self.inner_extras()?;
        out.insert("optimizer.step".into(), counter(self.optimizer.steps));
        match self.state_dict_type {
            StateDictType::Full => {
                let full = self.gather(&self.shard)?;
                out.extend(self.layout.unflatten(&full, "", ""));
                for (key, slice) in &self.optimizer.state {
                    let slot = key.strip_prefix(FLAT).unwrap_or(key);
                    let full = self.gather(slice)?;
                    out.extend(self.layout.unflatten(&full, "optimizer.", slot));
                }
            }
            StateDictType::Sharded => {
                let slice = |v: &HostVec| HostTensor {
                    shape: vec![v.0.len()],
                    data: v.0.clone(),
                };
                out.insert(SHARD_KEY.into(), slice(&self.shard));
                for (key, v) in &self.optimizer.state {
                    let slot = key.strip_prefix(FLAT).unwrap_or(key);
                    out.insert(format!("optimizer.{SHARD_KEY}{slot}"), slice(v));
                }
            }
        }
        Ok(out)
    }

    fn load_state_dict(&mut self, state: &StateDict) -> anyhow::Result<()> {
        if state.contains_key(SHARD_KEY) {
            self.load_sharded(state)?;
        } else {
            self.load_full(state)?;
        }
        // Buffers and counters go to the engine, with the parameters it expects.
        let full = self.gather(&self.shard)?;
        let mut extras: StateDict = state
            .iter()
            .filter(|(k, _)| {
                !k.starts_with("optimizer.") || k.as_str() == "optimizer.forward_calls"
            })
            .filter(|(k, _)| k.as_str() != SHARD_KEY)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        extras.extend(self.layout.unflatten(&full, "", ""));
        // Released parameters have no shape to load into: give them their full values first.
        self.inner
            .set_parameters(&self.layout.params, &full[..self.layout.numel])?;
        self.inner.load_state_dict(&extras)?;
        self.materialized = true;
        if let Some(step) = state.get("optimizer.step") {
            self.optimizer.steps = step.data.first().copied().unwrap_or(0.0) as u64;
        }
        self.grad = None;
        Ok(())
    }

    fn load_pretrained(&mut self, state: &StateDict) -> anyhow::Result<Vec<String>> {
        self.unshard()?;
        let kept = self.inner.load_pretrained(state)?;
        let params = self
            .layout
            .flatten(&self.inner.state_dict()?, "", "")?
            .context("the model has no parameters")?;
        self.shard = HostVec(params[self.layout.shard_range()].to_vec());
        Ok(kept)
    }

    fn num_parameters(&self) -> usize {
        self.layout.numel
    }

    fn parameter_shapes(&self) -> Vec<(String, Vec<usize>)> {
        self.layout.params.clone()
    }

    fn set_parameters(
        &mut self,
        _layout: &[(String, Vec<usize>)],
        _flat: &[f32],
    ) -> anyhow::Result<()> {
        anyhow::bail!("FSDP cannot be nested inside another sharded strategy")
    }

    fn release_parameters(&mut self) -> anyhow::Result<()> {
        anyhow::bail!("FSDP cannot be nested inside another sharded strategy")
    }

    fn take_gradients(
        &mut self,
        _layout: &[(String, Vec<usize>)],
        _flat: &mut [f32],
    ) -> anyhow::Result<Vec<String>> {
        anyhow::bail!("FSDP cannot be nested inside another sharded strategy")
    }

    /// What this rank keeps between steps: its parameter slice, its gradient slice (held from the
    /// reduction to the step) and its optimizer slots. The full parameters exist only while the model
    /// computes.
    fn state_bytes(&self) -> StateBytes {
        let bytes = |v: &HostVec| (v.0.len() * 4) as u64;
        StateBytes {
            parameters: bytes(&self.shard),
            gradients: bytes(&self.shard),
            optimizer_state: self.optimizer.state.values().map(bytes).sum(),
        }
    }

    fn state_dict_is_collective(&self) -> bool {
        self.sharded() && self.state_dict_type == StateDictType::Full
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn layout(rank: usize, world: usize) -> FlatLayout {
        FlatLayout::new(
            vec![("a".into(), vec![2, 3]), ("b".into(), vec![5])],
            rank,
            world,
        )
    }

    #[rstest]
    #[case::one(1, 11, 11)]
    #[case::two(2, 6, 12)]
    #[case::four(4, 3, 12)]
    #[case::more_ranks_than_values(16, 1, 16)]
    fn shards_cover_the_padded_vector(
        #[case] world: usize,
        #[case] shard: usize,
        #[case] padded: usize,
    ) {
        let l = layout(world - 1, world);
        assert_eq!((l.numel, l.shard_len, l.padded()), (11, shard, padded));
        assert_eq!(l.shard_range().end, padded);
    }

    #[test]
    fn flatten_and_unflatten_round_trip() {
        let l = layout(0, 2);
        let mut state = StateDict::new();
        state.insert(
            "optimizer.a.exp_avg".into(),
            HostTensor {
                shape: vec![2, 3],
                data: (0..6).map(|i| i as f32).collect(),
            },
        );
        state.insert(
            "optimizer.b.exp_avg".into(),
            HostTensor {
                shape: vec![5],
                data: vec![9.0; 5],
            },
        );
        let flat = l
            .flatten(&state, "optimizer.", ".exp_avg")
            .unwrap()
            .unwrap();
        assert_eq!(flat.len(), 12);
        assert_eq!(flat[11], 0.0, "padding is zero");
        assert_eq!(l.unflatten(&flat, "optimizer.", ".exp_avg"), state);
        assert_eq!(l.flatten(&state, "", "").unwrap(), None);
    }

    #[test]
    fn a_partial_slot_is_an_error_that_names_the_tensor() {
        let l = layout(0, 2);
        let mut state = StateDict::new();
        state.insert(
            "a".into(),
            HostTensor {
                shape: vec![2, 3],
                data: vec![0.0; 6],
            },
        );
        let e = l.flatten(&state, "", "").unwrap_err().to_string();
        assert!(e.contains("'b'"), "{e}");
    }

    /// The slice's optimizer arithmetic is the rules' own: a momentum SGD step on the host vector equals
    /// the hand-computed PyTorch update element by element.
    #[test]
    fn host_vectors_follow_the_optimizer_rules() {
        let node = crate::config::yaml::parse("{name: sgd, lr: 0.1, momentum: 0.9}", "<test>")
            .unwrap()
            .unwrap();
        let mut o = Optimizer::new(serde_json::from_value(node.to_json()).unwrap());
        let p = HostVec(vec![1.0, -2.0]);
        let g = HostVec(vec![0.5, 0.25]);
        let p1 = o.update(FLAT, &p, &g, 0.1, None).unwrap();
        assert_eq!(p1, HostVec(vec![1.0 - 0.05, -2.0 - 0.025]));
        assert!(o.state.contains_key("flat.momentum_buffer"));
    }
}
