//! The Candle engine (CPU by default; CUDA behind the `cuda` feature): parameters as Candle variables,
//! gradients accumulated across micro-batches, and PyTorch-equivalent SGD / Adam / AdamW updates.

pub mod autocast;
mod declared;
pub mod kernels;
mod models;
mod registered;
mod resnet;
mod staged;
mod vit;

use kernels::cpu;

use super::{topk_hits, Engine, Gradient, Gradients, Placement, Sharding, StepStats};
use crate::comm::collective::Collective;
use crate::data::loader::Batch;
use crate::model::init;
use crate::model::Architecture;
use crate::optim::{clip_factor, GradClip, Optimizer};
use crate::platform::rng::Rng;
use crate::registry::{CandleLoss, LossValue};
use crate::schema::Experiment;
use crate::tensor::{Flat, FlatHome, HostTensor, StateDict};
use anyhow::Context;
use autocast::Autocast;
use candle_core::{DType, Device, Tensor, Var};
use models::{Buffers, Params, Pass};
use std::collections::BTreeMap;
use std::sync::Arc;

pub struct CandleEngine {
    device: Device,
    model: Architecture,
    params: Params,
    buffers: Buffers,
    grads: BTreeMap<String, Tensor>,
    optimizer: Optimizer<Tensor>,
    classes: usize,
    label_smoothing: f64,
    /// The logits of the last training forward pass (for the PyTorch oracle).
    last_logits: Option<Tensor>,
    seed: u64,
    forward_calls: u64,
    /// `bf16-mixed`: forward passes round as bf16 autocast does.
    autocast: Autocast,
    /// SyncBatchNorm's group (`Placement::sync_batchnorm`).
    sync_batchnorm: Option<Arc<dyn Collective>>,
    /// A registered loss (`loss:`): what a step computes in place of classification's cross-entropy.
    loss: Option<Box<dyn CandleLoss>>,
    /// How many metrics it reports (asked once, not every step).
    loss_metrics: usize,
}

fn to_candle(t: &HostTensor, device: &Device) -> candle_core::Result<Tensor> {
    Tensor::from_slice(&t.data, t.shape.as_slice(), device)
}

fn to_host(t: &Tensor) -> anyhow::Result<HostTensor> {
    Ok(HostTensor {
        shape: t.dims().to_vec(),
        data: t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?,
    })
}

impl CandleEngine {
    /// A single-device engine (`Placement::single`).
    pub fn new(exp: &Experiment) -> anyhow::Result<Self> {
        Self::placed(exp, &Placement::single())
    }

    /// Under `bf16-mixed`, runs autocast's products on `tier` (`None`: emulated) instead of this CPU's
    /// fastest, as `TRAINYARD_BF16` does for a whole process: for tests and benchmarks that compare the
    /// tiers in one process. A tier this CPU does not run is refused. No effect at other precisions.
    pub fn pin_bf16_tier(
        &mut self,
        tier: Option<trainyard_conv::bf16::Tier>,
    ) -> anyhow::Result<()> {
        if let Some(t) = tier.filter(|t| !t.supported()) {
            anyhow::bail!("bf16 tier {}: this CPU does not run it", t.name());
        }
        if self.autocast.bf16 {
            self.autocast.tier = tier;
        }
        Ok(())
    }

