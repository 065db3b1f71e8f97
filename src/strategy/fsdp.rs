//! Fully sharded data parallel (PyTorch FSDP's contract, ZeRO's memory plan). The model is cut into
//! units, as FSDP's `auto_wrap_policy` wraps blocks (`backend::units`: the stem, each residual or
//! transformer block, the head; `trainer.fsdp.min_num_params` groups consecutive ones as the size-based
//! policy does). Each unit's parameters are one flat vector in name order, padded to a
//! multiple of the world size; rank r owns slice r of it, of its gradient and of every optimizer slot.
//! - `FULL_SHARD`: the engine computes unit by unit. Forward: all-gather a unit, run it, free it.
//!   Backward, last unit first: all-gather it again, run it again with a graph (activation
//!   checkpointing at unit boundaries), backpropagate, reduce-scatter its gradient at once, free it.
//!   At most one unit's full parameters and gradients exist at a time.
//! - `SHARD_GRAD_OP`: every unit is all-gathered before the forward pass and kept through the backward
//!   pass; after it each unit's gradient is reduce-scattered and the full parameters are freed.
//! - `NO_SHARD`: everything stays whole and each unit's gradient is all-reduced (DDP's plan).
//!
//! The optimizer updates this rank's slices only: its state exists only for them. Under `16-mixed` the
//! engine scales the loss with its GradScaler; before the update each rank unscales its own gradient
//! slices and the ranks agree on whether any overflowed, so all skip or all step, and the scale moves
//! the same on every rank (PyTorch's ShardedGradScaler).
//!
//! Checkpoints: `state_dict_type: full` consolidates parameters and optimizer state under the usual names
//! (every rank takes part; rank 0 writes), so a single-device run loads them; `sharded` checkpoints are
//! one file per rank with the unit slices (`<name>.safetensors` on rank 0, `<name>.shard<r>.safetensors`).
//!
//! The slices live where the engine computes (`backend::flat`): host vectors for Candle, f32 tensors on
//! the engine's device for tch, where the all-gathers and reduce-scatters run without host copies
//! (NCCL for CUDA tensors, Gloo for host ones) and the sharded optimizer updates in place of the
//! device's memory, as PyTorch FSDP's flat parameters do.

use crate::backend::units::UnitExchange;
use crate::backend::{Engine, StateBytes, StepStats};
use crate::comm::collective::{Collective, ReduceOp};
use crate::data::loader::Batch;
use crate::model::stages::StageLayouts;
use crate::optim::{OptTensor, Optimizer};
use crate::schema::{Experiment, ShardingStrategy, StateDictType};
use crate::tensor::{Flat, FlatHome};
use crate::tensor::{HostTensor, StateDict};
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
        crate::tensor::layout_ranges(&self.params)
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

/// The optimizer's key for unit `u`'s flat slice; its slot `flat<u>.<slot>` holds `<param>.<slot>` of
/// every parameter of the unit.
fn unit_key(u: usize) -> String {
    format!("flat{u}")
}
/// Checkpoint key of unit `u`'s parameter slice in a sharded checkpoint (slots:
/// `optimizer.fsdp.units.<u>.flat_param.<slot>`).
fn shard_key(u: usize) -> String {
    format!("fsdp.units.{u}.flat_param")
}
/// Optimizer slot names the rules use (`backend::optim`).
const SLOTS: &[&str] = &["momentum_buffer", "exp_avg", "exp_avg_sq"];

/// The file name of rank `rank`'s part of a sharded checkpoint whose rank-0 file is `name`
/// (`last.safetensors` → `last.shard1.safetensors`); the same locally and in an object store.
pub fn shard_file_name(name: &str, rank: usize) -> String {
    let stem = name.strip_suffix(".safetensors").unwrap_or(name);
    format!("{stem}.shard{rank}.safetensors")
}

/// Where rank `rank` keeps its part of a sharded checkpoint whose rank-0 file is `path`.
pub fn shard_path(path: &std::path::Path, rank: usize) -> std::path::PathBuf {
    let name = path
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(shard_file_name(&name, rank))
}

/// One FSDP unit (a stage of the model: stem, block, head) and this rank's slices of it.
struct Unit {
    layout: FlatLayout,
    /// This rank's slice of the unit's flat parameters (`NO_SHARD`: all of them, unpadded).
    shard: Flat,
    /// The mean gradient of `shard`, summed over micro-batches, from the reductions until the step.
    grad: Option<Flat>,
}

/// How one rank gathers and reduces units: the collective and whether the units are sharded.
#[derive(Clone, Copy)]
struct Comms<'a> {
    comm: &'a dyn Collective,
    sharded: bool,
}

