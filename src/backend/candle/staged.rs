//! The Candle engine's side of FSDP's unit-by-unit schedule (`backend::units`): one model stage at a
//! time, forward without keeping the stage's graph, backward by running the stage again from its saved
//! input.

use super::models::Buffers;
use super::CandleEngine;
use crate::backend::units::StagedCompute;
use crate::rng::Rng;
use candle_core::{backprop::GradStore, DType, Tensor, Var};

/// The engine with the batch's labels, for the loss stage.
pub struct Staged<'a> {
    pub engine: &'a mut CandleEngine,
    pub labels: Tensor,
}

type Layout = [(String, Vec<usize>)];

impl Staged<'_> {
    /// Stage `k` from `x` as a graph leaf (`None`: the batch, which needs no gradient).
    fn leaf(x: &Tensor, input_grad: bool) -> anyhow::Result<(Tensor, Option<Var>)> {
        if !input_grad {
            return Ok((x.clone(), None));
        }
        let var = Var::from_tensor(x)?;
        Ok((var.as_tensor().clone(), Some(var)))
    }

    /// The unit's parameter gradients, flat in layout order (zero where one got none).
    fn flat_gradient(&self, layout: &Layout, grads: &GradStore) -> anyhow::Result<Vec<f32>> {
        let mut flat = Vec::with_capacity(
            layout
                .iter()
                .map(|(_, s)| s.iter().product::<usize>())
                .sum(),
        );
        for (name, shape) in layout {
            let var = &self.engine.params[name];
            match grads.get(var.as_tensor()) {
                Some(g) => flat.extend(g.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?),
                None => flat.resize(flat.len() + shape.iter().product::<usize>(), 0.0),
            }
        }
        Ok(flat)
    }

    fn input_gradient(x: &Option<Var>, grads: &GradStore) -> anyhow::Result<Option<Tensor>> {
        Ok(match x {
            Some(v) => Some(match grads.get(v.as_tensor()) {
                Some(g) => g.clone(),
                None => v.as_tensor().zeros_like()?,
            }),
            None => None,
        })
    }
}