    /// An engine placed as a strategy decided (Candle runs on the CPU: only SyncBatchNorm's group
    /// matters).
    pub fn placed(exp: &Experiment, placement: &Placement) -> anyhow::Result<Self> {
        let device = Device::Cpu;
        let model = Architecture::of(exp)?;
        if let Architecture::Registered(m) = &model {
            m.candle_entry()?;
        }
        let bf16 = exp.trainer.precision == crate::schema::Precision::MixedBf16;
        anyhow::ensure!(
            !(bf16 && matches!(model, Architecture::Registered(_))),
            "trainer.precision=bf16-mixed: Candle's autocast rounds trainyard's own kernels, not the candle-nn \
             ops inside a registered model; use trainer.precision=32-true"
        );
        let mut params = Params::new();
        for spec in model.specs() {
            let host = spec.initial_value(exp.seed);
            params.insert(
                spec.name.clone(),
                Var::from_tensor(&to_candle(&host, &device)?)?,
            );
        }
        let mut buffers = Buffers::new();
        for (name, shape, value) in model.buffers() {
            buffers.insert(name, to_candle(&init::constant(&shape, value), &device)?);
        }
        Ok(CandleEngine {
            autocast: if bf16 {
                Autocast::bf16()
            } else {
                Autocast::OFF
            },
            device,
            model,
            params,
            buffers,
            grads: BTreeMap::new(),
            optimizer: Optimizer::new(exp.optimizer.clone()),
            classes: exp.model.num_classes,
            label_smoothing: exp.model.label_smoothing,
            last_logits: None,
            seed: exp.seed,
            forward_calls: 0,
            sync_batchnorm: placement.sync_batchnorm.clone(),
            loss: exp.loss.as_ref().map(|l| build_loss(l)).transpose()?,
            loss_metrics: exp.loss.as_ref().map_or(0, |l| l.metrics.len()),
        })
    }

    /// Inputs (NCHW) and targets: class indices (`u32`, `[N]`), or a registered dataset's values
    /// (`f32`, `[N, ...]`).
    fn inputs(&self, batch: &Batch) -> anyhow::Result<(Tensor, Tensor)> {
        let n = batch.len();
        let x = Tensor::from_slice(
            &batch.images,
            (n, batch.channels, batch.height, batch.width),
            &self.device,
        )?;
        let y = match batch.tensors.as_ref().and_then(|t| t.targets.as_ref()) {
            Some((values, shape)) => {
                let dims: Vec<usize> = std::iter::once(n).chain(shape.iter().copied()).collect();
                Tensor::from_slice(values, dims.as_slice(), &self.device)?
            }
            None => Tensor::from_slice(&batch.labels, n, &self.device)?,
        };
        Ok((x, y))
    }

    /// A registered loss's value as statistics: the loss and each metric, summed over the batch.
    fn loss_stats(&self, value: &LossValue, count: usize) -> anyhow::Result<StepStats> {
        let scalar = |t: &Tensor| -> anyhow::Result<f64> {
            Ok(t.to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?
                .first()
                .copied()
                .map_or(f64::NAN, f64::from))
        };
        let wanted = self.loss_metrics;
        anyhow::ensure!(
            value.metrics.len() == wanted && value.loss.elem_count() == 1,
            "the loss returned {} metric values and a loss of shape {:?}; its metrics() names {wanted}, and \
             the loss is a scalar",
            value.metrics.len(),
            value.loss.dims()
        );
        let mut stats = StepStats {
            loss_sum: scalar(&value.loss)? * count as f64,
            count: count as u64,
            ..StepStats::default()
        };
        for (sum, metric) in stats.metric_sums.iter_mut().zip(&value.metrics) {
            *sum = scalar(metric)? * count as f64;
        }
        Ok(stats)
    }

    fn stats(&self, logits: &Tensor, loss: &Tensor, batch: &Batch) -> anyhow::Result<StepStats> {
        let flat = logits.flatten_all()?.to_vec1::<f32>()?;
        let (c1, c5) = topk_hits(&flat, self.classes, &batch.labels);
        Ok(StepStats {
            loss_sum: loss.to_scalar::<f32>()? as f64 * batch.len() as f64,
            correct1: c1,
            correct5: c5,
            count: batch.len() as u64,
            ..StepStats::default()
        })
    }

    /// Cross-entropy with PyTorch's label smoothing: (1 - e) * nll + e * mean over classes of -log p.
    /// Validation reports the plain cross-entropy, so runs with different smoothing compare.
    fn training_loss(&self, logits: &Tensor, y: &Tensor) -> candle_core::Result<Tensor> {
        let eps = self.label_smoothing;
        if eps <= 0.0 {
            return candle_nn::loss::cross_entropy(logits, y);
        }
        let logp = candle_nn::ops::log_softmax(logits, candle_core::D::Minus1)?;
        let nll = candle_nn::loss::nll(&logp, y)?;
        let uniform = logp.mean(candle_core::D::Minus1)?.mean_all()?.neg()?;
        nll.affine(1.0 - eps, 0.0)? + uniform.affine(eps, 0.0)?
    }

