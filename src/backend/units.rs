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
//! boundary activations. The backends supply the stage arithmetic (`StagedCompute`); the strategy supplies
//! the collectives (`UnitExchange`); `train_by_unit` is the schedule both share.

use crate::rng::Rng;

/// One named-parameter layout per unit, in forward order.
pub type UnitLayouts = Vec<Vec<(String, Vec<usize>)>>;

/// The stages of a plain stack of numbered blocks (`<block>.0`, `<block>.1`, ...) between a stem with no
/// parameters and a `head`: the small zoo models.
pub fn numbered_stages(block: &str, count: usize, head: &[&str]) -> Vec<Vec<String>> {
    let mut stages = vec![Vec::new()];
    stages.extend((0..count).map(|i| vec![format!("{block}.{i}")]));
    stages.push(head.iter().map(|s| s.to_string()).collect());
    stages
}

/// Does the parameter `name` live under `prefix` (the prefix itself, or `prefix.` followed by more)?
fn under(name: &str, prefix: &str) -> bool {
    name == prefix
        || name
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// Split `params` into the stages' units (each in `params`' order). Every parameter must fall in exactly
/// one stage: anything else is a model description that disagrees with its own forward pass.
pub fn unit_layouts(
    stages: &[Vec<String>],
    params: &[(String, Vec<usize>)],
) -> anyhow::Result<UnitLayouts> {
    let mut units: UnitLayouts = vec![Vec::new(); stages.len()];
    for (name, shape) in params {
        let owners: Vec<usize> = stages
            .iter()
            .enumerate()
            .filter(|(_, prefixes)| prefixes.iter().any(|p| under(name, p)))
            .map(|(i, _)| i)
            .collect();
        match owners[..] {
            [unit] => units[unit].push((name.clone(), shape.clone())),
            [] => anyhow::bail!("FSDP units: parameter '{name}' belongs to no stage of the model"),
            _ => anyhow::bail!("FSDP units: parameter '{name}' belongs to stages {owners:?}"),
        }
    }
    Ok(units)
}

/// What the sharding strategy does for an engine computing unit by unit.
pub trait UnitExchange {
    /// Each unit's parameters (name, shape) in flat order: fixed when the model was sharded.
    fn layouts(&self) -> &UnitLayouts;
    /// The unit's whole parameters, flat in its layout order (FSDP's unshard: an all-gather).
    fn unshard(&mut self, unit: usize) -> anyhow::Result<Vec<f32>>;
    /// The unit's gradient for this rank's batch, flat in layout order, zero where a parameter got none
    /// (FSDP's post-backward reduce-scatter).
    fn reduce(&mut self, unit: usize, grad: Vec<f32>) -> anyhow::Result<()>;
}

/// The stage arithmetic a backend provides; `Act` is its activation tensor.
pub trait StagedCompute {
    type Act;
    /// What the loss stage reports (logits and loss, for the step's statistics).
    type Out;
    fn stage_count(&self) -> usize;
    /// Give a unit's parameters (`layout`) these values (layout order).
    fn install(&mut self, layout: &[(String, Vec<usize>)], flat: &[f32]) -> anyhow::Result<()>;
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
    ) -> anyhow::Result<(Self::Act, Vec<f32>, Self::Out)>;
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
    ) -> anyhow::Result<(Option<Self::Act>, Vec<f32>)>;
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
    anyhow::ensure!(
        layouts.len() == engine.stage_count(),
        "FSDP units: {} parameter groups for a model of {} stages",
        layouts.len(),
        engine.stage_count()
    );
    let last = layouts.len() - 1;
    let mut inputs = vec![input];
    let mut streams = Vec::with_capacity(last);
    for (k, layout) in layouts[..last].iter().enumerate() {
        engine.install(layout, &exchange.unshard(k)?)?;
        streams.push(rng.clone());
        let y = engine.forward(k, &inputs[k], true, rng)?;
        engine.release(layout)?;
        inputs.push(y);
    }
    engine.install(&layouts[last], &exchange.unshard(last)?)?;
    let (mut grad_out, grad, out) =
        engine.backward_loss(&layouts[last], &inputs[last], grad_scale, rng)?;
    engine.release(&layouts[last])?;
    exchange.reduce(last, grad)?;
    for k in (0..last).rev() {
        engine.install(&layouts[k], &exchange.unshard(k)?)?;
        inputs.truncate(k + 1);
        let mut stream = streams[k].clone();
        let (grad_in, grad) =
            engine.backward(k, &layouts[k], &inputs[k], &grad_out, k > 0, &mut stream)?;
        engine.release(&layouts[k])?;
        exchange.reduce(k, grad)?;
        if let Some(g) = grad_in {
            grad_out = g;
        }
    }
    Ok(out)
}

