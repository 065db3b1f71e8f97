//! The tch (libtorch) engine, `backend=tch` (cargo feature `torch`): PyTorch's own kernels behind the same
//! `Engine` trait as Candle. Everything that is not a kernel is shared with the Candle engine: parameter
//! names, shapes and host-side seeded initialisation come from the model zoo's specs, the optimizer rules
//! from `backend::optim`, pretrained-weight matching from `backend::plan_pretrained`, dropout masks from
//! the same seeded host generator — so the two backends start from the same weights and take the same steps.

pub mod amp;
pub mod cuda_runtime;
mod ddp_overlap;
mod fused_optim;
mod models;
mod staged;

use super::{topk_hits, Engine, StepStats};
use crate::data::loader::Batch;
use crate::model::init;
use crate::optim::{clip_factor, Optimizer};
use crate::rng::Rng;
use crate::schema::{Accelerator, Experiment};
use crate::tensor::{Flat, FlatHome};
use crate::tensor::{HostTensor, StateDict};
use anyhow::Context;
use std::collections::BTreeMap;
use tch::{Device, Kind, Tensor};

pub struct TchEngine {
    device: Device,
    arch: models::Arch,
    params: BTreeMap<String, Tensor>,
    /// Parameter names in the order the model defines them (DDP's first buckets follow it).
    param_order: Vec<String>,
    buffers: BTreeMap<String, Tensor>,
    optimizer: Optimizer<Tensor>,
    classes: usize,
    label_smoothing: f64,
    seed: u64,
    forward_calls: u64,
    last_logits: Option<Tensor>,
    /// `trainer.precision`: full, autocast (mixed) or lower-precision storage (true).
    mode: amp::Mode,
    /// `16-mixed`: dynamic loss scaling.
    scaler: Option<amp::GradScaler>,
    /// DDP: gradients averaged during the backward pass.
    overlap: ddp_overlap::Overlap,
}

/// Checkpoint keys of the loss scaler's state (under the optimizer's prefix, like other training state).
const SCALER_SCALE: &str = "grad_scaler.scale";
const SCALER_GROWTH: &str = "grad_scaler.growth_tracker";

fn to_tch(t: &HostTensor, device: Device) -> anyhow::Result<Tensor> {
    let shape: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
    Ok(Tensor::f_from_slice(&t.data)?
        .f_reshape(&shape)?
        .f_to(device)?)
}

fn to_host(t: &Tensor) -> anyhow::Result<HostTensor> {
    let shape: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
    let flat = t
        .f_detach()?
        .f_to_kind(Kind::Float)?
        .f_to(Device::Cpu)?
        .f_contiguous()?
        .f_flatten(0, -1)?;
    let data = Vec::<f32>::try_from(&flat).context("copying a tensor to the host")?;
    Ok(HostTensor { shape, data })
}

/// The gradients `grad_of` gives for `layout`'s parameters, flat in layout order on `device` as f32
/// (zeros for an undefined gradient).
fn flat_gradients(
    layout: &[(String, Vec<usize>)],
    device: Device,
    mut grad_of: impl FnMut(&str) -> anyhow::Result<Tensor>,
) -> anyhow::Result<Flat> {
    let mut parts = Vec::with_capacity(layout.len());
    for (name, shape) in layout {
        let g = grad_of(name)?;
        parts.push(if g.defined() {
            g.f_detach()?
                .f_to_kind(Kind::Float)?
                .f_to(device)?
                .f_reshape([-1])?
        } else {
            Tensor::f_zeros(
                [shape.iter().product::<usize>() as i64],
                (Kind::Float, device),
            )?
        });
    }
    if parts.is_empty() {
        return Ok(Flat::Tch(Tensor::f_zeros([0], (Kind::Float, device))?));
    }
    Ok(Flat::Tch(Tensor::f_cat(&parts, 0)?))
}

fn dims(t: &Tensor) -> Vec<usize> {
    t.size().iter().map(|&d| d as usize).collect()
}