    /// The logits of the last `forward_backward`, on the host (row-major, batch x classes).
    pub fn last_logits(&self) -> anyhow::Result<Option<HostTensor>> {
        self.last_logits.as_ref().map(to_host).transpose()
    }

    /// Accumulated gradients by parameter name (for tests and distributed reduction).
    pub fn gradients(&self) -> &BTreeMap<String, Tensor> {
        &self.grads
    }

    fn update(
        &mut self,
        name: &str,
        grad: &Tensor,
        lr: f64,
        momentum: Option<f64>,
    ) -> anyhow::Result<()> {
        let var = self.params.get(name).context("unknown parameter")?.clone();
        // Detached: the update of a variable is tracked like any op on it, and the optimizer keeps its
        // result (the momentum buffer) from step to step, so every step's update (and the weight decay
        // term, a copy of every parameter) stayed alive through the buffer's graph: ~4 parameter-sized
        // tensors leaked per step (250 MB/step for ResNet-18 with weight decay).
        let new = self.optimizer.update(
            name,
            &var.as_tensor().detach(),
            &grad.detach(),
            lr,
            momentum,
        )?;
        var.set(&new)?;
        Ok(())
    }
}

impl CandleEngine {
    /// `optimizer_step` on the calling thread (a worker of the compute pool).
    fn optimizer_step_here(
        &mut self,
        lr: f64,
        momentum: Option<f64>,
        clip: Option<GradClip>,
    ) -> anyhow::Result<f64> {
        let (norm, scale) = clip_factor(self.grads.values(), GradClip::max_norm(clip))?;
        let grads = std::mem::take(&mut self.grads);
        for (name, g) in grads {
            let g = GradClip::clamp(clip, g)?;
            let g = if scale != 1.0 {
                g.affine(scale, 0.0)?
            } else {
                g
            };
            self.update(&name, &g, lr, momentum)?;
        }
        self.optimizer.steps += 1;
        Ok(norm)
    }

    /// `evaluate` on the calling thread (a worker of the compute pool).
    fn evaluate_here(&mut self, batch: &Batch) -> anyhow::Result<StepStats> {
        let (logits, y) = self.eval_logits(batch)?;
        self.last_logits = Some(logits.clone());
        if let Some(loss) = &self.loss {
            let value = loss.compute(&logits, &y)?;
            return self.loss_stats(&value, batch.len());
        }
        let loss = candle_nn::loss::cross_entropy(&logits, &y)?;
        self.stats(&logits, &loss, batch)
    }

    /// The eval-mode forward pass: logits and labels.
    fn eval_logits(&mut self, batch: &Batch) -> anyhow::Result<(Tensor, Tensor)> {
        let (x, y) = self.inputs(batch)?;
        let mut rng = Rng::new(0);
        let mut pass = Pass {
            train: false,
            rng: &mut rng,
            sync_batchnorm: self.sync_batchnorm.as_ref(),
            autocast: self.autocast,
        };
        let logits =
            models::forward(&self.model, &self.params, &mut self.buffers, &x, &mut pass)?.detach();
        Ok((logits, y))
    }

    /// `forward_backward` on the calling thread (a worker of the compute pool).
    fn forward_backward_here(
        &mut self,
        batch: &Batch,
        grad_scale: f64,
    ) -> anyhow::Result<StepStats> {
        let (x, y) = self.inputs(batch)?;
        let mut rng = Rng::keyed(&[self.seed, 0xD0_0D, self.forward_calls]);
        self.forward_calls += 1;
        let (logits, cut) = {
            let mut pass = Pass {
                train: true,
                rng: &mut rng,
                sync_batchnorm: self.sync_batchnorm.as_ref(),
                autocast: self.autocast,
            };
            models::forward_cut(&self.model, &self.params, &mut self.buffers, &x, &mut pass)?
        };
        let (loss, value) = match &self.loss {
            Some(registered) => {
                let value = registered.compute(&logits, &y)?;
                (value.loss.clone(), Some(value))
            }
            None => (self.training_loss(&logits, &y)?, None),
        };
        let mut grads = loss.affine(grad_scale, 0.0)?.backward()?;
        if let Some(cut) = cut {
            cut.backward_into(&mut grads)?;
        }
        self.last_logits = Some(logits.detach());
        for (name, var) in &self.params {
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            let sum = match self.grads.remove(name) {
                Some(prev) => (prev + g)?,
                None => g.clone(),
            };
            self.grads.insert(name.clone(), sum);
        }
        match value {
            Some(value) => self.loss_stats(&value, batch.len()),
            None => self.stats(&logits, &loss, batch),
        }
    }
}

