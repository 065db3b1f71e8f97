//! FSDP units: a model's forward pass cut into stages (stem, each residual or transformer block, head),
//! each owning the parameters under its name prefixes, as PyTorch FSDP's `auto_wrap_policy` wraps each
//! block. `FULL_SHARD` holds one unit's whole parameters at a time:
//! - forward: for each unit, gather its parameters, run it without keeping a graph (only the unit's input
//!   is kept), free them;
//! - backward, last unit first: gather again, run the unit once more with a graph (the same dropout masks,
//!   BatchNorm statistics left alone), backpropagate the gradient of its output, hand the unit's gradient
//!   to the strategy (reduce-scatter) and free parameters and gradient.
//!
//! That is FSDP's communication (two all-gathers and one reduce-scatter per unit per step) with activation
//! checkpointing at unit boundaries: peak memory is one unit's parameters and gradients plus the
//! boundary activations. A unit is one stage unless `trainer.fsdp.min_num_params` groups consecutive
//! stages (`group_stages`, PyTorch's size-based wrap policy): fewer, larger units, so fewer collectives
//! and more parameters whole at once. The backends supply the stage arithmetic (`StagedCompute`); the strategy supplies
//! the collectives (`UnitExchange`); `train_by_unit` is the schedule both share.

use crate::model::stages::{unit_layout, StageLayouts};
use crate::platform::rng::Rng;
use crate::tensor::{Flat, FlatHome};

/// What the sharding strategy does for an engine computing unit by unit.
pub trait UnitExchange {
    /// Each stage's parameters (name, shape) in flat order: fixed when the model was sharded.
    fn layouts(&self) -> &StageLayouts;
    /// The stages each unit spans, in forward order (one each unless a wrap policy grouped them).
    fn units(&self) -> &[std::ops::Range<usize>];
    /// The unit's whole parameters, flat in its layout order (`unit_layout`; FSDP's unshard: an
    /// all-gather).
    fn unshard(&mut self, unit: usize) -> anyhow::Result<Flat>;
    /// The unit's gradient for this rank's batch, flat in layout order, zero where a parameter got none
    /// (FSDP's post-backward reduce-scatter).
    fn reduce(&mut self, unit: usize, grad: Flat) -> anyhow::Result<()>;
}

/// The stage arithmetic a backend provides; `Act` is its activation tensor.
pub trait StagedCompute {
    type Act;
    /// What the loss stage reports (logits and loss, for the step's statistics).
    type Out;
    fn stage_count(&self) -> usize;
    /// Where the engine's flat gradients live (`Sharding::flat_home`).
    fn home(&self) -> FlatHome;
    /// Give a unit's parameters (`layout`) these values (layout order).
    fn install(&mut self, layout: &[(String, Vec<usize>)], flat: &Flat) -> anyhow::Result<()>;
    /// Free a unit's parameters and gradients.
    fn release(&mut self, layout: &[(String, Vec<usize>)]) -> anyhow::Result<()>;
    /// Run stage `k` without keeping a graph, updating buffers (BatchNorm running statistics) as a
    /// training (`train`) or evaluation forward pass would.
    fn forward(
        &mut self,
        k: usize,
        x: &Self::Act,
        train: bool,
        rng: &mut Rng,
    ) -> anyhow::Result<Self::Act>;
    /// Run the last stage in training mode with a graph from `x`, compute the loss (scaled by
    /// `grad_scale`) and backpropagate it. Returns the gradient of `x`, the unit's flat parameter gradient
    /// and the stage's output.
    fn backward_loss(
        &mut self,
        layout: &[(String, Vec<usize>)],
        x: &Self::Act,
        grad_scale: f64,
        rng: &mut Rng,
    ) -> anyhow::Result<(Self::Act, Flat, Self::Out)>;
    /// Run stage `k` again in training mode with a graph from `x`, leaving buffers as they are (the
    /// forward pass already updated them), and backpropagate `grad_out`, the gradient of its output.
    /// Returns the gradient of `x` when `input_grad` (the first stage's input is the batch: none needed)
    /// and the unit's flat parameter gradient.
    fn backward(
        &mut self,
        k: usize,
        layout: &[(String, Vec<usize>)],
        x: &Self::Act,
        grad_out: &Self::Act,
        input_grad: bool,
        rng: &mut Rng,
    ) -> anyhow::Result<(Option<Self::Act>, Flat)>;
}

