//! The tch (libtorch) engine, `backend=tch` (cargo feature `torch`): PyTorch's own kernels behind the same
//! `Engine` trait as Candle. Everything that is not a kernel is shared with the Candle engine: parameter
//! names, shapes and host-side seeded initialisation come from the model zoo's specs, the optimizer rules
//! from `optim`, pretrained-weight matching from `model::pretrained`, dropout masks from
//! the same seeded host generator — so the two backends start from the same weights and take the same steps.

pub mod amp;
mod batch_transfer;
mod ddp_overlap;
mod declared;
mod fused_optim;
mod models;
mod objective;
mod ops;
mod own_model;
mod staged;
pub mod torchscript;

use super::{
    BackwardOverlap, Engine, Gradient, Gradients, LossScaler, PendingStats, Placement, Sharding,
    StepStats,
};
use crate::comm::buckets::GradSync;
use crate::comm::c10d::ProcessGroup;
use crate::comm::collective::Collective;
use crate::data::loader::{Batch, StageBatch};
use crate::model::init;
use crate::optim::{clip_factor, GradClip, Optimizer};
use crate::platform::rng::Rng;
use crate::schema::{Accelerator, Experiment};
use crate::tensor::{Flat, FlatHome, HostTensor, StateDict};
use anyhow::Context;
use std::collections::BTreeMap;
use std::sync::Arc;
use tch::{Device, Kind, Tensor};

pub struct TchEngine {
    device: Device,
    /// `data.pin_memory`: batches reach a GPU through page-locked memory.
    pin_memory: bool,
    arch: models::Arch,
    /// A registered model (a crate's tch model, a TorchScript module): run instead of `arch`'s passes.
    own: Option<own_model::OwnModel>,
    params: BTreeMap<String, Tensor>,
    /// Parameter names in the order the model defines them (DDP's first buckets follow it).
    param_order: Vec<String>,
    buffers: BTreeMap<String, Tensor>,
    optimizer: Optimizer<Tensor>,
    /// Cross-entropy, or a registered loss (`loss:`).
    objective: objective::Objective,
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
    let count = crate::platform::cuda::device_count();
    anyhow::ensure!(
        index < count,
        "cuda:{index} does not exist: libtorch sees {count} CUDA device(s); set trainer.devices to at most \
         {count} (or trainer.accelerator=cpu)"
    );
    Ok(Device::Cuda(index))
}

impl TchEngine {
    /// The eval-mode forward pass (under whatever autocast the caller entered), without a graph.
    fn eval_forward(&mut self, x: &Tensor) -> anyhow::Result<Tensor> {
        let mut rng = Rng::new(0);
        tch::no_grad(|| match &mut self.own {
            Some(own) => Ok(own.forward(x, None, None)?.0),
            None => self
                .arch
                .forward(&self.params, &mut self.buffers, x, false, &mut rng),
        })
    }

    /// The logits and the objective of one pass: training mode keeps the graph for the backward pass,
    /// evaluation runs without one.
    fn pass(
        &mut self,
        x: &Tensor,
        y: &Tensor,
        train: bool,
    ) -> anyhow::Result<(Tensor, objective::Computed)> {
        let mut run = || -> anyhow::Result<(Tensor, objective::Computed)> {
            let mut rng = match train {
                true => Rng::keyed(&[self.seed, 0xD0_0D, self.forward_calls]),
                false => Rng::new(0),
            };
            if train {
                self.forward_calls += 1;
            }
            let (logits, own_loss) = match &mut self.own {
                Some(own) => {
                    let seed = train
                        .then(|| Rng::keyed(&[self.seed, 0x5EED, self.forward_calls]).next_u64());
                    own.forward(x, Some(y), seed)?
                }
                None => (
                    self.arch
                        .forward(&self.params, &mut self.buffers, x, train, &mut rng)?,
                    None,
                ),
            };
            let computed = self.objective.compute(&logits, own_loss, y, train)?;
            Ok((logits, computed))
        };
        match train {
            true => run(),
            false => tch::no_grad(run),
        }
    }