/// The registered loss `loss:` names.
fn build_loss(spec: &crate::schema::LossSpec) -> anyhow::Result<Box<dyn CandleLoss>> {
    let entry = crate::registry::loss(&spec.spec.target)
        .with_context(|| format!("loss: _target_ {} is not registered", spec.spec.target))?;
    (entry.build)(&spec.spec.args).map_err(|e| anyhow::anyhow!(spec.spec.refused(&e)))
}

impl Engine for CandleEngine {
    fn forward_backward(&mut self, batch: &Batch, grad_scale: f64) -> anyhow::Result<StepStats> {
        cpu::on_compute_pool(|| self.forward_backward_here(batch, grad_scale))
    }

    fn optimizer_step(
        &mut self,
        lr: f64,
        momentum: Option<f64>,
        clip: Option<GradClip>,
    ) -> anyhow::Result<f64> {
        cpu::on_compute_pool(|| self.optimizer_step_here(lr, momentum, clip))
    }

    /// Host copies, the last layers first (reverse name order), as DDP's buckets fill.
    fn take_gradients(&mut self) -> anyhow::Result<Gradients> {
        let mut entries = Vec::with_capacity(self.params.len());
        for (name, var) in self.params.iter().rev() {
            let value = match self.grads.remove(name) {
                Some(g) => Some(Flat::Host(
                    g.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?,
                )),
                None => None,
            };
            entries.push(Gradient {
                name: name.clone(),
                numel: var.as_tensor().elem_count(),
                value,
            });
        }
        self.grads.clear();
        Ok(Gradients {
            entries,
            home: FlatHome::Host,
        })
    }

    fn put_gradients(&mut self, grads: Gradients) -> anyhow::Result<()> {
        for g in grads.entries {
            let Some(value) = g.value else { continue };
            let var = self.params.get(&g.name).with_context(|| {
                format!("put_gradients: the model has no parameter '{}'", g.name)
            })?;
            let shape = var.as_tensor().dims().to_vec();
            let t = Tensor::from_vec(value.into_host()?, shape.as_slice(), &self.device)?;
            self.grads.insert(g.name, t);
        }
        Ok(())
    }

    fn evaluate(&mut self, batch: &Batch) -> anyhow::Result<StepStats> {
        cpu::on_compute_pool(|| self.evaluate_here(batch))
    }

    fn predict(&mut self, batch: &Batch) -> anyhow::Result<HostTensor> {
        cpu::on_compute_pool(|| to_host(&self.eval_logits(batch)?.0))
    }

    fn take_outputs(&mut self) -> anyhow::Result<Option<HostTensor>> {
        self.last_logits.take().map(|t| to_host(&t)).transpose()
    }

    fn state_dict(&self) -> anyhow::Result<StateDict> {
        let mut out = StateDict::new();
        for (name, var) in &self.params {
            out.insert(name.clone(), to_host(var.as_tensor())?);
        }
        for (name, t) in &self.buffers {
            out.insert(name.clone(), to_host(t)?);
        }
        for (key, t) in &self.optimizer.state {
            out.insert(format!("optimizer.{key}"), to_host(t)?);
        }
        out.insert(
            "optimizer.step".into(),
            HostTensor {
                shape: vec![1],
                data: vec![self.optimizer.steps as f32],
            },
        );
        out.insert(
            "optimizer.forward_calls".into(),
            HostTensor {
                shape: vec![1],
                data: vec![self.forward_calls as f32],
            },
        );
        Ok(out)
    }

