//! Fully sharded data parallel (PyTorch FSDP's contract, ZeRO's memory plan). The model is cut into
//! units, as FSDP's `auto_wrap_policy` wraps blocks (`model::stages`: the stem, each residual or
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
//! The slices live where the engine computes (`tensor::Flat`, the engine's `Sharding::flat_home`): host
//! vectors for Candle, f32 tensors on the engine's device for tch, where the all-gathers and
//! reduce-scatters run without host copies (NCCL for CUDA tensors, Gloo for host ones) and the sharded
//! optimizer updates in place of the device's memory, as PyTorch FSDP's flat parameters do.
//!
//! `layout` holds the flat layouts and checkpoint keys, `units` the units' slices, collectives and wrap
//! policy; this file the strategy.

mod layout;
mod units;

use layout::{counter, engine_owned, flat_or_empty, shard_key, slots, unit_key};
pub use layout::{shard_file_name, FlatLayout};
use units::{Comms, Exchange, Unit};

use super::{Ranks, Strategy};
use crate::backend::{self, Engine, Placement, Sharding, StateBytes, StepStats};
use crate::comm::collective::{broadcast_state, Collective, ReduceOp};
use crate::comm::Distributed;
use crate::data::loader::{Batch, StageBatch};
use crate::model::stages::{group_stages, unit_layout, StageLayouts};
use crate::optim::GradClip;
use crate::optim::{OptTensor, Optimizer};
use crate::schema::{Experiment, ShardingStrategy, StateDictType};
use crate::storage::checkpoint::TrainingState;
use crate::tensor::{Flat, FlatHome, HostTensor, StateDict};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// FSDP over the ranks of a process group: this rank's engine computes, the strategy owns the slices.
pub struct Fsdp {
    engine: Box<dyn Engine>,
    ranks: Ranks,
    comm: Arc<dyn Collective>,
    /// Keeps the process group (and the rendezvous) alive, when this strategy formed from one.
    _group: Option<Distributed>,
    /// Whether the units are sharded (not `NO_SHARD`).
    sharded: bool,
    strategy: ShardingStrategy,
    state_dict_type: StateDictType,
    units: Vec<Unit>,
    /// The model's stages' named layouts, as the engine computes over them.
    named: StageLayouts,
    /// The stages each unit spans (`trainer.fsdp.min_num_params`; one each by default).
    groups: Vec<std::ops::Range<usize>>,
    optimizer: Optimizer<Flat>,
    /// Where the slices live: where the engine computes.
    home: FlatHome,
    /// The engine holds every unit's current full parameters.
    materialized: bool,
    /// The most parameter bytes the engine has held whole at once: one unit under `FULL_SHARD`, the
    /// model otherwise.
    unsharded_peak: u64,
}

/// The engine's sharding capability (both backends have it; the run plan refuses the others).
fn sharding(engine: &mut dyn Engine) -> anyhow::Result<&mut dyn Sharding> {
    engine
        .sharding()
        .context("trainer.strategy=fsdp: this backend's engine cannot be sharded")
}

impl Fsdp {
    /// This rank's engine on its device, started from rank 0's model, then sharded.
    pub fn build(exp: &Experiment, group: Distributed) -> anyhow::Result<Self> {
        let placement = Placement {
            device_index: group.local_rank,
            owns_device: true,
            sync_batchnorm: exp.trainer.sync_batchnorm.then(|| group.comm.clone()),
        };
        let mut engine = backend::build(exp, &placement)?;
        // Every rank shards rank 0's initial model; later loads (pretrained, resume) read the same file
        // on every rank, or each rank its own shard.
        let state = broadcast_state(group.comm.as_ref(), engine.state_dict()?)
            .context("broadcasting rank 0's model to every rank")?;
        engine.load_state_dict(&state)?;
        let mut fsdp = Fsdp::new(exp, engine, Ranks::of(&group))?;
        fsdp._group = Some(group);
        Ok(fsdp)
    }