extern "C" {
    fn trainyard_set_deterministic(on: std::ffi::c_int) -> std::ffi::c_int;
    fn trainyard_deterministic() -> std::ffi::c_int;
}

/// Is `torch.use_deterministic_algorithms` on in this process?
pub fn deterministic_algorithms() -> bool {
    // SAFETY: plain C ABI, no arguments.
    unsafe { trainyard_deterministic() != 0 }
}

/// Lightning's `trainer.deterministic` on libtorch: deterministic algorithms only (an op that has none
/// fails with PyTorch's message naming it), cuDNN deterministic, and cuBLAS's fixed workspace
/// (`CUBLAS_WORKSPACE_CONFIG=:4096:8`, set before CUDA starts unless already set), as Lightning sets them.
/// Process-wide: every engine of a run applies the same value.
fn apply_determinism(t: &crate::schema::TrainerConfig) -> anyhow::Result<()> {
    anyhow::ensure!(
        !(t.deterministic && t.cudnn_benchmark),
        "trainer.deterministic=true with trainer.cudnn_benchmark=true: benchmark mode picks cuDNN's \
         algorithms by timing them, run by run; set trainer.cudnn_benchmark=false"
    );
    if t.deterministic && std::env::var_os("CUBLAS_WORKSPACE_CONFIG").is_none() {
        std::env::set_var("CUBLAS_WORKSPACE_CONFIG", ":4096:8");
    }
    // SAFETY: plain C ABI; the shim catches every C++ exception.
    let status = unsafe { trainyard_set_deterministic(std::ffi::c_int::from(t.deterministic)) };
    anyhow::ensure!(
        status == 0,
        "libtorch refused trainer.deterministic={}",
        t.deterministic
    );
    Ok(())
}

/// CUDA device `index` checked against what libtorch sees (a clear error instead of a CUDA one later).
fn cuda(index: usize) -> anyhow::Result<Device> {
    let count = cuda_runtime::device_count();
    anyhow::ensure!(
        index < count,
        "cuda:{index} does not exist: libtorch sees {count} CUDA device(s); set trainer.devices to at most \
         {count} (or trainer.accelerator=cpu)"
    );
    Ok(Device::Cuda(index))
}

impl TchEngine {
    /// On this process's device (a distributed worker's local rank on CUDA).
    pub fn new(exp: &Experiment) -> anyhow::Result<Self> {
        Self::build(exp, crate::comm::local_device_index(), true)
    }

    /// On CUDA device `index` when the run is on CUDA (DataParallel's replica r is on cuda:r), else the CPU.
    pub fn on_device(exp: &Experiment, index: usize) -> anyhow::Result<Self> {
        Self::build(exp, index, false)
    }