/// One training forward and backward, unit by unit (see the module doc). Dropout masks match the
/// monolithic forward pass: each stage replays the random stream from where it stood when the stage
/// first ran.
pub fn train_by_unit<E: StagedCompute>(
    engine: &mut E,
    input: E::Act,
    grad_scale: f64,
    exchange: &mut dyn UnitExchange,
    rng: &mut Rng,
) -> anyhow::Result<E::Out> {
    let layouts = exchange.layouts().clone();
    let units = checked_units(exchange, engine.stage_count())?;
    let last = layouts.len() - 1;
    let last_unit = units.len() - 1;
    let mut inputs = vec![input];
    let mut streams = Vec::with_capacity(last);
    // Forward: every stage but the loss stage, without a graph, one unit installed at a time.
    for (u, stages) in units.iter().enumerate().take(last_unit) {
        let layout = unit_layout(&layouts, stages.clone());
        engine.install(&layout, &exchange.unshard(u)?)?;
        for k in stages.clone() {
            streams.push(rng.clone());
            let y = engine.forward(k, &inputs[k], true, rng)?;
            inputs.push(y);
        }
        engine.release(&layout)?;
    }
    // The last unit runs its leading stages, the loss and its backward pass in one installation.
    let stages = units[last_unit].clone();
    let layout = unit_layout(&layouts, stages.clone());
    engine.install(&layout, &exchange.unshard(last_unit)?)?;
    for k in stages.start..last {
        streams.push(rng.clone());
        let y = engine.forward(k, &inputs[k], true, rng)?;
        inputs.push(y);
    }
    let (mut grad_out, loss_grad, out) =
        engine.backward_loss(&layouts[last], &inputs[last], grad_scale, rng)?;
    let grad = backward_through(
        engine,
        &layouts,
        &mut inputs,
        &streams,
        stages.start..last,
        &mut grad_out,
    )?;
    let grad = Flat::concat(vec![grad, loss_grad], engine.home())?;
    engine.release(&layout)?;
    exchange.reduce(last_unit, grad)?;
    // Backward through the other units, last first: gather, recompute with a graph, reduce, free.
    for (u, stages) in units.iter().enumerate().take(last_unit).rev() {
        let layout = unit_layout(&layouts, stages.clone());
        engine.install(&layout, &exchange.unshard(u)?)?;
        let grad = backward_through(
            engine,
            &layouts,
            &mut inputs,
            &streams,
            stages.clone(),
            &mut grad_out,
        )?;
        engine.release(&layout)?;
        exchange.reduce(u, grad)?;
    }
    Ok(out)
}

/// Backpropagate `grad_out` through `stages` (installed), last first: each is recomputed with a graph
/// from its saved input and random stream, its input freed after. Leaves in `grad_out` the gradient of
/// the first stage's input (when that stage is not the model's first) and returns the stages' flat
/// parameter gradients in stage order.
fn backward_through<E: StagedCompute>(
    engine: &mut E,
    layouts: &StageLayouts,
    inputs: &mut Vec<E::Act>,
    streams: &[Rng],
    stages: std::ops::Range<usize>,
    grad_out: &mut E::Act,
) -> anyhow::Result<Flat> {
    let mut grads = Vec::with_capacity(stages.len());
    for k in stages.rev() {
        inputs.truncate(k + 1);
        let mut stream = streams[k].clone();
        let (grad_in, grad) =
            engine.backward(k, &layouts[k], &inputs[k], grad_out, k > 0, &mut stream)?;
        grads.push(grad);
        if let Some(g) = grad_in {
            *grad_out = g;
        }
    }
    grads.reverse();
    Flat::concat(grads, engine.home())
}

/// The exchange's units, checked to cover the model's stages in order, each at least one stage.
fn checked_units(
    exchange: &dyn UnitExchange,
    stage_count: usize,
) -> anyhow::Result<Vec<std::ops::Range<usize>>> {
    let layouts = exchange.layouts();
    anyhow::ensure!(
        layouts.len() == stage_count && stage_count > 0,
        "FSDP units: {} parameter groups for a model of {stage_count} stages",
        layouts.len()
    );
    let units = exchange.units().to_vec();
    let contiguous = units.first().is_some_and(|u| u.start == 0)
        && units.last().is_some_and(|u| u.end == stage_count)
        && units.windows(2).all(|w| w[0].end == w[1].start)
        && units.iter().all(|u| !u.is_empty());
    anyhow::ensure!(
        contiguous,
        "FSDP units {units:?} do not cover the model's {stage_count} stages in order"
    );
    Ok(units)
}