    /// Shard `engine`'s parameters unit by unit over `ranks` (every rank must build the same model).
    pub fn new(
        exp: &Experiment,
        mut engine: Box<dyn Engine>,
        ranks: Ranks,
    ) -> anyhow::Result<Self> {
        let cfg = exp.trainer.fsdp.clone().context(
            "trainer.strategy=fsdp needs a trainer.fsdp section (sharding_strategy, state_dict_type); \
             use trainer=fsdp",
        )?;
        let comm = ranks
            .shared_comm()
            .context("trainer.strategy=fsdp runs as the ranks of a process group")?;
        let sharded = cfg.sharding_strategy != ShardingStrategy::NoShard;
        let (rank, world) = match sharded {
            false => (0, 1),
            true => (comm.rank(), comm.world_size()),
        };
        anyhow::ensure!(
            backend::num_parameters(engine.as_ref()) > 0,
            "the model has no parameters"
        );
        let state = engine.state_dict()?;
        let (named, home) = {
            let sh = sharding(engine.as_mut())?;
            (sh.stage_layouts()?, sh.flat_home())
        };
        let groups = group_stages(&named, cfg.min_num_params);
        let mut slices = Vec::with_capacity(groups.len());
        for stages in &groups {
            let layout = FlatLayout::new(unit_layout(&named, stages.clone()), rank, world);
            let full = flat_or_empty(&layout, &state, "", "")?
                .context("the model's state lacks its parameters")?;
            slices.push(Unit {
                shard: home.place(full[layout.shard_range()].to_vec())?,
                layout,
                grad: None,
            });
        }
        if sharded {
            sharding(engine.as_mut())?.release_parameters()?;
        }
        let numel: usize = slices.iter().map(|u| u.layout.numel).sum();
        Ok(Fsdp {
            materialized: !sharded,
            unsharded_peak: if sharded { 0 } else { 4 * numel as u64 },
            engine,
            ranks,
            comm,
            _group: None,
            sharded,
            strategy: cfg.sharding_strategy,
            state_dict_type: cfg.state_dict_type,
            units: slices,
            named,
            groups,
            optimizer: Optimizer::new(exp.optimizer.clone()),
            home,
        })
    }

