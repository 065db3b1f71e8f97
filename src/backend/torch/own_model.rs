//! A registered model on libtorch (`registry::TchModel`: a crate's tch model, or a TorchScript module):
//! built on the engine's device, checked with one forward pass before any step (a module that rejects
//! the data's shape, or gives logits of the wrong size, stops the run with the reason), then run by the
//! engine in place of the zoo's forward pass. Its tensors are the engine's parameters and buffers: the
//! same tensors, so the optimizer's in-place step, `.grad`, DDP's reducer and checkpoint loads all reach
//! what the model computes with.

use super::amp;
use crate::model::registered::Registered;
use crate::registry::TchModel;
use crate::schema::Experiment;
use tch::{Device, Kind, Tensor};

/// The built model and what the engine needs to feed it.
pub(super) struct OwnModel {
    model: Box<dyn TchModel>,
    /// One sample's shape (the loader hands registered data's samples over flattened).
    input_shape: Vec<i64>,
    target: String,
}

/// The tensors a model holds, by name: (parameters in definition order, buffers).
pub(super) type Tensors = (Vec<(String, Tensor)>, Vec<(String, Tensor)>);

impl OwnModel {
    /// Build `m` on `device` from the run's seed (libtorch's initialisation, on the CPU first: every rank
    /// draws the same values) and check it on two samples.
    pub fn build(
        m: &Registered,
        exp: &Experiment,
        device: Device,
        mode: amp::Mode,
        sync_batchnorm: bool,
    ) -> anyhow::Result<(OwnModel, Tensors)> {
        let entry = crate::registry::tch_model(&m.target).ok_or_else(|| {
            anyhow::anyhow!(
                "model _target_ {} is a Candle model (register_candle_model!): register its tch version \
                 under the same _target_ with register_tch_model!, or use backend=candle",
                m.target
            )
        })?;
        anyhow::ensure!(
            mode.storage() == Kind::Float,
            "trainer.precision={} with model _target_ {}: trainyard does not cast a registered model's own \
             tensors; use 16-mixed or bf16-mixed (autocast), or 32-true",
            serde_json::to_value(exp.trainer.precision)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default(),
            m.target
        );
        anyhow::ensure!(
            !sync_batchnorm,
            "trainer.sync_batchnorm=true with model _target_ {}: trainyard cannot swap the BatchNorm layers \
             inside a registered model; convert them where the model is written \
             (nn.SyncBatchNorm.convert_sync_batchnorm before export), or set trainer.sync_batchnorm=false",
            m.target
        );
        tch::manual_seed(exp.seed as i64);
        let model = (entry.build)(&m.args, device, &m.ctx)?;
        if let (true, Some(loss)) = (model.wants_targets(), &exp.loss) {
            anyhow::bail!(
                "model _target_ {} computes its own loss (model.loss is set) and loss: _target_ {} is set \
                 too: keep one (~loss, or model.loss=null)",
                m.target,
                loss.spec.target
            );
        }
        if exp.model.label_smoothing != 0.0 && model.wants_targets() {
            anyhow::bail!(
                "model.label_smoothing={} with model _target_ {}: the model computes its own loss \
                 (model.loss), so trainyard's smoothing would not reach it; smooth inside the model, or \
                 set model.label_smoothing=0",
                exp.model.label_smoothing,
                m.target
            );
        }
        // Frozen tensors (`requires_grad=False` in PyTorch) are kept and saved, not trained; a tensor
        // shared under two names (tied weights) is trained once, under its first name.
        let (mut params, mut buffers) = (Vec::new(), model.buffers()?);
        let mut seen = std::collections::HashSet::new();
        for (name, t) in model.parameters()? {
            if t.numel() > 0 && !seen.insert(t.data_ptr() as usize) {
                continue;
            }
            match t.requires_grad() {
                true => params.push((name, t)),
                false => buffers.push((name, t)),
            }
        }
        let mut own = OwnModel {
            model,
            input_shape: m.ctx.input_shape.iter().map(|&d| d as i64).collect(),
            target: m.target.clone(),
        };
        own.check(exp, device)?;
        Ok((own, (params, buffers)))
    }

    /// One evaluation-mode pass over two zero samples: the model takes the data's shape and gives logits
    /// the run can train on.
    fn check(&mut self, exp: &Experiment, device: Device) -> anyhow::Result<()> {
        let shape: Vec<i64> = std::iter::once(2).chain(self.input_shape.clone()).collect();
        let x = Tensor::f_zeros(&shape, (Kind::Float, device))?;
        let y = match exp
            .data
            .registered
            .as_ref()
            .and_then(|d| d.target_shape.clone())
        {
            Some(t) => {
                let dims: Vec<i64> = std::iter::once(2)
                    .chain(t.iter().map(|&d| d as i64))
                    .collect();
                Tensor::f_zeros(&dims, (Kind::Float, device))?
            }
            None => Tensor::f_zeros([2], (Kind::Int64, device))?,
        };
        let out = tch::no_grad(|| self.forward(&x, Some(&y), None))?;
        let logits = out.0.size();
        let classes = exp.model.num_classes as i64;
        anyhow::ensure!(
            exp.loss.is_some() || logits == [2, classes],
            "model _target_ {}: forward gives logits of shape {logits:?} for inputs {shape:?}; \
             classification needs [N, {classes}] (model.num_classes={classes})",
            self.target
        );
        Ok(())
    }

    /// The logits and, when the model computes one from the targets `y`, its own loss (else `None`).
    /// A training pass first seeds libtorch's generators from `seed` (the run's seed and the engine's
    /// count of training passes, which checkpoints keep), so the model's own dropout draws the same masks
    /// after a resume.
    pub fn forward(
        &mut self,
        x: &Tensor,
        y: Option<&Tensor>,
        train: Option<u64>,
    ) -> anyhow::Result<(Tensor, Option<Tensor>)> {
        if let Some(seed) = train {
            tch::manual_seed((seed & (i64::MAX as u64)) as i64);
        }
        let train = train.is_some();
        let n = x.size().first().copied().unwrap_or(0);
        let dims: Vec<i64> = std::iter::once(n).chain(self.input_shape.clone()).collect();
        let x = match x.size() == dims {
            true => x.shallow_clone(),
            false => x.f_reshape(&dims)?,
        };
        let targets = y.filter(|_| self.model.wants_targets());
        let out = self.model.forward(&x, targets, train)?;
        Ok((out.logits, out.loss))
    }
}
