//! The Candle engine (CPU by default; CUDA behind the `cuda` feature): parameters as Candle variables,
//! gradients accumulated across micro-batches, and PyTorch-equivalent SGD / Adam / AdamW updates.

pub mod models;

use super::{init, topk_hits, Engine, HostTensor, StateDict, StepStats};
use crate::data::loader::Batch;
use crate::rng::Rng;
use crate::schema::{Experiment, OptimizerConfig, OptimizerName};
use anyhow::Context;
use candle_core::{DType, Device, Tensor, Var};
use models::{CandleModel, Params};
use std::collections::BTreeMap;

pub struct CandleEngine {
    device: Device,
    model: Box<dyn CandleModel>,
    params: Params,
    grads: BTreeMap<String, Tensor>,
    optimizer: OptimizerConfig,
    /// `<param>.momentum_buffer`, `<param>.exp_avg`, `<param>.exp_avg_sq`
    opt_state: BTreeMap<String, Tensor>,
    opt_steps: u64,
    classes: usize,
    seed: u64,
    forward_calls: u64,
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
    pub fn new(exp: &Experiment) -> anyhow::Result<Self> {
        let device = Device::Cpu;
        let model = models::build(&exp.model, exp.data.channels, exp.data.image_size)?;
        let mut params = Params::new();
        for spec in model.specs() {
            let host = init::pytorch_default(&spec.shape, spec.fan_in, exp.seed, &spec.name);
            params.insert(
                spec.name.clone(),
                Var::from_tensor(&to_candle(&host, &device)?)?,
            );
        }
        Ok(CandleEngine {
            device,
            model,
            params,
            grads: BTreeMap::new(),
            optimizer: exp.optimizer.clone(),
            opt_state: BTreeMap::new(),
            opt_steps: 0,
            classes: exp.model.num_classes,
            seed: exp.seed,
            forward_calls: 0,
        })
    }

    fn inputs(&self, batch: &Batch) -> anyhow::Result<(Tensor, Tensor)> {
        let x = Tensor::from_slice(
            &batch.images,
            (batch.len(), batch.channels, batch.height, batch.width),
            &self.device,
        )?;
        let y = Tensor::from_slice(&batch.labels, batch.len(), &self.device)?;
        Ok((x, y))
    }

    fn stats(&self, logits: &Tensor, loss: &Tensor, batch: &Batch) -> anyhow::Result<StepStats> {
        let flat = logits.flatten_all()?.to_vec1::<f32>()?;
        let (c1, c5) = topk_hits(&flat, self.classes, &batch.labels);
        Ok(StepStats {
            loss_sum: loss.to_scalar::<f32>()? as f64 * batch.len() as f64,
            correct1: c1,
            correct5: c5,
            count: batch.len() as u64,
        })
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
        let p = var.as_tensor();
        let o = &self.optimizer;
        let new = match o.name {
            OptimizerName::Sgd => {
                let mut g = grad.clone();
                if o.weight_decay != 0.0 {
                    g = (g + p.affine(o.weight_decay, 0.0)?)?;
                }
                let m = momentum.filter(|_| o.momentum != 0.0).unwrap_or(o.momentum);
                if m != 0.0 {
                    let key = format!("{name}.momentum_buffer");
                    let buf = match self.opt_state.get(&key) {
                        Some(b) => (b.affine(m, 0.0)? + &g)?,
                        None => g.clone(),
                    };
                    g = if o.nesterov {
                        (g + buf.affine(m, 0.0)?)?
                    } else {
                        buf.clone()
                    };
                    self.opt_state.insert(key, buf);
                }
                (p - g.affine(lr, 0.0)?)?
            }
            OptimizerName::Adam | OptimizerName::Adamw => {
                let (b1, b2) = (o.betas[0], o.betas[1]);
                let t = self.opt_steps as i32 + 1;
                let mut g = grad.clone();
                let mut p = p.clone();
                if o.weight_decay != 0.0 {
                    if o.name == OptimizerName::Adamw {
                        p = p.affine(1.0 - lr * o.weight_decay, 0.0)?;
                    } else {
                        g = (g + p.affine(o.weight_decay, 0.0)?)?;
                    }
                }
                let (km, kv) = (format!("{name}.exp_avg"), format!("{name}.exp_avg_sq"));
                let m = match self.opt_state.get(&km) {
                    Some(m) => (m.affine(b1, 0.0)? + g.affine(1.0 - b1, 0.0)?)?,
                    None => g.affine(1.0 - b1, 0.0)?,
                };
                let v = match self.opt_state.get(&kv) {
                    Some(v) => (v.affine(b2, 0.0)? + g.sqr()?.affine(1.0 - b2, 0.0)?)?,
                    None => g.sqr()?.affine(1.0 - b2, 0.0)?,
                };
                let bc1 = 1.0 - b1.powi(t);
                let bc2 = 1.0 - b2.powi(t);
                // PyTorch: p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)
                let denom = v.affine(1.0 / bc2, 0.0)?.sqrt()?.affine(1.0, o.eps)?;
                let step = m.div(&denom)?.affine(lr / bc1, 0.0)?;
                self.opt_state.insert(km, m);
                self.opt_state.insert(kv, v);
                (p - step)?
            }
        };
        var.set(&new)?;
        Ok(())
    }
}