    /// `make_current`: this process works on that one device, which becomes the current CUDA device (as
    /// `torch.cuda.set_device(local_rank)`), so nothing lands on cuda:0 by default (cuBLAS handles, NCCL
    /// streams). DataParallel's replicas share the process and keep the default.
    fn build(exp: &Experiment, index: usize, make_current: bool) -> anyhow::Result<Self> {
        apply_determinism(&exp.trainer)?;
        let device = match exp.trainer.accelerator {
            Accelerator::Cpu => Device::Cpu,
            Accelerator::Gpu | Accelerator::Cuda => {
                anyhow::ensure!(
                    cuda_runtime::is_available(),
                    "trainer.accelerator={}: {}; or set trainer.accelerator=cpu",
                    format!("{:?}", exp.trainer.accelerator).to_lowercase(),
                    cuda_runtime::why_unavailable()
                );
                cuda(index)?
            }
            Accelerator::Auto if cuda_runtime::is_available() => cuda(index)?,
            Accelerator::Auto => Device::Cpu,
        };
        if make_current && device.is_cuda() {
            cuda_runtime::set_current_device(index)?;
        }
        if exp.trainer.cudnn_benchmark {
            if device.is_cuda() {
                tch::Cuda::cudnn_set_benchmark(true);
            } else {
                tracing::warn!("trainer.cudnn_benchmark=true has no effect on the CPU (no cuDNN)");
            }
        }
        let mode = amp::Mode::of(exp.trainer.precision);
        // Lightning's bf16-true/16-true cast the module: floating parameters and buffers, not counters.
        let store = |t: Tensor, name: &str| -> anyhow::Result<Tensor> {
            Ok(if name.ends_with("num_batches_tracked") {
                t
            } else {
                t.f_to_kind(mode.storage())?
            })
        };
        let arch = models::Arch(crate::model::Architecture::new(
            &exp.model,
            exp.data.channels,
            exp.data.image_size,
        )?);
        let zoo = &arch.0;
        let mut params = BTreeMap::new();
        let param_order = zoo.specs().iter().map(|s| s.name.clone()).collect();
        for spec in zoo.specs() {
            let host = spec.initial_value(exp.seed);
            params.insert(
                spec.name.clone(),
                store(to_tch(&host, device)?, &spec.name)?.set_requires_grad(true),
            );
        }
        let mut buffers = BTreeMap::new();
        for (name, shape, value) in zoo.buffers() {
            let t = store(to_tch(&init::constant(&shape, value), device)?, &name)?;
            buffers.insert(name, t);
        }
        Ok(TchEngine {
            device,
            arch,
            params,
            param_order,
            buffers,
            optimizer: Optimizer::new(exp.optimizer.clone()),
            classes: exp.model.num_classes,
            label_smoothing: exp.model.label_smoothing,
            seed: exp.seed,
            forward_calls: 0,
            last_logits: None,
            mode,
            scaler: match exp.trainer.precision {
                crate::schema::Precision::Mixed16 => {
                    Some(amp::GradScaler::new(exp.trainer.grad_scaler, device)?)
                }
                _ => None,
            },
            overlap: Default::default(),
        })
    }

    fn inputs(&self, batch: &Batch) -> anyhow::Result<(Tensor, Tensor)> {
        let x = Tensor::f_from_slice(&batch.images)?
            .f_reshape([
                batch.len() as i64,
                batch.channels as i64,
                batch.height as i64,
                batch.width as i64,
            ])?
            .f_to_kind(self.mode.storage())?
            .f_to(self.device)?;
        let labels: Vec<i64> = batch.labels.iter().map(|&l| l as i64).collect();
        let y = Tensor::f_from_slice(&labels)?.f_to(self.device)?;
        Ok((x, y))
    }

    fn stats(&self, logits: &Tensor, loss: &Tensor, batch: &Batch) -> anyhow::Result<StepStats> {
        let host = to_host(logits)?;
        let (c1, c5) = topk_hits(&host.data, self.classes, &batch.labels);
        Ok(StepStats {
            loss_sum: loss.f_double_value(&[])? * batch.len() as f64,
            correct1: c1,
            correct5: c5,
            count: batch.len() as u64,
        })
    }

    /// The logits of the last `forward_backward`, on the host.
    pub fn last_logits(&self) -> anyhow::Result<Option<HostTensor>> {
        self.last_logits.as_ref().map(to_host).transpose()
    }
}

/// Average `grads` in place through a collective without a c10d group (DataParallel's in-process one):
/// through host buffers, as the Candle engine does.
fn average_on_host(
    comm: &dyn crate::comm::collective::Collective,
    grads: &[Tensor],
    sync: &crate::strategy::ddp::GradSync,
) -> anyhow::Result<()> {
    let mut host: Vec<Vec<f32>> = grads
        .iter()
        .map(|g| to_host(g).map(|h| h.data))
        .collect::<anyhow::Result<_>>()?;
    crate::strategy::ddp::average_on_host(comm, &mut host, sync)?;
    tch::no_grad(|| -> anyhow::Result<()> {
        for (g, data) in grads.iter().zip(&host) {
            let mean = Tensor::f_from_slice(data)?
                .f_to_kind(g.kind())?
                .f_to(g.device())?;
            g.f_reshape([-1])?.f_copy_(&mean)?;
        }
        Ok(())
    })
}