/// An evaluation forward pass, unit by unit: each unit's parameters are gathered, used and freed.
pub fn evaluate_by_unit<E: StagedCompute>(
    engine: &mut E,
    input: E::Act,
    exchange: &mut dyn UnitExchange,
) -> anyhow::Result<E::Act> {
    let layouts = exchange.layouts().clone();
    let units = checked_units(exchange, engine.stage_count())?;
    let mut h = input;
    // Evaluation draws no dropout masks; the stream only fills the signature.
    let mut rng = Rng::new(0);
    for (u, stages) in units.into_iter().enumerate() {
        let layout = unit_layout(&layouts, stages.clone());
        engine.install(&layout, &exchange.unshard(u)?)?;
        for k in stages {
            h = engine.forward(k, &h, false, &mut rng)?;
        }
        engine.release(&layout)?;
    }
    Ok(h)
}

/// The schedule against the whole pass, on both backends' engines.
#[cfg(test)]
mod engine_tests {
    use super::{Flat, FlatHome, StageLayouts, UnitExchange};
    use crate::backend::{Engine, Placement};
    use crate::model::stages::{group_stages, unit_layout};
    use crate::schema::Backend;
    use crate::tensor::{HostTensor, StateDict};
    use rstest::rstest;

    /// One rank's exchange: the whole parameters are at hand; gradients are summed by name.
    struct Whole {
        layouts: StageLayouts,
        units: Vec<std::ops::Range<usize>>,
        params: StateDict,
        grads: StateDict,
        unshards: usize,
        /// Where the engine wants its flat vectors: gathered parameters come from there, gradients
        /// must arrive from there.
        home: FlatHome,
    }

    impl Whole {
        fn of(engine: &mut dyn Engine) -> Whole {
            let params = engine.state_dict().unwrap();
            let sharding = engine.sharding().unwrap();
            let layouts = sharding.stage_layouts().unwrap();
            let whole = Whole {
                units: group_stages(&layouts, None),
                layouts,
                params,
                grads: StateDict::new(),
                unshards: 0,
                home: sharding.flat_home(),
            };
            sharding.release_parameters().unwrap();
            whole
        }
    }

    impl UnitExchange for Whole {
        fn layouts(&self) -> &StageLayouts {
            &self.layouts
        }
        fn units(&self) -> &[std::ops::Range<usize>] {
            &self.units
        }
        fn unshard(&mut self, unit: usize) -> anyhow::Result<Flat> {
            self.unshards += 1;
            self.home.place(
                unit_layout(&self.layouts, self.units[unit].clone())
                    .iter()
                    .flat_map(|(n, _)| self.params[n].data.clone())
                    .collect(),
            )
        }
        fn reduce(&mut self, unit: usize, grad: Flat) -> anyhow::Result<()> {
            assert_eq!(
                grad.home(),
                self.home,
                "a gradient away from the engine's home"
            );
            let grad = grad.to_vec()?;
            let layout = unit_layout(&self.layouts, self.units[unit].clone());
            for (name, shape, range) in crate::tensor::layout_ranges(&layout) {
                let t = self.grads.entry(name.to_string()).or_insert(HostTensor {
                    shape: shape.to_vec(),
                    data: vec![0.0; range.len()],
                });
                t.data
                    .iter_mut()
                    .zip(&grad[range])
                    .for_each(|(a, b)| *a += b);
            }
            Ok(())
        }
    }

    fn engine(backend: Backend, model: &str) -> Box<dyn Engine> {
        let mut exp = crate::testing::experiment(
            model,
            "{name: sgd, lr: 0.1}",
            "{strategy: single, devices: 1}",
            4,
        );
        exp.backend = backend;
        crate::backend::build(&exp, &Placement::single()).unwrap()
    }

    use crate::testing::batch;