impl Engine for CandleEngine {
    fn forward_backward(&mut self, batch: &Batch, grad_scale: f64) -> anyhow::Result<StepStats> {
        let (x, y) = self.inputs(batch)?;
        let mut rng = Rng::keyed(&[self.seed, 0xD0_0D, self.forward_calls]);
        self.forward_calls += 1;
        let logits = self.model.forward(&self.params, &x, true, &mut rng)?;
        let loss = candle_nn::loss::cross_entropy(&logits, &y)?;
        let grads = loss.affine(grad_scale, 0.0)?.backward()?;
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
        self.stats(&logits, &loss, batch)
    }

    fn optimizer_step(
        &mut self,
        lr: f64,
        momentum: Option<f64>,
        clip_norm: Option<f64>,
    ) -> anyhow::Result<f64> {
        let mut sq = 0.0f64;
        for g in self.grads.values() {
            sq += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
        }
        let norm = sq.sqrt();
        let scale = match clip_norm {
            Some(max) if norm > max => max / (norm + 1e-6),
            _ => 1.0,
        };
        let grads = std::mem::take(&mut self.grads);
        for (name, g) in grads {
            let g = if scale != 1.0 {
                g.affine(scale, 0.0)?
            } else {
                g
            };
            self.update(&name, &g, lr, momentum)?;
        }
        self.opt_steps += 1;
        Ok(norm)
    }

    fn evaluate(&mut self, batch: &Batch) -> anyhow::Result<StepStats> {
        let (x, y) = self.inputs(batch)?;
        let mut rng = Rng::new(0);
        let logits = self
            .model
            .forward(&self.params, &x, false, &mut rng)?
            .detach();
        let loss = candle_nn::loss::cross_entropy(&logits, &y)?;
        self.stats(&logits, &loss, batch)
    }

    fn state_dict(&self) -> anyhow::Result<StateDict> {
        let mut out = StateDict::new();
        for (name, var) in &self.params {
            out.insert(name.clone(), to_host(var.as_tensor())?);
        }
        for (key, t) in &self.opt_state {
            out.insert(format!("optimizer.{key}"), to_host(t)?);
        }
        out.insert(
            "optimizer.step".into(),
            HostTensor {
                shape: vec![1],
                data: vec![self.opt_steps as f32],
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
        self.opt_state.clear();
        for (key, t) in state {
            if let Some(rest) = key.strip_prefix("optimizer.") {
                match rest {
                    "step" => self.opt_steps = t.data.first().copied().unwrap_or(0.0) as u64,
                    "forward_calls" => {
                        self.forward_calls = t.data.first().copied().unwrap_or(0.0) as u64
                    }
                    _ => {
                        self.opt_state
                            .insert(rest.to_string(), to_candle(t, &self.device)?);
                    }
                }
            }
        }
        Ok(())
    }

    fn num_parameters(&self) -> usize {
        self.params.values().map(|v| v.elem_count()).sum()
    }
}