    fn load_state_dict(&mut self, state: &StateDict) -> anyhow::Result<()> {
        for (name, var) in &self.params {
            let t = state.get(name).with_context(|| {
                format!("the checkpoint has no tensor '{name}' (the model expects it)")
            })?;
            if t.shape != var.dims() {
                anyhow::bail!(
                    "tensor '{name}': checkpoint shape {:?}, model shape {:?}",
                    t.shape,
                    var.dims()
                );
            }
            var.set(&to_candle(t, &self.device)?)?;
        }
        for (name, buf) in self.buffers.iter_mut() {
            let t = state.get(name).with_context(|| {
                format!("the checkpoint has no buffer '{name}' (the model expects it)")
            })?;
            *buf = to_candle(t, &self.device)?;
        }
        self.optimizer.state.clear();
        for (key, t) in state {
            if let Some(rest) = key.strip_prefix("optimizer.") {
                match rest {
                    "step" => self.optimizer.steps = t.data.first().copied().unwrap_or(0.0) as u64,
                    "forward_calls" => {
                        self.forward_calls = t.data.first().copied().unwrap_or(0.0) as u64
                    }
                    _ => {
                        self.optimizer
                            .state
                            .insert(rest.to_string(), to_candle(t, &self.device)?);
                    }
                }
            }
        }
        Ok(())
    }

    fn parameter_shapes(&self) -> Vec<(String, Vec<usize>)> {
        self.params
            .iter()
            .map(|(name, var)| (name.clone(), var.dims().to_vec()))
            .collect()
    }

    fn sharding(&mut self) -> Option<&mut dyn Sharding> {
        Some(self)
    }

    fn state_bytes(&self) -> super::StateBytes {
        let bytes = |t: &Tensor| (t.elem_count() * t.dtype().size_in_bytes()) as u64;
        let parameters: u64 = self.params.values().map(|v| bytes(v.as_tensor())).sum();
        super::StateBytes {
            parameters,
            // Gradients exist for every parameter from the first backward pass to each step.
            gradients: parameters,
            optimizer_state: self.optimizer.state.values().map(bytes).sum(),
            unsharded_peak: parameters,
        }
    }
}

impl Sharding for CandleEngine {
    fn flat_home(&self) -> FlatHome {
        FlatHome::Host
    }

    fn stage_layouts(&self) -> anyhow::Result<crate::model::stages::StageLayouts> {
        crate::model::stages::unit_layouts(&self.model.stages(), &self.parameter_shapes())
    }

    fn set_parameters(
        &mut self,
        layout: &[(String, Vec<usize>)],
        flat: &crate::tensor::Flat,
    ) -> anyhow::Result<()> {
        let flat = flat.host_values()?;
        for (name, shape, range) in crate::tensor::layout_ranges(layout) {
            let values = flat
                .get(range)
                .context("set_parameters: the flat buffer is shorter than the layout")?;
            let var = Var::from_slice(values, shape, &self.device)?;
            anyhow::ensure!(
                self.params.insert(name.to_string(), var).is_some(),
                "set_parameters: the model has no parameter '{name}'"
            );
        }
        Ok(())
    }

    fn release_parameters(&mut self) -> anyhow::Result<()> {
        for var in self.params.values_mut() {
            *var = Var::from_slice::<_, f32>(&[], 0, &self.device)?;
        }
        self.grads.clear();
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
        let (logits, value) = {
            let mut staged = staged::LossStage {
                engine: self,
                labels,
            };
            super::units::train_by_unit(&mut staged, x, grad_scale, exchange, &mut rng)?
        };
        self.last_logits = Some(logits.clone());
        match self.loss.is_some() {
            true => self.loss_stats(&value, batch.len()),
            false => self.stats(&logits, &value.loss, batch),
        }
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
                labels: labels.clone(),
            };
            super::units::evaluate_by_unit(&mut staged, x, exchange)?
        };
        self.last_logits = Some(logits.detach());
        if let Some(loss) = &self.loss {
            let value = loss.compute(&logits, &labels)?;
            return self.loss_stats(&value, batch.len());
        }
        let loss = candle_nn::loss::cross_entropy(&logits, &labels)?;
        self.stats(&logits, &loss, batch)
    }
}

#[cfg(test)]
mod tests;