impl Comms<'_> {
    /// The unit's full flat parameters, padding included (every rank takes part when sharded).
    fn gather(&self, layout: &FlatLayout, slice: &Flat) -> anyhow::Result<Flat> {
        if !self.sharded || layout.numel == 0 {
            return slice.owned_copy();
        }
        #[cfg(feature = "torch")]
        if let Some((group, shard)) = self.on_device(slice) {
            let full =
                tch::Tensor::f_empty([layout.padded() as i64], (tch::Kind::Float, shard.device()))?;
            group
                .all_gather(&full, shard)
                .and_then(|work| work.wait())
                .context("FSDP: all-gathering the parameter shards")?;
            return Ok(Flat::Tch(full));
        }
        let mut full = vec![0.0; layout.padded()];
        self.comm
            .all_gather_f32(&slice.host_values()?, &mut full)
            .context("FSDP: all-gathering the parameter shards")?;
        slice.home().place(full)
    }

    /// This rank's slice of the unit's gradient averaged over ranks, from this rank's whole-unit
    /// gradient (`numel` values).
    fn reduce(&self, layout: &FlatLayout, grad: Flat) -> anyhow::Result<Flat> {
        anyhow::ensure!(
            grad.len() == layout.numel,
            "FSDP: a unit gradient of {} values for {} parameters",
            grad.len(),
            layout.numel
        );
        if layout.numel == 0 {
            return Ok(grad);
        }
        let world = self.comm.world_size();
        let grad = if self.sharded {
            grad.padded(layout.padded())?
        } else {
            grad
        };
        #[cfg(feature = "torch")]
        if let Some((group, full)) = self.on_device(&grad) {
            let mine = if self.sharded {
                let mine = tch::Tensor::f_empty(
                    [layout.shard_len as i64],
                    (tch::Kind::Float, full.device()),
                )?;
                group
                    .reduce_scatter(&mine, full, ReduceOp::Sum)
                    .and_then(|work| work.wait())
                    .context("FSDP: reduce-scattering the gradients")?;
                mine
            } else {
                group
                    .all_reduce(&[full], ReduceOp::Sum)
                    .and_then(|work| work.wait())
                    .context("FSDP (NO_SHARD): all-reducing the gradients")?;
                full.shallow_clone()
            };
            return Ok(Flat::Tch(mine.f_div_scalar(world as f64)?));
        }
        let home = grad.home();
        let mut grad = grad.into_host()?;
        let mut mine = if self.sharded {
            let mut slice = vec![0.0f32; layout.shard_len];
            self.comm
                .reduce_scatter_f32(&mut grad, &mut slice)
                .context("FSDP: reduce-scattering the gradients")?;
            slice
        } else {
            self.comm
                .all_reduce_f32(&mut grad, ReduceOp::Sum)
                .context("FSDP (NO_SHARD): all-reducing the gradients")?;
            grad
        };
        mine.iter_mut().for_each(|g| *g /= world as f32);
        home.place(mine)
    }

    /// The process group and tensor for a collective that can run on `flat` where it is (a tch
    /// tensor whose device the group serves); `None`: through host memory.
    #[cfg(feature = "torch")]
    fn on_device<'f>(
        &self,
        flat: &'f Flat,
    ) -> Option<(&crate::comm::c10d::ProcessGroup, &'f tch::Tensor)> {
        let Flat::Tch(t) = flat else { return None };
        let group = self.comm.process_group()?;
        group.runs_on(t.device()).then_some((group, t))
    }
}

impl Unit {
    fn accumulate(&mut self, grad: Flat) -> anyhow::Result<()> {
        self.grad = Some(match self.grad.take() {
            Some(prev) => prev.plus(&grad)?,
            None => grad,
        });
        Ok(())
    }
}

/// What the engine asks of the strategy while it computes unit by unit (`FULL_SHARD`).
struct Exchange<'s> {
    units: &'s mut [Unit],
    named: &'s StageLayouts,
    groups: &'s [std::ops::Range<usize>],
    comms: Comms<'s>,
    /// The most parameter bytes held whole at once.
    peak: &'s mut u64,
}

impl UnitExchange for Exchange<'_> {
    fn layouts(&self) -> &StageLayouts {
        self.named
    }

    fn units(&self) -> &[std::ops::Range<usize>] {
        self.groups
    }

    fn unshard(&mut self, unit: usize) -> anyhow::Result<Flat> {
        let u = &self.units[unit];
        let full = self.comms.gather(&u.layout, &u.shard)?;
        *self.peak = (*self.peak).max(4 * u.layout.numel as u64);
        full.truncated(u.layout.numel)
    }

    fn reduce(&mut self, unit: usize, grad: Flat) -> anyhow::Result<()> {
        let u = &mut self.units[unit];
        let mine = self.comms.reduce(&u.layout, grad)?;
        u.accumulate(mine)
    }
}