    /// A single-device engine (`Placement::single`).
    pub fn new(exp: &Experiment) -> anyhow::Result<Self> {
        Self::placed(exp, &Placement::single())
    }

    /// On CUDA device `placement.device_index` when the run is on CUDA (a worker's local rank;
    /// DataParallel's replica r is on cuda:r), else the CPU. A placement that owns its device makes it
    /// the current CUDA device (as `torch.cuda.set_device(local_rank)`), so nothing lands on cuda:0 by
    /// default (cuBLAS handles, NCCL streams); DataParallel's replicas share the process and keep the
    /// default.
    pub fn placed(exp: &Experiment, placement: &Placement) -> anyhow::Result<Self> {
        let (index, make_current) = (placement.device_index, placement.owns_device);
        apply_determinism(&exp.trainer)?;
        let device = match exp.trainer.accelerator {
            Accelerator::Cpu => Device::Cpu,
            Accelerator::Gpu | Accelerator::Cuda => {
                anyhow::ensure!(
                    crate::platform::cuda::is_available(),
                    "trainer.accelerator={}: {}; or set trainer.accelerator=cpu",
                    format!("{:?}", exp.trainer.accelerator).to_lowercase(),
                    crate::platform::cuda::why_unavailable()
                );
                cuda(index)?
            }
            Accelerator::Auto if crate::platform::cuda::is_available() => cuda(index)?,
            Accelerator::Auto => Device::Cpu,
        };
        if make_current && device.is_cuda() {
            crate::platform::cuda::set_current_device(index)?;
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
        let arch = models::Arch {
            arch: crate::model::Architecture::of(exp)?,
            sync_batchnorm: placement.sync_batchnorm.clone(),
        };
        let zoo = &arch.arch;
        let mut params = BTreeMap::new();
        let mut buffers = BTreeMap::new();
        let (own, param_order) = if let crate::model::Architecture::Registered(m) = zoo {
            let sync_bn = placement.sync_batchnorm.is_some();
            let (own, (named, named_buffers)) =
                own_model::OwnModel::build(m, exp, device, mode, sync_bn)?;
            let order = named.iter().map(|(n, _)| n.clone()).collect();
            params.extend(named);
            buffers.extend(named_buffers);
            (Some(own), order)
        } else {
            for spec in zoo.specs() {
                let host = spec.initial_value(exp.seed);
                params.insert(
                    spec.name.clone(),
                    store(to_tch(&host, device)?, &spec.name)?.set_requires_grad(true),
                );
            }
            for (name, shape, value) in zoo.buffers() {
                let t = store(to_tch(&init::constant(&shape, value), device)?, &name)?;
                buffers.insert(name, t);
            }
            (None, zoo.specs().iter().map(|s| s.name.clone()).collect())
        };
        Ok(TchEngine {
            device,
            pin_memory: exp.data.pin_memory,
            arch,
            own,
            params,
            param_order,
            buffers,
            optimizer: Optimizer::new(exp.optimizer.clone()),
            objective: objective::Objective::new(exp)?,
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

    /// Inputs (NCHW) and targets on the device: class indices (`i64`, `[N]`), or a registered dataset's
    /// values (`f32`, `[N, ...]`).
    fn inputs(&self, batch: &Batch) -> anyhow::Result<(Tensor, Tensor)> {
        let (x, y) = batch_transfer::to_device(batch, self.device, self.pin_memory)?;
        let y = match batch.tensors.as_ref().and_then(|t| t.targets.as_ref()) {
            Some((values, shape)) => {
                let dims: Vec<i64> = std::iter::once(batch.len() as i64)
                    .chain(shape.iter().map(|&d| d as i64))
                    .collect();
                Tensor::f_from_slice(values)?
                    .f_reshape(&dims)?
                    .f_to(self.device)?
            }
            None => y,
        };
        // Cast on the device: the GPU converts far faster than the host would.
        Ok((x.f_to_kind(self.mode.storage())?, y))
    }

    /// The logits of the last `forward_backward`, on the host.
    pub fn last_logits(&self) -> anyhow::Result<Option<HostTensor>> {
        self.last_logits.as_ref().map(to_host).transpose()
    }
}

impl Engine for TchEngine {
    fn forward_backward(&mut self, batch: &Batch, grad_scale: f64) -> anyhow::Result<StepStats> {
        self.forward_backward_queued(batch, grad_scale)?.resolve()
    }

    fn forward_backward_queued(
        &mut self,
        batch: &Batch,
        grad_scale: f64,
    ) -> anyhow::Result<PendingStats> {
        let (x, y) = self.inputs(batch)?;
        let (logits, computed) = {
            let _autocast = amp::autocast(self.mode, self.device)?;
            self.pass(&x, &y, true)?
        };
        let loss = computed.loss;
        // Gradients accumulate in each parameter's `.grad` until the optimizer step, as in PyTorch;
        // under 16-mixed the loss is scaled first (GradScaler.scale(loss)).
        self.overlap.before_backward(&[&logits])?;
        // GradScaler.scale(loss): multiplied by the scale on the device, not read back first (a read
        // would stall the host until the forward pass has run, leaving the GPU idle while it queues the
        // backward pass).
        let scaled = match &self.scaler {
            Some(s) => s.scale_loss(&loss)?,
            None => loss.shallow_clone(),
        };
        if grad_scale != 1.0 {
            scaled.f_mul_scalar(grad_scale)?.f_backward()?;
        } else {
            scaled.f_backward()?;
        }
        let packed = computed.stats;
        self.last_logits = Some(logits.detach());
        let count = batch.len();
        Ok(PendingStats::deferred(move || packed.read(count)))
    }

    fn optimizer_step(
        &mut self,
        lr: f64,
        momentum: Option<f64>,
        clip: Option<GradClip>,
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
        let (norm, scale) = match GradClip::max_norm(clip) {
            Some(max) => clip_factor(&grads, Some(max))?,
            None => (f64::NAN, 1.0),
        };
        if let Some(GradClip::Value(_)) = clip {
            grads = grads
                .into_iter()
                .map(|g| GradClip::clamp(clip, g))
                .collect::<anyhow::Result<_>>()?;
        }
        tch::no_grad(|| -> anyhow::Result<()> {
            fused_optim::scale_all(&mut grads, scale)?;
            // One multi-tensor step for the whole model (a few launches, not a few per parameter).
            let mut params: Vec<Tensor> = names
                .iter()
                .map(|name| self.params[name].detach())
                .collect();
            let opt = &mut self.optimizer;
            match opt.config.name {
                crate::schema::OptimizerName::Sgd => {
                    fused_optim::sgd_all(opt, &names, &mut params, &mut grads, lr, momentum)
                }
                crate::schema::OptimizerName::Registered => {
                    fused_optim::each_param(opt, &names, &mut params, &grads, lr, momentum)
                }
                _ => fused_optim::adam_all(opt, &names, &mut params, &mut grads, lr),
            }
        })?;
        for p in self.params.values_mut() {
            fused_optim::clear_grad(p)?;
        }
        self.optimizer.steps += 1;
        Ok(norm)
    }

    /// Views of the `.grad` tensors (reshaped flat, no copy), the last layers first (reverse definition
    /// order, as DDP's buckets fill); the parameters' `.grad` are cleared.
    fn take_gradients(&mut self) -> anyhow::Result<Gradients> {
        let mut entries = Vec::with_capacity(self.param_order.len());
        for name in self.param_order.iter().rev() {
            let p = self
                .params
                .get_mut(name)
                .context("a parameter of the model's order is missing")?;
            let g = p.grad();
            let value = match g.defined() {
                true => Some(Flat::Tch(g.f_reshape([-1])?)),
                false => None,
            };
            fused_optim::clear_grad(p)?;
            entries.push(Gradient {
                name: name.clone(),
                numel: p.numel(),
                value,
            });
        }
        Ok(Gradients {
            entries,
            home: FlatHome::Tch(self.device, self.mode.storage()),
        })
    }

    /// Each value becomes its parameter's `.grad` (a view of it, when it is one already: no copy).
    fn put_gradients(&mut self, grads: Gradients) -> anyhow::Result<()> {
        tch::no_grad(|| -> anyhow::Result<()> {
            for g in grads.entries {
                let Some(value) = g.value else { continue };
                let p = self.params.get_mut(&g.name).with_context(|| {
                    format!("put_gradients: the model has no parameter '{}'", g.name)
                })?;
                let value = match value {
                    Flat::Tch(t) => t.f_to_kind(p.kind())?.f_to(p.device())?,
                    host @ Flat::Host(_) => Tensor::f_from_slice(&host.into_host()?)?
                        .f_to_kind(p.kind())?
                        .f_to(p.device())?,
                };
                let shaped = value.f_view(p.size().as_slice())?;
                fused_optim::set_grad(p, &shaped)?;
            }
            Ok(())
        })
    }

    fn sharding(&mut self) -> Option<&mut dyn Sharding> {
        Some(self)
    }

    fn overlap(&mut self) -> Option<&mut dyn BackwardOverlap> {
        Some(self)
    }

    fn loss_scaler(&mut self) -> Option<&mut dyn LossScaler> {
        self.scaler.as_mut().map(|s| s as &mut dyn LossScaler)
    }

    fn batch_stager(&self) -> Option<Arc<dyn StageBatch>> {
        (self.device.is_cuda() && self.pin_memory)
            .then(|| Arc::new(batch_transfer::PinBatches) as Arc<dyn StageBatch>)
    }

    fn evaluate(&mut self, batch: &Batch) -> anyhow::Result<StepStats> {
        let (x, y) = self.inputs(batch)?;
        let _autocast = amp::autocast(self.mode, self.device)?;
        let (logits, computed) = self.pass(&x, &y, false)?;
        self.last_logits = Some(logits.detach());
        computed.stats.read(batch.len())
    }

    fn predict(&mut self, batch: &Batch) -> anyhow::Result<HostTensor> {
        let (x, _) = self.inputs(batch)?;
        let _autocast = amp::autocast(self.mode, self.device)?;
        to_host(&self.eval_forward(&x)?)
    }

    fn take_outputs(&mut self) -> anyhow::Result<Option<HostTensor>> {
        self.last_logits.take().map(|t| to_host(&t)).transpose()
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

    fn parameter_shapes(&self) -> Vec<(String, Vec<usize>)> {
        self.params
            .iter()
            .map(|(name, t)| (name.clone(), dims(t)))
            .collect()
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

impl Sharding for TchEngine {
    fn flat_home(&self) -> FlatHome {
        FlatHome::Tch(self.device, Kind::Float)
    }

    fn stage_layouts(&self) -> anyhow::Result<crate::model::stages::StageLayouts> {
        crate::model::stages::unit_layouts(&self.arch.arch.stages(), &self.parameter_shapes())
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
        let (logits, stats) = {
            let mut staged = staged::LossStage {
                engine: self,
                labels: labels.shallow_clone(),
            };
            super::units::train_by_unit(&mut staged, x, grad_scale, exchange, &mut rng)?
        };
        let stats = stats.read(batch.len())?;
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
            let mut staged = staged::LossStage {
                engine: self,
                labels: labels.shallow_clone(),
            };
            super::units::evaluate_by_unit(&mut staged, x, exchange)?
        };
        self.last_logits = Some(logits.shallow_clone());
        let computed = {
            let _autocast = amp::autocast(self.mode, self.device)?; // as `evaluate` computes it
            self.objective.compute(&logits, None, &labels, false)?
        };
        computed.stats.read(batch.len())
    }
}

/// DDP on libtorch's reducer (`ddp_overlap`), over a c10d group.
impl BackwardOverlap for TchEngine {
    fn arm(&mut self, group: &dyn Collective, sync: &GradSync) -> anyhow::Result<bool> {
        let Some(group) = ProcessGroup::of(group) else {
            return Ok(false);
        };
        self.overlap
            .arm(group, sync, &self.param_order, &self.params)?;
        Ok(true)
    }

    fn take_reduced(&mut self) -> anyhow::Result<bool> {
        self.overlap.take_reduced()
    }
}
