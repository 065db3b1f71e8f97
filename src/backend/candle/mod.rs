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
mod tests {
    use super::*;
    use crate::data::loader::Batch;

    fn experiment(model: &str, optimizer: &str) -> Experiment {
        experiment_with(model, optimizer, 4)
    }

    fn experiment_with(model: &str, optimizer: &str, classes: usize) -> Experiment {
        let trainer = "{strategy: single, devices: 1}";
        crate::testing::experiment(model, optimizer, trainer, classes)
    }

    fn batch() -> Batch {
        crate::testing::batch(1)
    }

    /// Under bf16 autocast on each tier with the blocked direct convolutions that runs here (AMX,
    /// AVX512-BF16, f32 FMAs; their portable reference where none does), ResNet keeps its activations blocked and
    /// convolves on tiles; its loss and every gradient agree with the emulated path's (NCHW, rounded
    /// operands around f32 products) as far as bf16's rounding lets two summation orders agree. (On a CPU
    /// whose blocked layout is not 16 lanes both runs are emulated.)
    #[rstest::rstest]
    fn resnet_bf16_on_tiles_equals_the_emulated_path(
        #[values(
            trainyard_conv::bf16::Tier::Amx,
            trainyard_conv::bf16::Tier::Avx512Bf16,
            trainyard_conv::bf16::Tier::Fma
        )]
        tier: trainyard_conv::bf16::Tier,
    ) {
        use trainyard_conv::bf16::Tier;
        let tier = [tier, Tier::Portable]
            .into_iter()
            .find(|t| t.supported())
            .expect("portable runs everywhere");
        let exp = experiment(
            "{name: resnet18, num_classes: 4, cifar_stem: true}",
            "{name: sgd, lr: 0.1}",
        );
        // 16 images of 16x16: BatchNorm's batch statistics over enough values that bf16's rounding noise
        // (which differs between any two summation orders) is not amplified past comparison.
        let mut rng = crate::platform::rng::Rng::new(3);
        let batch = Batch {
            images: (0..16 * 3 * 16 * 16).map(|_| rng.normal() as f32).collect(),
            labels: (0..16).map(|i| i % 4).collect(),
            channels: 3,
            height: 16,
            width: 16,
            staged: None,
            tensors: None,
        };
        let run = |tier: Option<Tier>| {
            let mut e = CandleEngine::new(&exp).unwrap();
            e.autocast = Autocast { bf16: true, tier };
            let stats = e.forward_backward(&batch, 1.0).unwrap();
            (stats.loss_sum, e.gradients().clone())
        };
        let (tiles, emulated) = (run(Some(tier)), run(None));
        // The losses agree within one bf16 rounding unit (2^-8): each tier's summation order moves it by
        // ~1e-3 here (AVX512-BF16 +0.9e-3, the portable order -1.4e-3); a transposed kernel moves it 4.5%.
        let rel = (tiles.0 - emulated.0).abs() / emulated.0.abs();
        assert!(
            rel < 1.0 / 256.0,
            "loss {} vs {} on {}",
            tiles.0,
            emulated.0,
            tier.name()
        );
        // Two summation orders of the same bf16 products agree to a cosine of 0.95-0.9999 per gradient
        // here (any two: AMX against the portable order as well); a wrong tap, flip or transpose gives
        // near 0.
        let cos = |a: &Tensor, b: &Tensor| {
            let sum = |t: Tensor| t.sum_all().unwrap().to_scalar::<f32>().unwrap();
            let dot = sum((a * b).unwrap());
            dot / (sum(a.sqr().unwrap()) * sum(b.sqr().unwrap()))
                .sqrt()
                .max(1e-30)
        };
        for (name, g) in &emulated.1 {
            let c = cos(&tiles.1[name], g);
            assert!(
                c > 0.9,
                "{name}: gradients at cosine {c} on {}",
                tier.name()
            );
        }
    }

    /// Every trainable parameter of every zoo model must receive a non-zero gradient.
    #[test]
    fn every_parameter_gets_a_gradient() {
        for model in [
            "{name: mlp, num_classes: 4, hidden: [16]}",
            "{name: cnn, num_classes: 4, channels: [4, 8]}",
            "{name: resnet18, num_classes: 4, cifar_stem: true}",
            "{name: resnet50, num_classes: 4}",
            "{name: vit, num_classes: 4, variant: tiny, patch_size: 4, image_size: 8, dropout: 0.1}",
        ] {
            let mut e = CandleEngine::new(&experiment(model, "{name: sgd, lr: 0.1}")).unwrap();
            e.forward_backward(&batch(), 1.0).unwrap();
            assert_eq!(e.gradients().len(), e.params.len(), "{model}");
            for (name, g) in e.gradients() {
                let norm = g
                    .sqr()
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap();
                assert!(norm > 0.0, "{model}: {name} has a zero gradient");
            }
        }
    }

    /// The training pass cut at the head, with the body's backward on trainyard's tape, gives Candle's own
    /// gradients for every parameter, bit for bit; the zoo's CNN, ResNets and ViT are cut (their bodies are
    /// the kernels' ops alone), the rest keep Candle's graph.
    #[test]
    fn the_tapes_backward_equals_candles() {
        for (model, cut_expected) in [
            ("{name: cnn, num_classes: 4, channels: [4, 8]}", true),
            ("{name: resnet18, num_classes: 4, cifar_stem: true}", true),
            ("{name: resnet50, num_classes: 4}", true),
            (
                "{name: vit, num_classes: 4, variant: tiny, patch_size: 4, image_size: 8}",
                true,
            ),
            ("{name: mlp, num_classes: 4, hidden: [16, 8]}", true),
        ] {
            let e = CandleEngine::new(&experiment(model, "{name: sgd, lr: 0.1}")).unwrap();
            let (x, y) = e.inputs(&crate::testing::batch(3)).unwrap();
            let run = |cut: bool| {
                let mut rng = Rng::new(3);
                let mut pass = Pass {
                    train: true,
                    rng: &mut rng,
                    sync_batchnorm: None,
                    autocast: e.autocast,
                };
                let mut buffers = e.buffers.clone();
                let (logits, c) = if cut {
                    models::forward_cut(&e.model, &e.params, &mut buffers, &x, &mut pass).unwrap()
                } else {
                    let l = models::forward(&e.model, &e.params, &mut buffers, &x, &mut pass);
                    (l.unwrap(), None)
                };
                let loss = candle_nn::loss::cross_entropy(&logits, &y).unwrap();
                let mut grads = loss.backward().unwrap();
                let was_cut = c.is_some();
                if let Some(c) = c {
                    c.backward_into(&mut grads).unwrap();
                }
                let values: BTreeMap<String, Vec<f32>> = e
                    .params
                    .iter()
                    .map(|(name, v)| {
                        let g = grads.get(v.as_tensor()).expect(name);
                        (name.clone(), g.flatten_all().unwrap().to_vec1().unwrap())
                    })
                    .collect();
                (was_cut, values)
            };
            let (was_cut, taped) = run(true);
            assert_eq!(was_cut, cut_expected, "{model}: cut at the head");
            let (_, reference) = run(false);
            assert_eq!(taped, reference, "{model}");
        }
    }

    /// One SGD step with momentum, nesterov and weight decay equals PyTorch's update rule applied by hand.
    #[test]
    fn sgd_step_follows_pytorch_rule() {
        let exp = experiment(
            "{name: mlp, num_classes: 4, hidden: [8]}",
            "{name: sgd, lr: 0.1, momentum: 0.9, nesterov: true, weight_decay: 0.01}",
        );
        let mut e = CandleEngine::new(&exp).unwrap();
        let before = e.state_dict().unwrap();
        e.forward_backward(&batch(), 1.0).unwrap();
        let grads: BTreeMap<String, Vec<f32>> = e
            .gradients()
            .iter()
            .map(|(k, g)| {
                (
                    k.clone(),
                    g.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                )
            })
            .collect();
        e.optimizer_step(0.1, None, None).unwrap();
        let after = e.state_dict().unwrap();
        for (name, g) in &grads {
            let p0 = &before[name].data;
            for (i, (&p, &gi)) in p0.iter().zip(g).enumerate() {
                // first step: buf = g + wd*p; nesterov: d = (g + wd*p) + 0.9*buf
                let d = (gi + 0.01 * p) * 1.9;
                let want = p - 0.1 * d;
                let got = after[name].data[i];
                assert!(
                    (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                    "{name}[{i}]: {got} vs {want}"
                );
            }
        }
        assert!(after.contains_key("optimizer.layers.0.weight.momentum_buffer"));
    }

    /// The optimizer's state is plain values: a buffer holding the graph of its update kept every step's
    /// update alive through the next (a leak of ~4 parameter-sized tensors per step).
    #[test]
    fn optimizer_state_holds_no_graph() {
        for optim in [
            "{name: sgd, lr: 0.1, momentum: 0.9, nesterov: true, weight_decay: 0.01}",
            "{name: adam, lr: 0.01, weight_decay: 0.01}",
        ] {
            let exp = experiment("{name: mlp, num_classes: 4, hidden: [8]}", optim);
            let mut e = CandleEngine::new(&exp).unwrap();
            for _ in 0..2 {
                e.forward_backward(&batch(), 1.0).unwrap();
                e.optimizer_step(0.1, None, None).unwrap();
            }
            assert!(!e.optimizer.state.is_empty());
            for (name, t) in &e.optimizer.state {
                assert!(!t.track_op(), "{optim}: {name} carries a graph");
            }
        }
    }

    /// The one-pass SGD gives the separate operations' result to the bit, with and without a buffer.
    #[test]
    fn fused_sgd_matches_the_separate_operations() {
        use crate::optim::{OptTensor, SgdStep};
        let p = crate::backend::candle::kernels::cpu::seeded(&[3, 70000], 1, -1.0, 1.0);
        let g = crate::backend::candle::kernels::cpu::seeded(&[3, 70000], 2, -1.0, 1.0);
        let b = crate::backend::candle::kernels::cpu::seeded(&[3, 70000], 3, -1.0, 1.0);
        for nesterov in [false, true] {
            let k = SgdStep {
                lr: 0.1,
                weight_decay: 5e-4,
                momentum: 0.9,
                nesterov,
            };
            for buf in [None, Some(&b)] {
                let (np, nb) = p.sgd_momentum_fused(&g, buf, k).unwrap().unwrap();
                let gw = (&g + p.affine(5e-4, 0.0).unwrap()).unwrap();
                let want_b = match buf {
                    Some(b) => (b.affine(0.9, 0.0).unwrap() + &gw).unwrap(),
                    None => gw.clone(),
                };
                let step = if nesterov {
                    (&gw + want_b.affine(0.9, 0.0).unwrap()).unwrap()
                } else {
                    want_b.clone()
                };
                let want_p = (&p - step.affine(0.1, 0.0).unwrap()).unwrap();
                let bits = |t: &Tensor| {
                    t.flatten_all()
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap()
                        .iter()
                        .map(|v| v.to_bits())
                        .collect::<Vec<_>>()
                };
                assert_eq!(
                    bits(&np),
                    bits(&want_p),
                    "nesterov {nesterov}, buffer {}",
                    buf.is_some()
                );
                assert_eq!(bits(&nb), bits(&want_b));
            }
        }
    }

    /// Fine-tuning: weights from a 10-class model load into a 4-class one; only the head stays fresh.
    #[test]
    fn pretrained_weights_load_and_the_head_is_replaced() {
        let source_exp = experiment_with(
            "{name: resnet18, num_classes: 10, cifar_stem: true}",
            "{name: sgd, lr: 0.1}",
            10,
        );
        let mut source = CandleEngine::new(&source_exp).unwrap();
        source.forward_backward(&batch(), 1.0).unwrap();
        let published: StateDict = source
            .state_dict()
            .unwrap()
            .into_iter()
            .filter(|(k, _)| !k.starts_with("optimizer."))
            .collect();
        let mut target_exp = experiment(
            "{name: resnet18, num_classes: 4, cifar_stem: true}",
            "{name: sgd, lr: 0.1}",
        );
        target_exp.seed = 99;
        let mut target = CandleEngine::new(&target_exp).unwrap();
        let fresh_head = target.state_dict().unwrap()["fc.weight"].clone();
        let kept =
            crate::backend::load_pretrained(&mut target, &published, &["fc".into()]).unwrap();
        assert_eq!(kept, vec!["fc.bias".to_string(), "fc.weight".to_string()]);
        let loaded = target.state_dict().unwrap();
        assert_eq!(
            loaded["layer1.0.conv1.weight"],
            published["layer1.0.conv1.weight"]
        );
        assert_eq!(loaded["bn1.running_mean"], published["bn1.running_mean"]);
        assert_eq!(loaded["fc.weight"], fresh_head);
        // A file for another architecture is refused with what does not fit.
        let mlp = CandleEngine::new(&experiment(
            "{name: mlp, num_classes: 4, hidden: [8]}",
            "{name: sgd, lr: 0.1}",
        ));
        let err = crate::backend::load_pretrained(&mut mlp.unwrap(), &published, &["head".into()])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("layers.0.weight: missing from the file"),
            "{err}"
        );
        assert!(err.contains("tensors the model does not have"), "{err}");
    }

    /// PyTorch's CrossEntropyLoss(label_smoothing=e): mean over rows of (1-e)(lse - z_y) + e(lse - mean z).
    #[test]
    fn label_smoothing_follows_pytorch() {
        let mut exp = experiment_with(
            "{name: mlp, num_classes: 3, hidden: [4]}",
            "{name: sgd, lr: 0.1}",
            3,
        );
        exp.model.label_smoothing = 0.2;
        let e = CandleEngine::new(&exp).unwrap();
        let z = [[1.0f32, 2.0, 0.5], [-1.0, 0.0, 3.0]];
        let y = [1u32, 0];
        let logits = Tensor::new(&z, &Device::Cpu).unwrap();
        let labels = Tensor::new(&y, &Device::Cpu).unwrap();
        let got = e
            .training_loss(&logits, &labels)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap() as f64;
        let want: f64 = z
            .iter()
            .zip(y)
            .map(|(row, label)| {
                let lse = row.iter().map(|v| (*v as f64).exp()).sum::<f64>().ln();
                let mean = row.iter().map(|v| *v as f64).sum::<f64>() / 3.0;
                0.8 * (lse - row[label as usize] as f64) + 0.2 * (lse - mean)
            })
            .sum::<f64>()
            / 2.0;
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    }

    #[test]
    fn state_dict_round_trips_into_a_fresh_engine() {
        let exp = experiment(
            "{name: cnn, num_classes: 4, channels: [4]}",
            "{name: adamw, lr: 0.01}",
        );
        let mut a = CandleEngine::new(&exp).unwrap();
        a.forward_backward(&batch(), 1.0).unwrap();
        a.optimizer_step(0.01, None, Some(GradClip::Norm(1.0)))
            .unwrap();
        let mut b = CandleEngine::new(&exp).unwrap();
        b.load_state_dict(&a.state_dict().unwrap()).unwrap();
        assert_eq!(a.state_dict().unwrap(), b.state_dict().unwrap());
        let (sa, sb) = (a.evaluate(&batch()).unwrap(), b.evaluate(&batch()).unwrap());
        assert_eq!(sa, sb);
    }
}