/// An engine whose parameters, gradients and optimizer state are sharded across ranks, unit by unit;
/// `inner` computes.
pub struct ShardedEngine<'a> {
    inner: Box<dyn Engine + 'a>,
    comms: Comms<'a>,
    strategy: ShardingStrategy,
    state_dict_type: StateDictType,
    units: Vec<Unit>,
    /// The model's stages' named layouts, as the engine computes over them.
    named: StageLayouts,
    /// The stages each unit spans (`trainer.fsdp.min_num_params`; one each by default).
    groups: Vec<std::ops::Range<usize>>,
    optimizer: Optimizer<Flat>,
    /// Where the slices live: where `inner` computes.
    home: FlatHome,
    /// `inner` holds every unit's current full parameters.
    materialized: bool,
    /// The most parameter bytes `inner` has held whole at once: one unit under `FULL_SHARD`, the model
    /// otherwise.
    unsharded_peak: u64,
}

/// The named tensors of `layout` (prefix/suffix: a slot) flattened and padded; empty for a unit
/// without parameters.
fn flat_or_empty(
    layout: &FlatLayout,
    state: &StateDict,
    prefix: &str,
    suffix: &str,
) -> anyhow::Result<Option<Vec<f32>>> {
    if layout.params.is_empty() {
        return Ok(Some(Vec::new()));
    }
    layout.flatten(state, prefix, suffix)
}

impl<'a> ShardedEngine<'a> {
    /// Shard `inner`'s parameters unit by unit (every rank must build the same model; rank 0's values
    /// win when the trainer broadcasts the state).
    pub fn new(
        exp: &Experiment,
        mut inner: Box<dyn Engine + 'a>,
        comm: &'a dyn Collective,
    ) -> anyhow::Result<Self> {
        let cfg = exp.trainer.fsdp.clone().context(
            "trainer.strategy=fsdp needs a trainer.fsdp section (sharding_strategy, state_dict_type); \
             use trainer=fsdp",
        )?;
        let sharded = cfg.sharding_strategy != ShardingStrategy::NoShard;
        let (rank, world) = match sharded {
            false => (0, 1),
            true => (comm.rank(), comm.world_size()),
        };
        let named = inner.units()?;
        let groups = crate::backend::units::group_stages(&named, cfg.min_num_params);
        anyhow::ensure!(inner.num_parameters() > 0, "the model has no parameters");
        let state = inner.state_dict()?;
        let home = inner.flat_home();
        let mut units = Vec::with_capacity(groups.len());
        for stages in &groups {
            let params = crate::backend::units::unit_layout(&named, stages.clone());
            let layout = FlatLayout::new(params, rank, world);
            let full = flat_or_empty(&layout, &state, "", "")?
                .context("the model's state lacks its parameters")?;
            units.push(Unit {
                shard: home.place(full[layout.shard_range()].to_vec())?,
                layout,
                grad: None,
            });
        }
        if sharded {
            inner.release_parameters()?;
        }
        let numel: usize = units.iter().map(|u| u.layout.numel).sum();
        Ok(ShardedEngine {
            materialized: !sharded,
            unsharded_peak: if sharded { 0 } else { 4 * numel as u64 },
            inner,
            comms: Comms { comm, sharded },
            strategy: cfg.sharding_strategy,
            state_dict_type: cfg.state_dict_type,
            units,
            named,
            groups,
            optimizer: Optimizer::new(exp.optimizer.clone()),
            home,
        })
    }

    fn sharded(&self) -> bool {
        self.comms.sharded
    }

    /// Does the engine compute unit by unit (parameters gathered per unit and freed after use)?
    fn by_unit(&self) -> bool {
        self.strategy == ShardingStrategy::FullShard
    }

    fn numel(&self) -> usize {
        self.units.iter().map(|u| u.layout.numel).sum()
    }

    fn exchange(&mut self) -> (&mut Box<dyn Engine + 'a>, Exchange<'_>) {
        let exchange = Exchange {
            units: &mut self.units,
            named: &self.named,
            groups: &self.groups,
            comms: self.comms,
            peak: &mut self.unsharded_peak,
        };
        (&mut self.inner, exchange)
    }

    /// Put every unit's full parameters into the engine before it computes (FSDP's unshard of the whole
    /// model: `SHARD_GRAD_OP` keeps them from the forward through the backward pass).
    fn unshard_all(&mut self) -> anyhow::Result<()> {
        if self.materialized {
            return Ok(());
        }
        for u in &self.units {
            let full = self.comms.gather(&u.layout, &u.shard)?;
            self.inner
                .set_parameters(&u.layout.params, &full.truncated(u.layout.numel)?)?;
        }
        self.materialized = true;
        self.unsharded_peak = self.unsharded_peak.max(4 * self.numel() as u64);
        Ok(())
    }