impl Engine for TchEngine {
    fn forward_backward(&mut self, batch: &Batch, grad_scale: f64) -> anyhow::Result<StepStats> {
        let (x, y) = self.inputs(batch)?;
        let mut rng = Rng::keyed(&[self.seed, 0xD0_0D, self.forward_calls]);
        self.forward_calls += 1;
        let (logits, loss) = {
            let _autocast = amp::autocast(self.mode, self.device)?;
            let logits = self
                .arch
                .forward(&self.params, &mut self.buffers, &x, true, &mut rng)?;
            let loss = logits.f_cross_entropy_loss::<Tensor>(
                &y,
                None,
                tch::Reduction::Mean,
                -100,
                self.label_smoothing,
            )?;
            (logits, loss)
        };
        // Gradients accumulate in each parameter's `.grad` until the optimizer step, as in PyTorch;
        // under 16-mixed the loss is scaled first (GradScaler.scale(loss)).
        let scale = match &self.scaler {
            Some(s) => grad_scale * s.scale()?,
            None => grad_scale,
        };
        self.overlap.before_backward(&[&logits])?;
        loss.f_mul_scalar(scale)?.f_backward()?;
        let stats = self.stats(&logits, &loss, batch)?;
        self.last_logits = Some(logits.detach());
        Ok(stats)
    }

    fn optimizer_step(
        &mut self,
        lr: f64,
        momentum: Option<f64>,
        clip_norm: Option<f64>,
    ) -> anyhow::Result<f64> {
        let (names, mut grads): (Vec<String>, Vec<Tensor>) = self
            .params
            .iter()
            .filter_map(|(name, p)| {
                let g = p.grad();
                // No copy: the step uses `.grad` as scratch and then drops it; the optimizer copies
                // what it keeps.
                g.defined().then(|| (name.clone(), g.detach()))
            })
            .unzip();
        if let Some(scaler) = self.scaler.as_mut() {
            // GradScaler: unscale, and skip the whole step when any gradient overflowed.
            let found_inf = scaler.unscale(&mut grads)?;
            scaler.update(found_inf)?;
            if found_inf {
                for p in self.params.values_mut() {
                    fused_optim::clear_grad(p)?;
                }
                tracing::debug!("16-mixed: gradients overflowed, step skipped, loss scale lowered");
                return Ok(f64::INFINITY);
            }
        }
        // The norm is a whole extra pass over the gradients: only taken when clipping needs it.
        let (norm, scale) = match clip_norm {
            Some(_) => clip_factor(&grads, clip_norm)?,
            None => (f64::NAN, 1.0),
        };
        tch::no_grad(|| -> anyhow::Result<()> {
            for (name, g) in names.iter().zip(&mut grads) {
                if scale != 1.0 {
                    let _ = g.f_mul_scalar_(scale)?;
                }
                let mut p = self.params[name].detach();
                fused_optim::update(&mut self.optimizer, name, &mut p, g, lr, momentum)?;
            }
            Ok(())
        })?;
        for p in self.params.values_mut() {
            fused_optim::clear_grad(p)?;
        }
        self.optimizer.steps += 1;
        Ok(norm)
    }

    fn arm_gradient_sync(
        &mut self,
        comm: &dyn crate::comm::collective::Collective,
        sync: &crate::strategy::ddp::GradSync,
    ) -> anyhow::Result<bool> {
        self.overlap
            .arm(comm, sync, &self.param_order, &self.params)
    }