impl StagedCompute for Staged<'_> {
    type Act = Tensor;
    type Out = (Tensor, Tensor);

    fn stage_count(&self) -> usize {
        self.engine.model.stages().len()
    }

    fn install(&mut self, layout: &Layout, flat: &[f32]) -> anyhow::Result<()> {
        crate::backend::Engine::set_parameters(self.engine, layout, flat)
    }

    fn release(&mut self, layout: &Layout) -> anyhow::Result<()> {
        for (name, _) in layout {
            self.engine.params.insert(
                name.clone(),
                Var::from_slice::<_, f32>(&[], 0, &self.engine.device)?,
            );
            self.engine.grads.remove(name);
        }
        Ok(())
    }

    fn forward(
        &mut self,
        k: usize,
        x: &Tensor,
        train: bool,
        rng: &mut Rng,
    ) -> anyhow::Result<Tensor> {
        let e = &mut *self.engine;
        Ok(e.model
            .forward_stage(k, &e.params, &mut e.buffers, x, train, rng)?
            .detach())
    }

    fn backward_loss(
        &mut self,
        layout: &Layout,
        x: &Tensor,
        grad_scale: f64,
        rng: &mut Rng,
    ) -> anyhow::Result<(Tensor, Vec<f32>, (Tensor, Tensor))> {
        let (input, var) = Self::leaf(x, true)?;
        let e = &mut *self.engine;
        let k = e.model.stages().len() - 1;
        let logits = e
            .model
            .forward_stage(k, &e.params, &mut e.buffers, &input, true, rng)?;
        let loss = e.training_loss(&logits, &self.labels)?;
        let grads = loss.affine(grad_scale, 0.0)?.backward()?;
        let grad_in = Self::input_gradient(&var, &grads)?
            .ok_or_else(|| anyhow::anyhow!("FSDP units: the head's input is not a graph leaf"))?;
        Ok((
            grad_in,
            self.flat_gradient(layout, &grads)?,
            (logits.detach(), loss.detach()),
        ))
    }

    fn backward(
        &mut self,
        k: usize,
        layout: &Layout,
        x: &Tensor,
        grad_out: &Tensor,
        input_grad: bool,
        rng: &mut Rng,
    ) -> anyhow::Result<(Option<Tensor>, Vec<f32>)> {
        let (input, var) = Self::leaf(x, input_grad)?;
        // The forward pass already moved the running statistics: this run's updates are dropped.
        let mut scratch: Buffers = self.engine.buffers.clone();
        let e = &*self.engine;
        let y = e
            .model
            .forward_stage(k, &e.params, &mut scratch, &input, true, rng)?;
        // d(sum(y * g))/dy = g exactly: backpropagates `grad_out` through the stage.
        let g = grad_out.to_dtype(y.dtype())?;
        let grads = (y * g)?.sum_all()?.backward()?;
        Ok((
            Self::input_gradient(&var, &grads)?,
            self.flat_gradient(layout, &grads)?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::candle::CandleEngine;
    use crate::backend::units::{UnitExchange, UnitLayouts};
    use crate::backend::{Engine, StateDict};
    use crate::data::loader::Batch;
    use crate::rng::Rng;
    use rstest::rstest;

    /// One rank's exchange: the whole parameters are at hand; gradients are collected by name.
    struct Whole {
        layouts: UnitLayouts,
        params: StateDict,
        grads: StateDict,
        unshards: usize,
    }

    impl UnitExchange for Whole {
        fn layouts(&self) -> &UnitLayouts {
            &self.layouts
        }
        fn unshard(&mut self, unit: usize) -> anyhow::Result<Vec<f32>> {
            self.unshards += 1;
            Ok(self.layouts[unit]
                .iter()
                .flat_map(|(n, _)| self.params[n].data.clone())
                .collect())
        }
        fn reduce(&mut self, unit: usize, grad: Vec<f32>) -> anyhow::Result<()> {
            let state = crate::backend::layout_ranges(&self.layouts[unit]).map(|(n, s, r)| {
                let t = crate::backend::HostTensor {
                    shape: s.to_vec(),
                    data: grad[r].to_vec(),
                };
                (n.to_string(), t)
            });
            for (name, t) in state {
                match self.grads.get_mut(&name) {
                    Some(prev) => prev.data.iter_mut().zip(&t.data).for_each(|(a, b)| *a += b),
                    None => drop(self.grads.insert(name, t)),
                }
            }
            Ok(())
        }
    }

    fn engine(model: &str) -> CandleEngine {
        let text = format!(
            "task_name: t\nseed: 3\nmodel: {model}\ndata: {{name: synthetic, num_classes: 4, image_size: 8, batch_size: 4}}\n\
             optimizer: {{name: sgd, lr: 0.1}}\nscheduler: {{name: constant}}\n\
             trainer: {{strategy: single, accelerator: cpu, devices: 1, precision: 32, max_epochs: 1}}\n\
             paths: {{root_dir: ., data_dir: d, log_dir: l, output_dir: o}}\n"
        );
        let node = crate::config::yaml::parse(&text, "t.yaml")
            .unwrap()
            .unwrap();
        CandleEngine::new(&crate::schema::extract(&node).unwrap()).unwrap()
    }

    fn batch(seed: u64) -> Batch {
        let mut rng = Rng::new(seed);
        Batch {
            images: (0..4 * 3 * 8 * 8).map(|_| rng.normal() as f32).collect(),
            labels: vec![0, 1, 2, 3],
            channels: 3,
            height: 8,
            width: 8,
        }
    }

    fn worst(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs() / y.abs().max(1e-3))
            .fold(0.0, f32::max)
    }

    /// Unit by unit (recomputing each stage in the backward pass) gives the gradients, logits and
    /// BatchNorm running statistics of one whole forward and backward, over two accumulated
    /// micro-batches: for BatchNorm (ResNet), dropout (ViT, MLP, CNN head) and parameterless stems.
    #[rstest]
    #[case::resnet("{name: resnet18, num_classes: 4, cifar_stem: true}")]
    #[case::vit_with_dropout(
        "{name: vit, variant: tiny, patch_size: 4, num_classes: 4, dropout: 0.2}"
    )]
    #[case::mlp_with_dropout("{name: mlp, num_classes: 4, hidden: [16, 8], dropout: 0.3}")]
    #[case::cnn_with_dropout("{name: cnn, num_classes: 4, channels: [4, 8], dropout: 0.5}")]
    fn unit_by_unit_equals_the_whole_pass(#[case] model: &str) {
        let (mut whole, mut staged) = (engine(model), engine(model));
        let layouts = staged.units().unwrap();
        assert!(layouts.len() >= 3, "{} units", layouts.len());
        let mut ex = Whole {
            layouts,
            params: staged.state_dict().unwrap(),
            grads: StateDict::new(),
            unshards: 0,
        };
        staged.release_parameters().unwrap();
        for seed in [1, 2] {
            let a = whole.forward_backward(&batch(seed), 0.5).unwrap();
            let b = staged
                .forward_backward_by_unit(&batch(seed), 0.5, &mut ex)
                .unwrap();
            assert_eq!((a.correct1, a.count), (b.correct1, b.count));
            assert!(
                (a.loss() - b.loss()).abs() < 1e-6,
                "{} vs {}",
                a.loss(),
                b.loss()
            );
        }
        // Each unit gathered twice per step (forward, backward) except the head, gathered once.
        assert_eq!(ex.unshards, 2 * (2 * ex.layouts.len() - 1));
        for (name, g) in whole.gradients() {
            let g = g.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let w = worst(&ex.grads[name].data, &g);
            assert!(w < 1e-5, "{name}: gradient differs by {w:e}");
        }
        assert_eq!(ex.grads.len(), whole.gradients().len());
        // Buffers moved once per micro-batch, as in the whole pass.
        let (sa, sb) = (whole.state_dict().unwrap(), staged.state_dict().unwrap());
        for (name, t) in sa
            .iter()
            .filter(|(k, _)| k.contains("running") || k.contains("tracked"))
        {
            let w = worst(&sb[name].data, &t.data);
            assert!(w < 1e-6, "{name}: buffer differs by {w:e}");
        }
        // Between units the engine holds no whole parameter.
        assert!(staged.parameter_shapes().iter().all(|(_, s)| s == &[0]));
    }

    /// Evaluation unit by unit gives the whole pass's predictions.
    #[test]
    fn evaluation_unit_by_unit_equals_the_whole_pass() {
        let model = "{name: resnet18, num_classes: 4, cifar_stem: true}";
        let (mut whole, mut staged) = (engine(model), engine(model));
        whole.forward_backward(&batch(1), 1.0).unwrap();
        staged.forward_backward(&batch(1), 1.0).unwrap();
        let mut ex = Whole {
            layouts: staged.units().unwrap(),
            params: staged.state_dict().unwrap(),
            grads: StateDict::new(),
            unshards: 0,
        };
        staged.release_parameters().unwrap();
        let a = whole.evaluate(&batch(5)).unwrap();
        let b = staged.evaluate_by_unit(&batch(5), &mut ex).unwrap();
        assert_eq!((a.correct1, a.correct5), (b.correct1, b.correct5));
        assert!((a.loss() - b.loss()).abs() < 1e-6);
        assert_eq!(ex.unshards, ex.layouts.len());
    }
}