    /// Free the engine's full parameters (between steps a sharded rank holds only its slices).
    fn reshard(&mut self) -> anyhow::Result<()> {
        if self.sharded() && self.materialized {
            self.inner.release_parameters()?;
            self.materialized = false;
        }
        Ok(())
    }

    /// Take this rank's slices of a full (named) state: parameters and optimizer slots.
    fn load_full(&mut self, state: &StateDict) -> anyhow::Result<()> {
        self.optimizer.state.clear();
        for (i, u) in self.units.iter_mut().enumerate() {
            let range = u.layout.shard_range();
            let params = flat_or_empty(&u.layout, state, "", "")?
                .context("the checkpoint has none of the model's parameters")?;
            u.shard = self.home.place(params[range.clone()].to_vec())?;
            if u.layout.params.is_empty() {
                continue;
            }
            for slot in SLOTS {
                if let Some(flat) = u.layout.flatten(state, "optimizer.", &format!(".{slot}"))? {
                    self.optimizer.state.insert(
                        format!("{}.{slot}", unit_key(i)),
                        self.home.place(flat[range.clone()].to_vec())?,
                    );
                }
            }
        }
        Ok(())
    }

    /// Take this rank's slices from a sharded checkpoint written by the same world size and model.
    fn load_sharded(&mut self, state: &StateDict) -> anyhow::Result<()> {
        self.optimizer.state.clear();
        for (i, u) in self.units.iter_mut().enumerate() {
            if u.layout.params.is_empty() {
                continue;
            }
            let shard = state.get(&shard_key(i)).with_context(|| {
                format!(
                    "the sharded checkpoint has no '{}': it was written by another model (or before \
                     FSDP units); load a full one with trainer.fsdp.state_dict_type=full",
                    shard_key(i)
                )
            })?;
            anyhow::ensure!(
                shard.data.len() == u.layout.shard_len,
                "the sharded checkpoint holds a slice of {} values for unit {i}, this rank's is {}: it \
                 was written by a different world size, model or trainer.fsdp.min_num_params; resume \
                 with the same ones, or save with state_dict_type=full",
                shard.data.len(),
                u.layout.shard_len
            );
            u.shard = self.home.place(shard.data.clone())?;
            for slot in SLOTS {
                if let Some(t) = state.get(&format!("optimizer.{}.{slot}", shard_key(i))) {
                    self.optimizer.state.insert(
                        format!("{}.{slot}", unit_key(i)),
                        self.home.place(t.data.clone())?,
                    );
                }
            }
        }
        Ok(())
    }

    /// The engine's state without parameters and optimizer slots: buffers and counters.
    fn inner_extras(&self) -> anyhow::Result<StateDict> {
        let params: std::collections::BTreeSet<&str> = self
            .named
            .iter()
            .flatten()
            .map(|(n, _)| n.as_str())
            .collect();
        Ok(self
            .inner
            .state_dict()?
            .into_iter()
            .filter(|(k, _)| {
                !params.contains(k.as_str()) && (!k.starts_with("optimizer.") || engine_owned(k))
            })
            .collect())
    }

    /// ShardedGradScaler's check: does any rank's (unscaled) gradient slice hold an inf or a NaN?
    fn overflowed_anywhere(&self, grads: &[Flat]) -> anyhow::Result<bool> {
        let mut here = false;
        for g in grads {
            here |= g.has_non_finite()?;
        }
        let mut flag = [f64::from(u8::from(here))];
        if self.sharded() {
            self.comms.comm.all_reduce_f64(&mut flag, ReduceOp::Max)?;
        }
        Ok(flag[0] > 0.0)
    }

    /// Every unit's full parameters, as named tensors.
    fn full_parameters(&self) -> anyhow::Result<StateDict> {
        let mut out = StateDict::new();
        for u in &self.units {
            let full = self.comms.gather(&u.layout, &u.shard)?.into_host()?;
            out.extend(u.layout.unflatten(&full, "", ""));
        }
        Ok(out)
    }

    /// Re-cut the slices from the engine's (whole) parameters.
    fn reshard_from_inner(&mut self) -> anyhow::Result<()> {
        let state = self.inner.state_dict()?;
        for u in &mut self.units {
            let full =
                flat_or_empty(&u.layout, &state, "", "")?.context("the model has no parameters")?;
            u.shard = self.home.place(full[u.layout.shard_range()].to_vec())?;
        }
        Ok(())
    }
}