    fn all_reduce_gradients(
        &mut self,
        comm: &dyn crate::comm::collective::Collective,
        sync: &crate::strategy::ddp::GradSync,
    ) -> anyhow::Result<()> {
        // The last layers first (their gradients are ready first).
        let order: Vec<String> = self.param_order.iter().rev().cloned().collect();
        let here: Vec<bool> = order
            .iter()
            .map(|n| self.params[n].grad().defined())
            .collect();
        let reduced = self.overlap.take_reduced();
        if here.contains(&false) && !sync.find_unused_parameters {
            let missing: Vec<String> = order
                .iter()
                .zip(&here)
                .filter(|(_, &h)| !h)
                .map(|(n, _)| n.clone())
                .collect();
            return Err(crate::strategy::ddp::unused_parameters_error(&missing));
        }
        // Averaged during the backward pass already (`comm::reducer`).
        if reduced? {
            return Ok(());
        }
        let used = if sync.find_unused_parameters {
            crate::strategy::ddp::used_anywhere(comm, &here)?
        } else {
            vec![true; order.len()]
        };
        // Used elsewhere but not here: a zero gradient, so every rank reduces the same tensors.
        for ((name, &h), &u) in order.iter().zip(&here).zip(&used) {
            if u && !h {
                self.params[name]
                    .f_mul_scalar(0.0)?
                    .f_sum(Kind::Float)?
                    .f_backward()?;
            }
        }
        let grads: Vec<Tensor> = order
            .iter()
            .zip(&used)
            .filter(|(_, &u)| u)
            .map(|(n, _)| self.params[n].grad())
            .collect();
        // Across processes c10d reduces the buckets (all started before the first is waited for, so
        // flattening the next bucket overlaps with the reduction of the last); across the threads of
        // one process (DataParallel) they are averaged device to device; else through host memory.
        let pg = comm.process_group();
        if pg.is_none() && !comm.averages_tensors_in_process() {
            return average_on_host(comm, &grads, sync);
        }
        let numels: Vec<usize> = grads.iter().map(|g| g.numel()).collect();
        let world = comm.world_size() as f64;
        let ranges = crate::strategy::ddp::buckets(&numels, sync.bucket_cap_bytes);
        let mut flats = Vec::with_capacity(ranges.len());
        for range in &ranges {
            let views: Vec<Tensor> = grads[range.clone()]
                .iter()
                .map(|g| g.f_reshape([-1]))
                .collect::<Result<_, _>>()?;
            flats.push(Tensor::f_cat(&views, 0)?);
        }
        // The bucket's mean into its gradients (any device and dtype: `copy_` converts).
        let write_back = |range: std::ops::Range<usize>, mean: &Tensor| -> anyhow::Result<()> {
            tch::no_grad(|| {
                let mut at = 0i64;
                for g in &grads[range] {
                    let n = g.numel() as i64;
                    g.f_reshape([-1])?.f_copy_(&mean.f_narrow(0, at, n)?)?;
                    at += n;
                }
                Ok(())
            })
        };
        let Some(pg) = pg else {
            for (range, flat) in ranges.into_iter().zip(&flats) {
                // Averaged in f32 (as on the host), cast once into the gradients.
                write_back(range, &comm.mean_in_process(flat)?)?;
            }
            return Ok(());
        };
        let mut in_flight = Vec::with_capacity(flats.len());
        for flat in &flats {
            in_flight.push(pg.all_reduce(&[flat], crate::comm::collective::ReduceOp::Sum)?);
        }
        let mut works = in_flight.into_iter();
        for (range, flat) in ranges.into_iter().zip(&flats) {
            let work = works.next().context("one pending all-reduce per bucket")?;
            if let Err(e) = work.wait() {
                // A peer is gone: do not sit through the timeout once per remaining bucket.
                works.for_each(|w| w.abandon());
                return Err(e);
            }
            write_back(range, &flat.f_div_scalar(world)?)?;
        }
        Ok(())
    }

    fn units(&self) -> anyhow::Result<crate::model::stages::StageLayouts> {
        crate::model::stages::unit_layouts(&self.arch.0.stages(), &self.parameter_shapes())
    }

