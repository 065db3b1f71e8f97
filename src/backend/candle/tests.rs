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

/// A declared network whose convolutions have biases, on the blocked path from its first layer: one
/// with ReLU and pooling after it, one with ReLU, one with neither.
const DECLARED_CONV_BIAS: &str = "{name: declared, num_classes: 4, layers: [\
    {type: Conv2d, out_channels: 16, kernel_size: 3, padding: 1}, {type: ReLU}, \
    {type: MaxPool2d, kernel_size: 2}, \
    {type: Conv2d, out_channels: 24, kernel_size: 3, padding: 1}, {type: ReLU}, \
    {type: Conv2d, out_channels: 8, kernel_size: 1}, \
    {type: AdaptiveAvgPool2d, output_size: 1}, {type: Flatten}, {type: Linear, out_features: 4}]}";

/// Under bf16 autocast on each tier with the blocked direct convolutions that runs here (AMX,
/// AVX512-BF16, f32 FMAs; their portable reference where none does), ResNet, the CNN and a declared
/// network keep their activations blocked and convolve on tiles (the last two adding their biases to the
/// unrounded sums); the loss and every gradient agree with the emulated path's (NCHW, rounded operands
/// around f32 products) as far as bf16's rounding lets two summation orders agree. (On a CPU whose
/// blocked layout is not 16 lanes both runs are emulated.)
#[rstest::rstest]
fn bf16_on_tiles_equals_the_emulated_path(
    #[values(
        "{name: resnet18, num_classes: 4, cifar_stem: true}",
        "{name: cnn, num_classes: 4, channels: [16, 24, 32]}",
        DECLARED_CONV_BIAS
    )]
    model: &str,
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
    let exp = experiment(model, "{name: sgd, lr: 0.1}");
    // 16 images of 16x16: BatchNorm's batch statistics over enough values that bf16's rounding noise
    // (which differs between any two summation orders) is not amplified past comparison.
    let batch = crate::testing::batch_of(16, 16, 3);
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

/// Under bf16 autocast on the fma tier ResNet's convolutions read their inputs and output gradients in
/// place (`direct::conv::Rounded`), trusting that the ops which made them (the BatchNorms, the residual
/// adds, the BatchNorms' backward) stored bf16s: the step must equal, bit for bit, the one whose
/// convolutions round copies of them. Both stems: the CIFAR stem blocked from the first convolution, the
/// ImageNet stem planar up to its max-pool. Likewise the CNN's blocked convolutions (their inputs from
/// the rounding bias-ReLU-pool epilogue, their output gradients through its mask from the next block's
/// input gradient; not the last block's, which the head's dropout and mean pass back: with dropout on,
/// calling it rounded moves the step).
#[rstest::rstest]
#[case::resnet18_cifar("{name: resnet18, num_classes: 4, cifar_stem: true}", 20)]
#[case::resnet50_imagenet_stem("{name: resnet50, num_classes: 4}", 52)]
#[case::cnn("{name: cnn, num_classes: 4, channels: [16, 24, 32], dropout: 0.1}", 2)]
fn operands_called_rounded_are_bf16s(#[case] model: &str, #[case] convolutions: usize) {
    use trainyard_conv::bf16::Tier;
    let Some(isa) = super::kernels::direct::active().filter(|_| Tier::Fma.supported()) else {
        eprintln!("SKIPPED: the fma tier does not run on this CPU");
        return;
    };
    assert!(super::kernels::direct::conv::bf16_blocks(isa, Tier::Fma));
    let exp = experiment(model, "{name: sgd, lr: 0.1}");
    let batch = crate::testing::batch_of(8, 16, 5);
    let (in_place, _) = fma_step_with_claims(&exp, &batch, true);
    let (copies, distrusted) = fma_step_with_claims(&exp, &batch, false);
    // The second run's convolutions (every blocked one: ResNet-18's 20, ResNet-50's 52 after its
    // planar stem, the CNN's after its first) did round copies.
    assert!(distrusted >= convolutions, "{distrusted} convolutions");
    assert_same_step(&in_place, &copies);
}

/// A bf16 step's loss and gradients (by parameter name).
type Step = (f64, Vec<(String, Vec<f32>)>);

/// One bf16-mixed step on the fma tier, its ops trusting what their callers call rounded or (`trust`
/// false) rounding copies whatever the claims say; with how many ops set their claims aside.
fn fma_step_with_claims(exp: &Experiment, batch: &Batch, trust: bool) -> (Step, usize) {
    use super::kernels::direct::conv::tests::{DISTRUSTED, TRUST_ROUNDED};
    TRUST_ROUNDED.set(trust);
    DISTRUSTED.set(0);
    let mut e = CandleEngine::new(exp).unwrap();
    e.autocast = Autocast {
        bf16: true,
        tier: Some(trainyard_conv::bf16::Tier::Fma),
    };
    let stats = e.forward_backward(batch, 1.0).unwrap();
    TRUST_ROUNDED.set(true);
    let grads = e
        .gradients()
        .iter()
        .map(|(n, g)| (n.clone(), g.flatten_all().unwrap().to_vec1().unwrap()))
        .collect();
    ((stats.loss_sum, grads), DISTRUSTED.get())
}

/// The two steps' loss and every gradient are the same bits.
fn assert_same_step(a: &Step, b: &Step) {
    assert_eq!(a.0.to_bits(), b.0.to_bits(), "loss");
    assert_eq!(a.1.len(), b.1.len());
    for ((name, x), (_, y)) in a.1.iter().zip(&b.1) {
        let moved = x.iter().zip(y).filter(|(x, y)| x.to_bits() != y.to_bits());
        assert_eq!(moved.count(), 0, "{name}'s gradient");
    }
}

/// Under bf16 autocast on the fma tier the ViT's linear layers read their inputs, and qkv and fc1 their
/// output gradients, in place (`Autocast::linear_of`), trusting the ops that made them to have stored
/// bf16s: the LayerNorms before qkv and fc1 (rounded for their reader), the attention (its second
/// product's result; its backward) and GELU (both ways). The step must equal, bit for bit, the one whose
/// linear layers round copies; and with dropout on, fc2's input (scaled by the mask) is not called rounded.
#[rstest::rstest]
#[case::no_dropout(0.0, 48)]
#[case::dropout(0.1, 36)]
fn vit_operands_called_rounded_are_bf16s(#[case] dropout: f64, #[case] claims: usize) {
    use trainyard_conv::bf16::Tier;
    if super::kernels::direct::active().is_none() || !Tier::Fma.supported() {
        eprintln!("SKIPPED: the fma tier does not run on this CPU");
        return;
    }
    let model = format!(
        "{{name: vit, num_classes: 4, variant: tiny, patch_size: 4, image_size: 8, dropout: {dropout}}}"
    );
    let exp = experiment(&model, "{name: sgd, lr: 0.1}");
    let batch = crate::testing::batch_of(8, 8, 5);
    let (in_place, _) = fma_step_with_claims(&exp, &batch, true);
    let (copies, distrusted) = fma_step_with_claims(&exp, &batch, false);
    // qkv, proj and fc1 of each of the 12 blocks, and fc2 unless dropout scaled its input.
    assert_eq!(distrusted, claims, "linear layers that set claims aside");
    assert_same_step(&in_place, &copies);
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
    let kept = crate::backend::load_pretrained(&mut target, &published, &["fc".into()]).unwrap();
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