/// Optimizer-prefixed entries that belong to the engine, not to the sharded optimizer: its forward-pass
/// counter (dropout streams) and its loss scaler's state.
fn engine_owned(key: &str) -> bool {
    key == "optimizer.forward_calls" || key.starts_with("optimizer.grad_scaler.")
}

fn counter(value: u64) -> HostTensor {
    HostTensor {
        shape: vec![1],
        data: vec![value as f32],
    }
}

impl Engine for ShardedEngine<'_> {
    fn forward_backward(&mut self, batch: &Batch, grad_scale: f64) -> anyhow::Result<StepStats> {
        if self.by_unit() {
            self.reshard()?;
            let (inner, mut exchange) = self.exchange();
            return inner.forward_backward_by_unit(batch, grad_scale, &mut exchange);
        }
        self.unshard_all()?;
        self.inner.forward_backward(batch, grad_scale)
    }

    fn all_reduce_gradients(
        &mut self,
        _comm: &dyn Collective,
        _sync: &super::ddp::GradSync,
    ) -> anyhow::Result<()> {
        if self.by_unit() {
            // Each unit's gradient was reduced as soon as its backward pass ended.
            return Ok(());
        }
        // FSDP gives a parameter that took no part a zero gradient (no find_unused_parameters error).
        // The engine hands over all its gradients at once, in unit order.
        let (all, _) = self.inner.take_gradients(&self.named.concat())?;
        let mut at = 0;
        for u in &mut self.units {
            let mine = all.slice(at..at + u.layout.numel)?;
            at += u.layout.numel;
            let mine = self.comms.reduce(&u.layout, mine)?;
            u.accumulate(mine)?;
        }
        // Reshard after backward: until the next unshard this rank holds only its slices.
        self.reshard()
    }

    fn optimizer_step(
        &mut self,
        lr: f64,
        momentum: Option<f64>,
        clip_norm: Option<f64>,
    ) -> anyhow::Result<f64> {
        let mut grads = Vec::with_capacity(self.units.len());
        let unscale = self.inner.loss_scale().map(|s| 1.0 / s);
        for u in &mut self.units {
            let grad = match u.grad.take() {
                Some(g) => g,
                None if u.layout.params.is_empty() => self.home.zeros(0)?,
                None => anyhow::bail!(
                    "FSDP: optimizer step without reduced gradients (all_reduce_gradients must come \
                     first)"
                ),
            };
            grads.push(match unscale {
                Some(inv) => grad.affine(inv, 0.0)?,
                None => grad,
            });
        }
        if unscale.is_some() && self.overflowed_anywhere(&grads)? {
            // Every rank saw the same verdict: all skip this step, as GradScaler.step does.
            self.inner.update_loss_scale(true)?;
            if self.sharded() {
                self.materialized = false;
            }
            tracing::debug!(
                "16-mixed: gradients overflowed on some rank, step skipped, loss scale lowered"
            );
            return Ok(f64::INFINITY);
        }
        if unscale.is_some() {
            self.inner.update_loss_scale(false)?;
        }
        // The global norm: each rank's slices contribute their sum of squares (padding is zero).
        let mut sq = [grads
            .iter()
            .map(|g| g.sum_of_squares())
            .sum::<anyhow::Result<f64>>()?];
        if self.sharded() {
            self.comms.comm.all_reduce_f64(&mut sq, ReduceOp::Sum)?;
        }
        let norm = sq[0].sqrt();
        let scale = match clip_norm {
            Some(max) if norm > max => max / (norm + 1e-6),
            _ => 1.0,
        };
        for (i, (u, grad)) in self.units.iter_mut().zip(grads).enumerate() {
            if u.layout.params.is_empty() {
                continue;
            }
            let grad = if scale != 1.0 {
                grad.affine(scale, 0.0)?
            } else {
                grad
            };
            u.shard = self
                .optimizer
                .update(&unit_key(i), &u.shard, &grad, lr, momentum)?;
        }
        self.optimizer.steps += 1;
        if self.sharded() {
            self.materialized = false;
        } else {
            for u in &self.units {
                // Unsharded, a slice is the whole unit (no padding on one rank).
                self.inner.set_parameters(&u.layout.params, &u.shard)?;
            }
        }
        Ok(norm)
    }

    fn evaluate(&mut self, batch: &Batch) -> anyhow::Result<StepStats> {
        if self.by_unit() {
            self.reshard()?;
            let (inner, mut exchange) = self.exchange();
            return inner.evaluate_by_unit(batch, &mut exchange);
        }
        self.unshard_all()?;
        self.inner.evaluate(batch)
    }

    fn evaluate_idle(&mut self) -> anyhow::Result<()> {
        if self.by_unit() {
            // The gathers `evaluate_by_unit` does, one unit at a time, without computing.
            for u in &self.units {
                self.comms.gather(&u.layout, &u.shard)?;
            }
            return Ok(());
        }
        self.unshard_all()
    }

    fn state_dict(&self) -> anyhow::Result<StateDict> {
        let mut out = self.inner_extras()?;
        out.insert("optimizer.step".into(), counter(self.optimizer.steps));
        for (i, u) in self.units.iter().enumerate() {
            if u.layout.params.is_empty() {
                continue;
            }
            let slots = SLOTS.iter().filter_map(|slot| {
                let v = self
                    .optimizer
                    .state
                    .get(&format!("{}.{slot}", unit_key(i)))?;
                Some((*slot, v))
            });
            match self.state_dict_type {
                StateDictType::Full => {
                    let full = self.comms.gather(&u.layout, &u.shard)?.into_host()?;
                    out.extend(u.layout.unflatten(&full, "", ""));
                    for (slot, slice) in slots {
                        let full = self.comms.gather(&u.layout, slice)?.into_host()?;
                        out.extend(u.layout.unflatten(&full, "optimizer.", &format!(".{slot}")));
                    }
                }
                StateDictType::Sharded => {
                    let slice = |v: &Flat| -> anyhow::Result<HostTensor> {
                        Ok(HostTensor {
                            shape: vec![v.len()],
                            data: v.to_vec()?,
                        })
                    };
                    out.insert(shard_key(i), slice(&u.shard)?);
                    for (slot, v) in slots {
                        out.insert(format!("optimizer.{}.{slot}", shard_key(i)), slice(v)?);
                    }
                }
            }
        }
        Ok(out)
    }

    fn load_state_dict(&mut self, state: &StateDict) -> anyhow::Result<()> {
        if state.keys().any(|k| k.starts_with("fsdp.")) {
            self.load_sharded(state)?;
        } else {
            self.load_full(state)?;
        }
        // Buffers and counters go to the engine, with the parameters it expects.
        let params = self.full_parameters()?;
        let mut extras: StateDict = state
            .iter()
            .filter(|(k, _)| !k.starts_with("optimizer.") || engine_owned(k))
            .filter(|(k, _)| !k.starts_with("fsdp."))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        // Released parameters have no shape to load into: give them their full values first.
        for u in &self.units {
            let full: Vec<f32> = u
                .layout
                .params
                .iter()
                .flat_map(|(n, _)| params[n].data.iter().copied())
                .collect();
            self.inner
                .set_parameters(&u.layout.params, &self.home.place(full)?)?;
        }
        extras.extend(params);
        self.inner.load_state_dict(&extras)?;
        self.materialized = true;
        self.reshard()?;
        if let Some(step) = state.get("optimizer.step") {
            self.optimizer.steps = step.data.first().copied().unwrap_or(0.0) as u64;
        }
        for u in &mut self.units {
            u.grad = None;
        }
        Ok(())
    }

    fn load_pretrained(&mut self, state: &StateDict) -> anyhow::Result<Vec<String>> {
        self.unshard_all()?;
        let kept = self.inner.load_pretrained(state)?;
        self.reshard_from_inner()?;
        self.reshard()?;
        Ok(kept)
    }

    fn num_parameters(&self) -> usize {
        self.numel()
    }

    fn loss_scale(&self) -> Option<f64> {
        self.inner.loss_scale()
    }

    fn parameter_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let mut all: Vec<_> = self.named.iter().flatten().cloned().collect();
        all.sort();
        all
    }

    fn set_parameters(
        &mut self,
        _layout: &[(String, Vec<usize>)],
        _flat: &Flat,
    ) -> anyhow::Result<()> {
        anyhow::bail!("FSDP cannot be nested inside another sharded strategy")
    }

    fn release_parameters(&mut self) -> anyhow::Result<()> {
        anyhow::bail!("FSDP cannot be nested inside another sharded strategy")
    }

    fn take_gradients(
        &mut self,
        _layout: &[(String, Vec<usize>)],
    ) -> anyhow::Result<(Flat, Vec<String>)> {
        anyhow::bail!("FSDP cannot be nested inside another sharded strategy")
    }

    /// What this rank keeps between steps: its parameter slices, its gradient slices (held from the
    /// reduction to the step) and its optimizer slots. The full parameters exist only while the model
    /// computes: `unsharded_peak` says how many at most (one unit's under `FULL_SHARD`).
    fn state_bytes(&self) -> StateBytes {
        let bytes = |v: &Flat| (v.len() * 4) as u64;
        let parameters = self.units.iter().map(|u| bytes(&u.shard)).sum();
        StateBytes {
            parameters,
            gradients: parameters,
            optimizer_state: self.optimizer.state.values().map(bytes).sum(),
            unsharded_peak: self.unsharded_peak,
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

    /// The slice's optimizer arithmetic is the rules' own: a momentum SGD step on the flat slice equals
    /// the hand-computed PyTorch update element by element, on the host and on a tch device alike.
    #[rstest]
    #[case::host(FlatHome::Host)]
    #[cfg_attr(feature = "torch", case::tch(FlatHome::Tch(tch::Device::Cpu)))]
    fn flat_slices_follow_the_optimizer_rules(#[case] home: FlatHome) {
        let node = crate::config::yaml::parse("{name: sgd, lr: 0.1, momentum: 0.9}", "<test>")
            .unwrap()
            .unwrap();
        let mut o = Optimizer::new(serde_json::from_value(node.to_json()).unwrap());
        let p = home.place(vec![1.0, -2.0]).unwrap();
        let g = home.place(vec![0.5, 0.25]).unwrap();
        let p1 = o.update(&unit_key(0), &p, &g, 0.1, None).unwrap();
        assert_eq!(p1.home(), home);
        assert_eq!(p1.to_vec().unwrap(), vec![1.0 - 0.05, -2.0 - 0.025]);
        assert!(o.state.contains_key("flat0.momentum_buffer"));
    }

    /// Parameters in one ViT-tiny block (dim 192, MLP 768: qkv, projection, two MLP layers, two norms).
    const BLOCK: usize =
        192 * 576 + 576 + 192 * 192 + 192 + 192 * 768 + 768 + 768 * 192 + 192 + 4 * 192;

    fn experiment(model: &str, sharding: &str, min_num_params: Option<usize>) -> Experiment {
        let min = min_num_params.map_or("null".to_string(), |n| n.to_string());
        let trainer = format!(
            "{{strategy: fsdp, devices: 2, \
             fsdp: {{sharding_strategy: {sharding}, state_dict_type: full, min_num_params: {min}}}}}"
        );
        let optimizer = "{name: sgd, lr: 0.1, momentum: 0.9, weight_decay: 0.01}";
        crate::testing::experiment(model, optimizer, &trainer, 4)
    }

    /// Rows `rows` of a fixed batch of 8 random images.
    fn batch(step: u64, rows: std::ops::Range<usize>) -> Batch {
        let mut rng = crate::rng::Rng::new(step);
        let images: Vec<f32> = (0..8 * 3 * 8 * 8).map(|_| rng.normal() as f32).collect();
        let labels: Vec<u32> = (0..8u32).map(|i| (i * 7 + step as u32) % 4).collect();
        let px = 3 * 8 * 8;
        Batch {
            images: images[rows.start * px..rows.end * px].to_vec(),
            labels: labels[rows].to_vec(),
            channels: 3,
            height: 8,
            width: 8,
        }
    }

    /// How the two ranks of a test talk: Candle's host slices over the in-process collective, tch's
    /// device slices over a real 2-rank Gloo group (c10d, tensors passed as they are).
    #[derive(Clone, Copy, Debug)]
    enum Ranks {
        CandleInProcess,
        #[cfg(feature = "torch")]
        TchGloo,
    }

    impl Ranks {
        fn run<T: Send>(self, job: impl Fn(usize, &dyn Collective) -> T + Sync) -> Vec<T> {
            match self {
                Ranks::CandleInProcess => {
                    let comms = crate::comm::local::group(2);
                    let job = &job;
                    std::thread::scope(|s| {
                        let handles: Vec<_> = comms
                            .iter()
                            .enumerate()
                            .map(|(rank, comm)| s.spawn(move || job(rank, comm)))
                            .collect();
                        handles.into_iter().map(|h| h.join().unwrap()).collect()
                    })
                }
                #[cfg(feature = "torch")]
                Ranks::TchGloo => crate::testing::on_two_ranks(|rank, group| job(rank, group)),
            }
        }

        fn experiment(self, sharding: &str, min_num_params: Option<usize>) -> Experiment {
            let model = "{name: vit, variant: tiny, patch_size: 4, num_classes: 4}";
            let mut exp = experiment(model, sharding, min_num_params);
            exp.backend = match self {
                Ranks::CandleInProcess => crate::schema::Backend::Candle,
                #[cfg(feature = "torch")]
                Ranks::TchGloo => crate::schema::Backend::Tch,
            };
            exp
        }
    }

    /// 2 ranks × 2 accumulated micro-batches × 2 rows, sharded, take the steps one engine takes on all 8
    /// rows: same gradient norms, and same weights and momentum after 3 steps of momentum SGD with weight
    /// decay and clipping, for every sharding strategy, on Candle (host slices) and tch (slices on the
    /// engine's device, gathered and reduce-scattered by c10d in place). `FULL_SHARD` holds at most one
    /// unit's parameters whole (a ViT block: a small part of the model; two blocks when the size policy
    /// groups them); the other strategies the whole model.
    #[rstest]
    #[case::full_shard("FULL_SHARD", None)]
    #[case::full_shard_two_blocks_a_unit("FULL_SHARD", Some(BLOCK + 1))]
    #[case::shard_grad_op("SHARD_GRAD_OP", None)]
    #[case::shard_grad_op_grouped("SHARD_GRAD_OP", Some(BLOCK + 1))]
    #[case::no_shard("NO_SHARD", None)]
    fn two_ranks_take_the_single_engine_steps(
        #[case] sharding: &str,
        #[case] min_num_params: Option<usize>,
    ) {
        let all = [
            Ranks::CandleInProcess,
            #[cfg(feature = "torch")]
            Ranks::TchGloo,
        ];
        for ranks in all {
            two_ranks_against_one(ranks, sharding, min_num_params);
        }
    }

    fn two_ranks_against_one(ranks: Ranks, sharding: &str, min_num_params: Option<usize>) {
        let exp = ranks.experiment(sharding, min_num_params);
        let sync = super::super::ddp::GradSync::of(&exp);
        let mut single = crate::backend::build(&exp).unwrap();
        // Clipping hides a wrong scale of the reduced gradients from the weights: the steps' norms
        // (before clipping) show it.
        let mut norms = Vec::new();
        for step in 0..3 {
            single.forward_backward(&batch(step, 0..8), 1.0).unwrap();
            norms.push(single.optimizer_step(0.1, None, Some(1.0)).unwrap());
        }
        let want = single.state_dict().unwrap();
        let home = single.flat_home();
        let results: Vec<(StateDict, StateBytes)> = ranks.run(|rank, comm| {
            let inner = crate::backend::build(&exp).unwrap();
            let mut e = ShardedEngine::new(&exp, inner, comm).unwrap();
            for step in 0..3 {
                // Two accumulated micro-batches of 2 rows: this rank's 4.
                for half in 0..2 {
                    let start = 4 * rank + 2 * half;
                    e.forward_backward(&batch(step, start..start + 2), 0.5)
                        .unwrap();
                }
                e.all_reduce_gradients(comm, &sync).unwrap();
                let norm = e.optimizer_step(0.1, None, Some(1.0)).unwrap();
                let want = norms[step as usize];
                assert!(
                    (norm - want).abs() < 1e-5 * want,
                    "{ranks:?} rank {rank}, step {step}: gradient norm {norm}, one engine's {want}"
                );
            }
            e.evaluate(&batch(9, 0..8)).unwrap();
            // The slices and the optimizer's slots stayed where the engine computes.
            assert!(e.units.iter().all(|u| u.shard.home() == home));
            assert!(e.optimizer.state.values().all(|v| v.home() == home));
            (e.state_dict().unwrap(), e.state_bytes())
        });
        let total = 4 * single.num_parameters() as u64;
        for (rank, (state, bytes)) in results.iter().enumerate() {
            let mut checked = 0;
            let counters = ["optimizer.step", "optimizer.forward_calls"];
            for (name, t) in want.iter().filter(|(k, _)| !counters.contains(&k.as_str())) {
                let got = &state[name];
                let worst = got
                    .data
                    .iter()
                    .zip(&t.data)
                    .map(|(a, b)| (a - b).abs() / b.abs().max(1e-2))
                    .fold(0.0f32, f32::max);
                assert!(
                    worst < 1e-5,
                    "{ranks:?} rank {rank}, {name}: differs by {worst:e}"
                );
                checked += usize::from(name.ends_with("momentum_buffer"));
            }
            assert!(checked > 10, "momentum buffers compared: {checked}");
            let block = 4 * BLOCK as u64;
            match (sharding, min_num_params) {
                ("FULL_SHARD", None) => assert!(
                    bytes.unsharded_peak >= block && bytes.unsharded_peak < block + 4096,
                    "rank {rank}: {} bytes whole at once, one block is {block}",
                    bytes.unsharded_peak
                ),
                ("FULL_SHARD", Some(_)) => assert!(
                    bytes.unsharded_peak >= 2 * block && bytes.unsharded_peak < 3 * block,
                    "rank {rank}: {} bytes whole at once, two blocks are {}",
                    bytes.unsharded_peak,
                    2 * block
                ),
                _ => assert_eq!(bytes.unsharded_peak, total, "rank {rank}"),
            }
        }
    }
}