    fn forward_backward_by_unit(
        &mut self,
        batch: &Batch,
        grad_scale: f64,
        exchange: &mut dyn super::units::UnitExchange,
    ) -> anyhow::Result<StepStats> {
        let (x, labels) = self.inputs(batch)?;
        let mut rng = Rng::keyed(&[self.seed, 0xD0_0D, self.forward_calls]);
        self.forward_calls += 1;
        // Autocast is entered around each stage's forward computation (`staged`), not the backward passes.
        let (logits, loss) = {
            let mut staged = staged::Staged {
                engine: self,
                labels,
            };
            super::units::train_by_unit(&mut staged, x, grad_scale, exchange, &mut rng)?
        };
        let stats = self.stats(&logits, &loss, batch)?;
        self.last_logits = Some(logits);
        Ok(stats)
    }

    fn evaluate_by_unit(
        &mut self,
        batch: &Batch,
        exchange: &mut dyn super::units::UnitExchange,
    ) -> anyhow::Result<StepStats> {
        let (x, labels) = self.inputs(batch)?;
        let logits = {
            let mut staged = staged::Staged {
                engine: self,
                labels: labels.shallow_clone(),
            };
            super::units::evaluate_by_unit(&mut staged, x, exchange)?
        };
        let loss = {
            let _autocast = amp::autocast(self.mode, self.device)?; // as `evaluate` computes it
            logits.f_cross_entropy_loss::<Tensor>(&labels, None, tch::Reduction::Mean, -100, 0.0)?
        };
        self.stats(&logits, &loss, batch)
    }

    fn evaluate(&mut self, batch: &Batch) -> anyhow::Result<StepStats> {
        let (x, y) = self.inputs(batch)?;
        let mut rng = Rng::new(0);
        let _autocast = amp::autocast(self.mode, self.device)?;
        let logits = tch::no_grad(|| {
            self.arch
                .forward(&self.params, &mut self.buffers, &x, false, &mut rng)
        })?;
        let loss =
            logits.f_cross_entropy_loss::<Tensor>(&y, None, tch::Reduction::Mean, -100, 0.0)?;
        self.stats(&logits, &loss, batch)
    }

    fn state_dict(&self) -> anyhow::Result<StateDict> {
        let mut out = StateDict::new();
        for (name, t) in self.params.iter().chain(&self.buffers) {
            out.insert(name.clone(), to_host(t)?);
        }
        for (key, t) in &self.optimizer.state {
            out.insert(format!("optimizer.{key}"), to_host(t)?);
        }
        let mut counters = vec![
            ("optimizer.step".to_string(), self.optimizer.steps as f64),
            (
                "optimizer.forward_calls".to_string(),
                self.forward_calls as f64,
            ),
        ];
        if let Some(scaler) = &self.scaler {
            let (scale, growth) = scaler.state()?;
            counters.push((format!("optimizer.{SCALER_SCALE}"), scale));
            counters.push((format!("optimizer.{SCALER_GROWTH}"), growth));
        }
        for (key, value) in counters {
            out.insert(
                key,
                HostTensor {
                    shape: vec![1],
                    data: vec![value as f32],
                },
            );
        }
        Ok(out)
    }