/// An evaluation forward pass, unit by unit: each unit's parameters are gathered, used and freed.
pub fn evaluate_by_unit<E: StagedCompute>(
    engine: &mut E,
    input: E::Act,
    exchange: &mut dyn UnitExchange,
) -> anyhow::Result<E::Act> {
    let layouts = exchange.layouts().clone();
    let mut h = input;
    // Evaluation draws no dropout masks; the stream only fills the signature.
    let mut rng = Rng::new(0);
    for (k, layout) in layouts.iter().enumerate() {
        engine.install(layout, &exchange.unshard(k)?)?;
        h = engine.forward(k, &h, false, &mut rng)?;
        engine.release(layout)?;
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn shapes(names: &[&str]) -> Vec<(String, Vec<usize>)> {
        names.iter().map(|n| (n.to_string(), vec![1])).collect()
    }

    #[test]
    fn parameters_fall_in_the_stage_of_their_prefix() {
        let stages = vec![
            vec!["conv1".to_string(), "bn1".to_string()],
            vec!["layer1.0".to_string()],
            vec!["layer1.1".to_string()],
            vec!["fc".to_string()],
        ];
        let units = unit_layouts(
            &stages,
            &shapes(&[
                "bn1.weight",
                "conv1.weight",
                "fc.bias",
                "layer1.0.conv1.weight",
                "layer1.1.bn2.bias",
            ]),
        )
        .unwrap();
        let names: Vec<Vec<&str>> = units
            .iter()
            .map(|u| u.iter().map(|(n, _)| n.as_str()).collect())
            .collect();
        assert_eq!(
            names,
            vec![
                vec!["bn1.weight", "conv1.weight"],
                vec!["layer1.0.conv1.weight"],
                vec!["layer1.1.bn2.bias"],
                vec!["fc.bias"],
            ]
        );
    }

    #[rstest]
    #[case::orphan(&["head.weight", "stray.weight"], "'stray.weight' belongs to no stage")]
    #[case::prefix_is_not_a_name_prefix(&["blocks.10.w"], "'blocks.10.w' belongs to no stage")]
    fn a_parameter_outside_every_stage_is_an_error(#[case] names: &[&str], #[case] want: &str) {
        let stages = numbered_stages("blocks", 2, &["head"]);
        let e = unit_layouts(&stages, &shapes(names))
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{e}");
    }

    #[test]
    fn numbered_stages_have_an_empty_stem_and_a_head() {
        assert_eq!(
            numbered_stages("layers", 2, &["head"]),
            vec![
                vec![],
                vec!["layers.0".to_string()],
                vec!["layers.1".to_string()],
                vec!["head".to_string()]
            ]
        );
    }
}

/// The schedule against the whole pass, on both backends' engines.
#[cfg(test)]
mod engine_tests {
    use super::{UnitExchange, UnitLayouts};
    use crate::backend::{Engine, HostTensor, StateDict};
    use crate::schema::Backend;
    use rstest::rstest;

    /// One rank's exchange: the whole parameters are at hand; gradients are summed by name.
    struct Whole {
        layouts: UnitLayouts,
        params: StateDict,
        grads: StateDict,
        unshards: usize,
    }

    impl Whole {
        fn of(engine: &mut dyn Engine) -> Whole {
            let whole = Whole {
                layouts: engine.units().unwrap(),
                params: engine.state_dict().unwrap(),
                grads: StateDict::new(),
                unshards: 0,
            };
            engine.release_parameters().unwrap();
            whole
        }
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
            for (name, shape, range) in crate::backend::layout_ranges(&self.layouts[unit]) {
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
        crate::backend::build(&exp).unwrap()
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
    /// micro-batches: for BatchNorm (ResNet), dropout (ViT, MLP, CNN head) and parameterless stems.
    #[rstest]
    #[case::candle(Backend::Candle)]
    #[cfg_attr(feature = "torch", case::tch(Backend::Tch))]
    fn unit_by_unit_equals_the_whole_pass(
        #[case] backend: Backend,
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
        assert!(ex.layouts.len() >= 3, "{} units", ex.layouts.len());
        for seed in [1, 2] {
            let a = whole.forward_backward(&batch(seed), 0.5).unwrap();
            let b = staged
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
        assert_eq!(ex.unshards, 2 * (2 * ex.layouts.len() - 1));
        let layout = whole.parameter_shapes();
        let mut grads = vec![0.0; whole.num_parameters()];
        let missing = whole.take_gradients(&layout, &mut grads).unwrap();
        assert!(missing.is_empty(), "{missing:?}");
        for (name, _, range) in crate::backend::layout_ranges(&layout) {
            let w = worst(&ex.grads[name].data, &grads[range]);
            assert!(w < 1e-4, "{name}: gradient differs by {w:e}");
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
        let b = staged.evaluate_by_unit(&batch(5), &mut ex).unwrap();
        assert_eq!((a.correct1, a.correct5), (b.correct1, b.correct5));
        assert!((a.loss() - b.loss()).abs() < 1e-5);
        assert_eq!(ex.unshards, ex.layouts.len());
    }
}