    fn worst(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs() / y.abs().max(1e-3))
            .fold(0.0, f32::max)
    }

    /// Unit by unit (recomputing each stage in the backward pass) gives the gradients, loss and
    /// BatchNorm running statistics of one whole forward and backward, over two accumulated
    /// micro-batches: for BatchNorm (ResNet), dropout (ViT, MLP, CNN head) and parameterless stems; with
    /// one stage per unit and with stages grouped by the size-based wrap policy.
    #[rstest]
    #[case::candle(Backend::Candle)]
    #[cfg_attr(feature = "torch", case::tch(Backend::Tch))]
    fn unit_by_unit_equals_the_whole_pass(
        #[case] backend: Backend,
        #[values(None, Some(3000))] min_num_params: Option<usize>,
        #[values(
            "{name: resnet18, num_classes: 4, cifar_stem: true}",
            "{name: vit, variant: tiny, patch_size: 4, num_classes: 4, dropout: 0.2}",
            "{name: mlp, num_classes: 4, hidden: [16, 8], dropout: 0.3}",
            "{name: cnn, num_classes: 4, channels: [4, 8], dropout: 0.5}"
        )]
        model: &str,
    ) {
        let (mut whole, mut staged) = (engine(backend, model), engine(backend, model));
        let mut ex = Whole::of(staged.as_mut());
        assert!(ex.layouts.len() >= 3, "{} stages", ex.layouts.len());
        ex.units = group_stages(&ex.layouts, min_num_params);
        if min_num_params.is_some() {
            assert!(
                ex.units.len() < ex.layouts.len() && ex.units.iter().any(|u| u.len() > 1),
                "grouped: {:?}",
                ex.units
            );
        }
        for seed in [1, 2] {
            let a = whole.forward_backward(&batch(seed), 0.5).unwrap();
            let b = staged
                .sharding()
                .unwrap()
                .forward_backward_by_unit(&batch(seed), 0.5, &mut ex)
                .unwrap();
            assert_eq!((a.correct1, a.count), (b.correct1, b.count));
            assert!(
                (a.loss() - b.loss()).abs() < 1e-5,
                "{} vs {}",
                a.loss(),
                b.loss()
            );
        }
        // Each unit gathered twice per step (forward, backward) except the head, gathered once.
        assert_eq!(ex.unshards, 2 * (2 * ex.units.len() - 1));
        let grads = whole.take_gradients().unwrap();
        assert!(grads.missing().is_empty(), "{:?}", grads.missing());
        for g in &grads.entries {
            let value = g.value.as_ref().unwrap().to_vec().unwrap();
            let w = worst(&ex.grads[&g.name].data, &value);
            assert!(w < 1e-4, "{}: gradient differs by {w:e}", g.name);
        }
        // Buffers moved once per micro-batch, as in the whole pass.
        let (sa, sb) = (whole.state_dict().unwrap(), staged.state_dict().unwrap());
        let buffers = sa
            .iter()
            .filter(|(k, _)| k.contains("running") || k.contains("tracked"));
        for (name, t) in buffers {
            let w = worst(&sb[name].data, &t.data);
            assert!(w < 1e-5, "{name}: buffer differs by {w:e}");
        }
        // Between units the engine holds no whole parameter.
        assert!(staged.parameter_shapes().iter().all(|(_, s)| s == &[0]));
    }

    /// Evaluation unit by unit gives the whole pass's predictions.
    #[rstest]
    #[case::candle(Backend::Candle)]
    #[cfg_attr(feature = "torch", case::tch(Backend::Tch))]
    fn evaluation_unit_by_unit_equals_the_whole_pass(#[case] backend: Backend) {
        let model = "{name: resnet18, num_classes: 4, cifar_stem: true}";
        let (mut whole, mut staged) = (engine(backend, model), engine(backend, model));
        whole.forward_backward(&batch(1), 1.0).unwrap();
        staged.forward_backward(&batch(1), 1.0).unwrap();
        let mut ex = Whole::of(staged.as_mut());
        let a = whole.evaluate(&batch(5)).unwrap();
        let b = staged
            .sharding()
            .unwrap()
            .evaluate_by_unit(&batch(5), &mut ex)
            .unwrap();
        assert_eq!((a.correct1, a.correct5), (b.correct1, b.correct5));
        assert!((a.loss() - b.loss()).abs() < 1e-5);
        assert_eq!(ex.unshards, ex.layouts.len());
    }
}