    fn load_state_dict(&mut self, state: &StateDict) -> anyhow::Result<()> {
        for (name, t) in self.params.iter().chain(&self.buffers) {
            let value = state.get(name).with_context(|| {
                format!("the checkpoint has no tensor '{name}' (the model expects it)")
            })?;
            anyhow::ensure!(
                value.shape == dims(t),
                "tensor '{name}': checkpoint shape {:?}, model shape {:?}",
                value.shape,
                dims(t)
            );
            let value = to_tch(value, self.device)?;
            tch::no_grad(|| t.detach().f_copy_(&value))?;
        }
        self.optimizer.state.clear();
        let scaler_state = (
            state.get(&format!("optimizer.{SCALER_SCALE}")),
            state.get(&format!("optimizer.{SCALER_GROWTH}")),
        );
        if let (Some(scaler), (Some(scale), Some(growth))) = (self.scaler.as_mut(), scaler_state) {
            scaler.restore(scale.data[0] as f64, growth.data[0] as f64)?;
        }
        for (key, t) in state {
            if let Some(rest) = key.strip_prefix("optimizer.") {
                let first = t.data.first().copied().unwrap_or(0.0) as u64;
                match rest {
                    "step" => self.optimizer.steps = first,
                    "forward_calls" => self.forward_calls = first,
                    SCALER_SCALE | SCALER_GROWTH => {}
                    _ => {
                        self.optimizer
                            .state
                            .insert(rest.to_string(), to_tch(t, self.device)?);
                    }
                }
            }
        }
        Ok(())
    }

    fn load_pretrained(&mut self, state: &StateDict) -> anyhow::Result<Vec<String>> {
        let slots: Vec<crate::model::pretrained::Slot> = self
            .params
            .iter()
            .map(|(name, t)| crate::model::pretrained::Slot {
                name,
                shape: dims(t),
                trainable: true,
            })
            .chain(
                self.buffers
                    .iter()
                    .map(|(name, t)| crate::model::pretrained::Slot {
                        name,
                        shape: dims(t),
                        trainable: false,
                    }),
            )
            .collect();
        let crate::model::pretrained::PretrainedPlan { set, kept } =
            crate::model::pretrained::plan_pretrained(&slots, state)?;
        for (name, value) in set {
            let target = self
                .params
                .get(&name)
                .or_else(|| self.buffers.get(&name))
                .context("planned a tensor the model lacks")?;
            let value = to_tch(&value, self.device)?;
            tch::no_grad(|| target.detach().f_copy_(&value))?;
        }
        Ok(kept)
    }

    fn num_parameters(&self) -> usize {
        self.params.values().map(|t| t.numel()).sum()
    }

    fn loss_scale(&self) -> Option<f64> {
        self.scaler.as_ref().and_then(|s| s.scale().ok())
    }

    fn update_loss_scale(&mut self, found_inf: bool) -> anyhow::Result<()> {
        self.scaler
            .as_mut()
            .context("update_loss_scale: trainer.precision is not 16-mixed")?
            .update(found_inf)
    }

    fn parameter_shapes(&self) -> Vec<(String, Vec<usize>)> {
        self.params
            .iter()
            .map(|(name, t)| (name.clone(), dims(t)))
            .collect()
    }

    fn flat_home(&self) -> FlatHome {
        FlatHome::Tch(self.device)
    }

    /// Each parameter becomes a fresh leaf over its range of `flat` (a view when `flat` is already an
    /// f32 tensor on this device, as FSDP's flat parameter is: no copy).
    fn set_parameters(
        &mut self,
        layout: &[(String, Vec<usize>)],
        flat: &Flat,
    ) -> anyhow::Result<()> {
        self.overlap.forget();
        let flat = match flat {
            Flat::Tch(t) => t.f_to(self.device)?,
            Flat::Host(v) => Tensor::f_from_slice(v)?.f_to(self.device)?,
        };
        let numel: usize = layout
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum();
        anyhow::ensure!(
            flat.numel() >= numel,
            "set_parameters: the flat buffer holds {} values, the layout {numel}",
            flat.numel()
        );
        for (name, shape, range) in crate::tensor::layout_ranges(layout) {
            let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
            let t = flat
                .f_narrow(0, range.start as i64, range.len() as i64)?
                .f_view(shape.as_slice())?
                .f_to_kind(self.mode.storage())?
                .f_detach()?
                .set_requires_grad(true);
            anyhow::ensure!(
                self.params.insert(name.to_string(), t).is_some(),
                "set_parameters: the model has no parameter '{name}'"
            );
        }
        Ok(())
    }