    fn comms(&self) -> Comms<'_> {
        Comms {
            comm: self.comm.as_ref(),
            sharded: self.sharded,
        }
    }

    /// Does the engine compute unit by unit (parameters gathered per unit and freed after use)?
    fn by_unit(&self) -> bool {
        self.strategy == ShardingStrategy::FullShard
    }

    fn numel(&self) -> usize {
        self.units.iter().map(|u| u.layout.numel).sum()
    }

    /// The engine's sharding capability beside what it exchanges with while computing unit by unit.
    fn exchange(&mut self) -> anyhow::Result<(&mut dyn Sharding, Exchange<'_>)> {
        let comms = Comms {
            comm: self.comm.as_ref(),
            sharded: self.sharded,
        };
        let exchange = Exchange {
            units: &mut self.units,
            named: &self.named,
            groups: &self.groups,
            comms,
            peak: &mut self.unsharded_peak,
        };
        Ok((sharding(self.engine.as_mut())?, exchange))
    }

    /// Put every unit's full parameters into the engine before it computes (FSDP's unshard of the whole
    /// model: `SHARD_GRAD_OP` keeps them from the forward through the backward pass).
    fn unshard_all(&mut self) -> anyhow::Result<()> {
        if self.materialized {
            return Ok(());
        }
        for u in &self.units {
            let full = self.comms().gather(&u.layout, &u.shard)?;
            sharding(self.engine.as_mut())?
                .set_parameters(&u.layout.params, &full.truncated(u.layout.numel)?)?;
        }
        self.materialized = true;
        self.unsharded_peak = self.unsharded_peak.max(4 * self.numel() as u64);
        Ok(())
    }

    /// Free the engine's full parameters (between steps a sharded rank holds only its slices).
    fn reshard(&mut self) -> anyhow::Result<()> {
        if self.sharded && self.materialized {
            sharding(self.engine.as_mut())?.release_parameters()?;
            self.materialized = false;
        }
        Ok(())
    }

    /// Take this rank's slices of a full (named) state: parameters and optimizer slots.
    fn load_full(&mut self, state: &StateDict) -> anyhow::Result<()> {
        self.optimizer.state.clear();
        let slots = slots(&self.optimizer.config);
        for (i, u) in self.units.iter_mut().enumerate() {
            let range = u.layout.shard_range();
            let params = flat_or_empty(&u.layout, state, "", "")?
                .context("the checkpoint has none of the model's parameters")?;
            u.shard = self.home.place(params[range.clone()].to_vec())?;
            if u.layout.params.is_empty() {
                continue;
            }
            for slot in &slots {
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
        let slots = slots(&self.optimizer.config);
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
            for slot in &slots {
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
    fn engine_extras(&self) -> anyhow::Result<StateDict> {
        let params: std::collections::BTreeSet<&str> = self
            .named
            .iter()
            .flatten()
            .map(|(n, _)| n.as_str())
            .collect();
        Ok(self
            .engine
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
        if self.sharded {
            self.comm.all_reduce_f64(&mut flag, ReduceOp::Max)?;
        }
        Ok(flag[0] > 0.0)
    }

    /// Every unit's full parameters, as named tensors.
    fn full_parameters(&self) -> anyhow::Result<StateDict> {
        let mut out = StateDict::new();
        for u in &self.units {
            let full = self.comms().gather(&u.layout, &u.shard)?.into_host()?;
            out.extend(u.layout.unflatten(&full, "", ""));
        }
        Ok(out)
    }

    /// Re-cut the slices from the engine's (whole) parameters.
    fn reshard_from_inner(&mut self) -> anyhow::Result<()> {
        let state = self.engine.state_dict()?;
        for u in &mut self.units {
            let full =
                flat_or_empty(&u.layout, &state, "", "")?.context("the model has no parameters")?;
            u.shard = self.home.place(full[u.layout.shard_range()].to_vec())?;
        }
        Ok(())
    }

    /// `SHARD_GRAD_OP` and `NO_SHARD`: the engine's whole gradients, reduced unit by unit (FSDP gives a
    /// parameter that took no part a zero gradient: no find_unused_parameters error), then the full
    /// parameters freed.
    fn reduce_gradients(&mut self) -> anyhow::Result<()> {
        let mut by_name: std::collections::HashMap<String, Option<Flat>> = self
            .engine
            .take_gradients()?
            .entries
            .into_iter()
            .map(|g| (g.name, g.value))
            .collect();
        let comms = Comms {
            comm: self.comm.as_ref(),
            sharded: self.sharded,
        };
        for u in &mut self.units {
            let mut parts = Vec::with_capacity(u.layout.params.len());
            for (name, shape) in &u.layout.params {
                parts.push(match by_name.remove(name).flatten() {
                    Some(g) => g.into_f32()?,
                    None => self.home.zeros(shape.iter().product())?,
                });
            }
            let mine = comms.reduce(&u.layout, Flat::concat(parts, self.home)?)?;
            u.accumulate(mine)?;
        }
        // Reshard after backward: until the next unshard this rank holds only its slices.
        self.reshard()
    }
}

impl Strategy for Fsdp {
    fn ranks(&self) -> &Ranks {
        &self.ranks
    }
    /// This rank's engine; what it holds between steps is not the model (its shards are), so the state
    /// methods are FSDP's own.
    fn engine(&self) -> &dyn Engine {
        self.engine.as_ref()
    }
    fn engine_mut(&mut self) -> &mut dyn Engine {
        self.engine.as_mut()
    }
    fn batch_stager(&self) -> Option<Arc<dyn StageBatch>> {
        self.engine.batch_stager()
    }

    fn forward_backward(
        &mut self,
        batch: &Batch,
        grad_scale: f64,
        _ends_window: bool,
    ) -> anyhow::Result<StepStats> {
        if self.by_unit() {
            self.reshard()?;
            let (engine, mut exchange) = self.exchange()?;
            return engine.forward_backward_by_unit(batch, grad_scale, &mut exchange);
        }
        self.unshard_all()?;
        self.engine.forward_backward(batch, grad_scale)
    }

    /// Reduce what the backward pass left (unit by unit, each gradient was reduced as soon as its
    /// backward pass ended), then step this rank's slices: unscaled and checked for overflow on every
    /// rank under `16-mixed`, clipped by the global norm.
    fn optimizer_step(
        &mut self,
        lr: f64,
        momentum: Option<f64>,
        clip: Option<GradClip>,
    ) -> anyhow::Result<f64> {
        if !self.by_unit() {
            self.reduce_gradients()?;
        }
        let mut grads = Vec::with_capacity(self.units.len());
        let unscale = match self.engine.loss_scaler() {
            Some(scaler) => Some(1.0 / scaler.scale()?),
            None => None,
        };
        for u in &mut self.units {
            let grad = match u.grad.take() {
                Some(g) => g,
                None if u.layout.params.is_empty() => self.home.zeros(0)?,
                None => anyhow::bail!("FSDP: optimizer step without reduced gradients"),
            };
            grads.push(match unscale {
                Some(inv) => grad.affine(inv, 0.0)?,
                None => grad,
            });
        }
        if unscale.is_some() {
            let found_inf = self.overflowed_anywhere(&grads)?;
            if let Some(scaler) = self.engine.loss_scaler() {
                scaler.update(found_inf)?;
            }
            if found_inf {
                // Every rank saw the same verdict: all skip this step, as GradScaler.step does.
                if self.sharded {
                    self.materialized = false;
                }
                tracing::debug!(
                    "16-mixed: gradients overflowed on some rank, step skipped, loss scale lowered"
                );
                return Ok(f64::INFINITY);
            }
        }
        // The global norm: each rank's slices contribute their sum of squares (padding is zero).
        let mut sq = [grads
            .iter()
            .map(|g| g.sum_of_squares())
            .sum::<anyhow::Result<f64>>()?];
        if self.sharded {
            self.comm.all_reduce_f64(&mut sq, ReduceOp::Sum)?;
        }
        let norm = sq[0].sqrt();
        let scale = match GradClip::max_norm(clip) {
            Some(max) if norm > max => max / (norm + 1e-6),
            _ => 1.0,
        };
        for (i, (u, grad)) in self.units.iter_mut().zip(grads).enumerate() {
            if u.layout.params.is_empty() {
                continue;
            }
            let grad = GradClip::clamp(clip, grad)?;
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
        if self.sharded {
            self.materialized = false;
        } else {
            let sh = sharding(self.engine.as_mut())?;
            for u in &self.units {
                // Unsharded, a slice is the whole unit (no padding on one rank).
                sh.set_parameters(&u.layout.params, &u.shard)?;
            }
        }
        Ok(norm)
    }

    fn evaluate(&mut self, batch: &Batch) -> anyhow::Result<StepStats> {
        if self.by_unit() {
            self.reshard()?;
            let (engine, mut exchange) = self.exchange()?;
            return engine.evaluate_by_unit(batch, &mut exchange);
        }
        self.unshard_all()?;
        self.engine.evaluate(batch)
    }

    fn evaluate_idle(&mut self) -> anyhow::Result<()> {
        if self.by_unit() {
            // The gathers `evaluate_by_unit` does, one unit at a time, without computing.
            for u in &self.units {
                self.comms().gather(&u.layout, &u.shard)?;
            }
            return Ok(());
        }
        self.unshard_all()
    }

    fn state_dict(&self) -> anyhow::Result<StateDict> {
        let mut out = self.engine_extras()?;
        out.insert("optimizer.step".into(), counter(self.optimizer.steps));
        let slot_names = slots(&self.optimizer.config);
        for (i, u) in self.units.iter().enumerate() {
            if u.layout.params.is_empty() {
                continue;
            }
            let slots = slot_names.iter().filter_map(|slot| {
                let v = self
                    .optimizer
                    .state
                    .get(&format!("{}.{slot}", unit_key(i)))?;
                Some((*slot, v))
            });
            match self.state_dict_type {
                StateDictType::Full => {
                    let full = self.comms().gather(&u.layout, &u.shard)?.into_host()?;
                    out.extend(u.layout.unflatten(&full, "", ""));
                    for (slot, slice) in slots {
                        let full = self.comms().gather(&u.layout, slice)?.into_host()?;
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
        let sh = sharding(self.engine.as_mut())?;
        for u in &self.units {
            let full: Vec<f32> = u
                .layout
                .params
                .iter()
                .flat_map(|(n, _)| params[n].data.iter().copied())
                .collect();
            sh.set_parameters(&u.layout.params, &self.home.place(full)?)?;
        }
        extras.extend(params);
        self.engine.load_state_dict(&extras)?;
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

    fn load_pretrained(
        &mut self,
        published: &StateDict,
        head: &[String],
    ) -> anyhow::Result<Vec<String>> {
        self.unshard_all()?;
        let kept = backend::load_pretrained(self.engine.as_mut(), published, head)?;
        self.reshard_from_inner()?;
        self.reshard()?;
        Ok(kept)
    }

    /// Sharded checkpoints: rank r > 0 keeps its part beside rank 0's file.
    fn checkpoint_file(&self, name: &str) -> String {
        match (self.state_dict_type, self.ranks.rank) {
            (StateDictType::Sharded, rank) if rank > 0 => shard_file_name(name, rank),
            _ => name.to_string(),
        }
    }

    /// `full`: every rank takes part in consolidating the model (a gather), rank 0 writes it; `sharded`:
    /// every rank writes its own part.
    fn save_checkpoint(
        &mut self,
        path: &Path,
        training: &TrainingState,
        config_yaml: &str,
    ) -> anyhow::Result<Option<PathBuf>> {
        let sharded_files = self.state_dict_type == StateDictType::Sharded;
        let lead = self.ranks.is_global_zero();
        let consolidating = self.sharded && !sharded_files;
        if !(lead || consolidating || sharded_files) {
            return Ok(None);
        }
        let state = self.state_dict()?;
        if !(lead || sharded_files) {
            return Ok(None);
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mine = path.with_file_name(self.checkpoint_file(&name));
        crate::storage::checkpoint::save(&mine, &state, training, config_yaml)?;
        Ok(Some(mine))
    }

    fn num_parameters(&self) -> usize {
        self.numel()
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
}

#[cfg(test)]
mod tests;
