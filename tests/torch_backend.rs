//! The tch (libtorch) backend against the Candle backend: same seed, same initial weights (one safetensors
//! file), same batches → the same losses over 20 SGD steps (1e-4 relative, fp32, CPU; fewer for ResNets,
//! see below); checkpoints written
//! by one backend load in the other; the quick start trains on backend=tch.
//! Needs `--features torch` and libtorch (scripts/install-libtorch.sh).
#![cfg(feature = "torch")]

mod common;
use common::{real_project, summary, train};
use trainyard::backend::candle::CandleEngine;
use trainyard::backend::torch::TchEngine;
use trainyard::backend::{Engine, StateDict};
use trainyard::checkpoint::{self, TrainingState};
use trainyard::data::loader::Batch;
use trainyard::rng::Rng;
use trainyard::schema::Experiment;

fn experiment(model: &str, optimizer: &str, image: usize) -> Experiment {
    let text = format!(
        "task_name: t\nseed: 5\nmodel: {model}\n\
         data: {{name: synthetic, num_classes: 10, image_size: {image}, batch_size: 8}}\n\
         optimizer: {optimizer}\nscheduler: {{name: constant}}\n\
         trainer: {{strategy: single, accelerator: cpu, devices: 1, precision: 32, max_epochs: 1}}\n\
         paths: {{root_dir: ., data_dir: d, log_dir: l, output_dir: o}}\n"
    );
    let node = trainyard::config::yaml::parse(&text, "t.yaml")
        .unwrap()
        .unwrap();
    trainyard::schema::extract(&node).unwrap()
}

fn batches(n: usize, image: usize) -> Vec<Batch> {
    let mut rng = Rng::new(17);
    (0..n)
        .map(|_| Batch {
            images: (0..8 * 3 * image * image)
                .map(|_| rng.normal() as f32)
                .collect(),
            labels: (0..8).map(|_| rng.below(10) as u32).collect(),
            channels: 3,
            height: image,
            width: image,
        })
        .collect()
}

/// Weights only (no optimizer state), through a real safetensors file.
fn through_file(state: &StateDict) -> StateDict {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("init.safetensors");
    let weights: StateDict = state
        .iter()
        .filter(|(k, _)| !k.starts_with("optimizer."))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let training = TrainingState {
        epoch: 0,
        global_step: 0,
        metrics: Default::default(),
        best: None,
        epochs_without_improvement: 0,
    };
    checkpoint::save(&path, &weights, &training, "").unwrap();
    checkpoint::load(&path).unwrap().state
}

/// ResNets run fewer steps: BatchNorm on small batches puts ReLU inputs within float32 rounding of zero,
/// where any two float32 implementations route a gradient element differently (PyTorch float32 against
/// float64 shows 6e-2 per-tensor differences after one step on such a ResNet-50 batch), so their
/// trajectories part after a few steps without either being wrong. No-BN models run the full 20.
#[rstest::rstest]
#[case::mlp("{num_classes: 10, name: mlp, hidden: [64, 32], dropout: 0.2}", 8, 20)]
#[case::cnn(
    "{num_classes: 10, name: cnn, channels: [8, 16], dropout: 0.0}",
    16,
    20
)]
#[case::resnet18_cifar("{num_classes: 10, name: resnet18, cifar_stem: true}", 8, 3)]
#[case::resnet50("{num_classes: 10, name: resnet50}", 32, 1)]
#[case::vit_tiny(
    "{num_classes: 10, name: vit, variant: tiny, patch_size: 4, image_size: 8, dropout: 0.1}",
    8,
    20
)]
fn losses_agree_over_sgd_steps(#[case] model: &str, #[case] image: usize, #[case] steps: usize) {
    let exp = experiment(
        model,
        "{name: sgd, lr: 0.05, momentum: 0.9, nesterov: true, weight_decay: 0.0005}",
        image,
    );
    let mut candle = CandleEngine::new(&exp).unwrap();
    let mut tch = TchEngine::new(&exp).unwrap();
    let init = through_file(&candle.state_dict().unwrap());
    candle.load_state_dict(&init).unwrap();
    tch.load_state_dict(&init).unwrap();
    for (step, batch) in batches(steps, image).iter().enumerate() {
        let a = candle.forward_backward(batch, 1.0).unwrap().loss();
        let b = tch.forward_backward(batch, 1.0).unwrap().loss();
        let rel = (a - b).abs() / a.abs().max(1e-12);
        assert!(rel < 1e-4, "step {step}: candle {a} vs tch {b} ({rel:e})");
        candle.optimizer_step(0.05, None, Some(5.0)).unwrap();
        tch.optimizer_step(0.05, None, Some(5.0)).unwrap();
    }
    if steps < 20 {
        return; // see above: the end states of deep BatchNorm nets are compared by the loss only
    }
    // Weights and momentum buffers agree at the end too.
    let (sa, sb) = (candle.state_dict().unwrap(), tch.state_dict().unwrap());
    assert_eq!(sa.keys().collect::<Vec<_>>(), sb.keys().collect::<Vec<_>>());
    for (name, ta) in &sa {
        let tb = &sb[name];
        assert_eq!(ta.shape, tb.shape, "{name}");
        let scale = ta.data.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
        let worst = ta
            .data
            .iter()
            .zip(&tb.data)
            .map(|(x, y)| (x - y).abs() / scale)
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-3, "{name}: differs by {worst:e} of its scale");
    }
}

/// A checkpoint written by either backend resumes in the other: the next step's loss is the same.
#[test]
fn checkpoints_cross_between_backends() {
    let exp = experiment(
        "{num_classes: 10, name: resnet18, cifar_stem: true}",
        "{name: adamw, lr: 0.001, weight_decay: 0.01}",
        8,
    );
    let data = batches(4, 8);
    let mut candle = CandleEngine::new(&exp).unwrap();
    for b in &data[..3] {
        candle.forward_backward(b, 1.0).unwrap();
        candle.optimizer_step(0.001, None, None).unwrap();
    }
    let saved = through_file(&candle.state_dict().unwrap());
    let mut with_state = candle.state_dict().unwrap();
    with_state.extend(saved);
    let mut tch = TchEngine::new(&exp).unwrap();
    tch.load_state_dict(&with_state).unwrap();
    let a = candle.forward_backward(&data[3], 1.0).unwrap().loss();
    let b = tch.forward_backward(&data[3], 1.0).unwrap().loss();
    assert!((a - b).abs() / a < 1e-4, "candle {a} vs tch {b}");
    candle.optimizer_step(0.001, None, None).unwrap();
    tch.optimizer_step(0.001, None, None).unwrap();
    // And back: tch's state into a fresh Candle engine.
    let mut back = CandleEngine::new(&exp).unwrap();
    back.load_state_dict(&tch.state_dict().unwrap()).unwrap();
    let x = back.evaluate(&data[0]).unwrap().loss();
    let y = tch.evaluate(&data[0]).unwrap().loss();
    assert!((x - y).abs() / x < 1e-4, "candle {x} vs tch {y}");
}

/// `train experiment=quickstart backend=tch` learns as the Candle quick start does.
#[test]
fn quickstart_trains_on_tch() {
    let p = real_project();
    let out = train(p.path(), &["experiment=quickstart", "backend=tch"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let runs = p.path().join("logs/quickstart/runs");
    let run = std::fs::read_dir(&runs)
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let s = summary(&run);
    assert_eq!(s["backend"], "tch");
    let acc = s["final_metrics"]["val/acc1"].as_f64().unwrap();
    assert!(acc > 0.9, "val/acc1 {acc}");
}