    fn release_parameters(&mut self) -> anyhow::Result<()> {
        self.overlap.forget();
        // Dropping the tensors drops their `.grad` too.
        for t in self.params.values_mut() {
            *t = Tensor::f_empty([0], (self.mode.storage(), self.device))?;
        }
        Ok(())
    }

    fn take_gradients(
        &mut self,
        layout: &[(String, Vec<usize>)],
    ) -> anyhow::Result<(Flat, Vec<String>)> {
        let mut missing = Vec::new();
        let flat = flat_gradients(layout, self.device, |name| {
            let g = self
                .params
                .get(name)
                .with_context(|| format!("take_gradients: the model has no parameter '{name}'"))?
                .grad();
            if !g.defined() {
                missing.push(name.to_string());
            }
            Ok(g)
        })?;
        for (name, _) in layout {
            fused_optim::clear_grad(self.params.get_mut(name).expect("checked above"))?;
        }
        Ok((flat, missing))
    }

    fn state_bytes(&self) -> super::StateBytes {
        let bytes = |t: &Tensor| (t.numel() * t.kind().elt_size_in_bytes()) as u64;
        let parameters: u64 = self.params.values().map(bytes).sum();
        super::StateBytes {
            parameters,
            gradients: parameters,
            optimizer_state: self.optimizer.state.values().map(bytes).sum(),
            unsharded_peak: parameters,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn experiment() -> Experiment {
        crate::testing::experiment(
            "{name: mlp, num_classes: 4, hidden: [8]}",
            "{name: sgd, lr: 0.1, momentum: 0.9}",
            "{strategy: ddp, devices: 2}",
            4,
        )
    }

    fn batch() -> Batch {
        crate::testing::batch(1)
    }

    /// DDP with `find_unused_parameters` on tch: a parameter without a gradient on every rank keeps none
    /// (the optimizer leaves it, as PyTorch's reducer does); one without a gradient on one rank only
    /// counts as zero there.
    #[test]
    fn unused_everywhere_keeps_no_gradient_unused_somewhere_counts_zero() {
        let exp = experiment();
        let comms = crate::comm::local::group(2);
        let sync = crate::strategy::ddp::GradSync {
            bucket_cap_bytes: 1 << 20,
            find_unused_parameters: true,
            gradient_as_bucket_view: false,
        };
        let names: Vec<String> = TchEngine::new(&exp)
            .unwrap()
            .params
            .keys()
            .cloned()
            .collect();
        let (everywhere, somewhere) = (names[0].clone(), names[names.len() - 1].clone());
        let results: Vec<(TchEngine, Tensor)> = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .iter()
                .enumerate()
                .map(|(rank, comm)| {
                    let (exp, everywhere, somewhere) = (&exp, &everywhere, &somewhere);
                    s.spawn(move || {
                        let mut e = TchEngine::new(exp).unwrap();
                        e.forward_backward(&batch(), 1.0).unwrap();
                        fused_optim::clear_grad(e.params.get_mut(everywhere).unwrap()).unwrap();
                        let kept = e.params[somewhere].grad().copy();
                        if rank == 0 {
                            fused_optim::clear_grad(e.params.get_mut(somewhere).unwrap()).unwrap();
                        }
                        e.all_reduce_gradients(comm, &sync).unwrap();
                        (e, kept)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (e, _) in &results {
            assert!(!e.params[&everywhere].grad().defined());
        }
        let expected = results[1].1.shallow_clone() * 0.5;
        let got = results[0].0.params[&somewhere].grad();
        let diff = (&got - &expected).abs().max().double_value(&[]);
        assert!(diff < 1e-7, "{diff}");
        let mut e = results.into_iter().next().unwrap().0;
        let before = e.params[&everywhere].copy();
        e.optimizer_step(0.1, None, None).unwrap();
        assert!(e.params[&everywhere].equal(&before));
        assert!(!e
            .optimizer
            .state
            .keys()
            .any(|k| k.starts_with(&format!("{everywhere}."))));
    }
}
