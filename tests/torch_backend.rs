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
use trainyard::backend::Engine;
use trainyard::data::loader::Batch;
use trainyard::optim::GradClip;
use trainyard::platform::rng::Rng;
use trainyard::schema::Experiment;
use trainyard::storage::checkpoint::{self, TrainingState};
use trainyard::tensor::StateDict;

fn experiment(model: &str, optimizer: &str, image: usize) -> Experiment {
    experiment_in(model, optimizer, image, "32-true", "{}")
}

/// An experiment at a given `trainer.precision`, with `trainer.grad_scaler` settings (YAML flow map).
fn experiment_in(
    model: &str,
    optimizer: &str,
    image: usize,
    precision: &str,
    scaler: &str,
) -> Experiment {
    let scaler = if scaler == "{}" {
        String::new()
    } else {
        format!(", grad_scaler: {scaler}")
    };
    let text = format!(
        "task_name: t\nseed: 5\nmodel: {model}\n\
         data: {{name: synthetic, num_classes: 10, image_size: {image}, batch_size: 8}}\n\
         optimizer: {optimizer}\nscheduler: {{name: constant}}\n\
         trainer: {{strategy: single, accelerator: cpu, devices: 1, precision: {precision}, max_epochs: 1{scaler}}}\n\
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
            staged: None,
            tensors: None,
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
        stop_best: None,
        batches_done: 0,
        plateau: None,
        best_checkpoint: None,
        running: None,
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
        candle
            .optimizer_step(0.05, None, Some(GradClip::Norm(5.0)))
            .unwrap();
        tch.optimizer_step(0.05, None, Some(GradClip::Norm(5.0)))
            .unwrap();
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

/// Run `train experiment=quickstart ARGS...` in a fresh project; it must succeed. Returns its run directory.
fn quickstart_run(root: &std::path::Path, args: &[&str]) -> std::path::PathBuf {
    let mut all = vec!["experiment=quickstart"];
    all.extend_from_slice(args);
    let out = train(root, &all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_dir(root.join("logs/quickstart/runs"))
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path()
}

/// `train experiment=quickstart backend=tch` learns as the Candle quick start does.
#[test]
fn quickstart_trains_on_tch() {
    let p = real_project();
    let run = quickstart_run(p.path(), &["backend=tch"]);
    let s = summary(&run);
    assert_eq!(s["backend"], "tch");
    let acc = s["final_metrics"]["val/acc1"].as_f64().unwrap();
    assert!(acc > 0.9, "val/acc1 {acc}");
}

/// On a machine without a usable GPU, `trainer.accelerator=gpu` stops with the reason (libtorch's CUDA
/// library missing its CUDA libraries, or no device) and what to do; `auto` trains on the CPU.
#[test]
fn a_gpu_that_is_not_there_is_refused_and_auto_falls_back_to_the_cpu() {
    if trainyard::platform::cuda::is_available() {
        eprintln!("SKIPPED: this machine has a CUDA device");
        return;
    }
    let p = real_project();
    let out = train(
        p.path(),
        &[
            "experiment=quickstart",
            "backend=tch",
            "trainer.accelerator=gpu",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("trainer.accelerator=gpu: libtorch's CUDA library")
            && err.contains("trainer.accelerator=cpu"),
        "{err}"
    );
    let fresh = real_project(); // the refused run left its run directory in `p`
    let run = quickstart_run(
        fresh.path(),
        &[
            "backend=tch",
            "trainer.accelerator=auto",
            "trainer.limit_train_batches=2",
            "trainer.max_epochs=1",
        ],
    );
    assert_eq!(summary(&run)["backend"], "tch");
}

/// `trainer.deterministic=true` turns on libtorch's deterministic algorithms (as Lightning does) and
/// `false` turns them off again; with `cudnn_benchmark` it is refused by name. The setting is
/// process-wide and other tests here build engines at the same time, so the checks run in a child
/// process of this test binary that runs this test alone.
#[test]
fn deterministic_sets_libtorchs_deterministic_algorithms() {
    use trainyard::backend::torch::deterministic_algorithms;
    const ALONE: &str = "TRAINYARD_TEST_ALONE";
    if std::env::var_os(ALONE).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "deterministic_sets_libtorchs_deterministic_algorithms",
                "--exact",
            ])
            .env(ALONE, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
        return;
    }
    let mut exp = experiment(MLP, SGD, 8);
    exp.trainer.deterministic = true;
    TchEngine::new(&exp).unwrap();
    assert!(deterministic_algorithms());
    exp.trainer.cudnn_benchmark = true;
    let err = TchEngine::new(&exp).err().expect("refused").to_string();
    assert!(
        err.contains("trainer.deterministic=true with trainer.cudnn_benchmark=true"),
        "{err}"
    );
    exp.trainer.cudnn_benchmark = false;
    exp.trainer.deterministic = false;
    TchEngine::new(&exp).unwrap();
    assert!(!deterministic_algorithms());
}

/// A deterministic run trains on the CPU (none of the ops it uses lacks a deterministic implementation)
/// and repeats exactly: two runs end with the same weights, bit for bit.
#[test]
fn quickstart_trains_deterministically_on_tch() {
    let p = real_project();
    let args = [
        "backend=tch",
        "trainer.deterministic=true",
        "trainer.max_epochs=1",
        "data.train_size=512",
        "data.val_size=128",
    ];
    let a = common::run_with(p.path(), "a", &["experiment=quickstart"], &args);
    let b = common::run_with(p.path(), "b", &["experiment=quickstart"], &args);
    assert_eq!(summary(&a)["backend"], "tch");
    let diff = common::worst_relative_difference(&common::weights(&a), &common::weights(&b));
    assert_eq!(diff, 0.0, "two deterministic runs differ by {diff:e}");
}

const MLP: &str = "{num_classes: 10, name: mlp, hidden: [64, 32], dropout: 0.0}";
const CNN: &str = "{num_classes: 10, name: cnn, channels: [8, 16], dropout: 0.0}";
const SGD: &str = "{name: sgd, lr: 0.05, momentum: 0.9}";
const SCALER: &str =
    "{init_scale: 65536.0, growth_factor: 2.0, backoff_factor: 0.5, growth_interval: 2000}";

/// Losses of `steps` SGD steps from the same initial weights (taken from `init`).
fn losses(engine: &mut dyn Engine, init: &StateDict, data: &[Batch]) -> Vec<f64> {
    engine.load_state_dict(init).unwrap();
    data.iter()
        .map(|b| {
            let loss = engine.forward_backward(b, 1.0).unwrap().loss();
            engine.optimizer_step(0.05, None, None).unwrap();
            loss
        })
        .collect()
}

fn max_rel(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / x.abs().max(1e-12))
        .fold(0.0, f64::max)
}

/// Mixed and reduced precision really run in the lower precision (the losses move away from fp32's by
/// about the rounding of 8-bit or 11-bit mantissas) and still train; bf16-mixed on libtorch's autocast
/// agrees with the Candle backend's emulation of it.
#[rstest::rstest]
#[case::mlp_bf16_mixed(MLP, 8, "bf16-mixed")]
#[case::cnn_bf16_mixed(CNN, 16, "bf16-mixed")]
#[case::mlp_16_mixed(MLP, 8, "16-mixed")]
#[case::cnn_16_mixed(CNN, 16, "16-mixed")]
#[case::mlp_bf16_true(MLP, 8, "bf16-true")]
#[case::mlp_16_true(MLP, 8, "16-true")]
fn reduced_precision_rounds_and_trains(
    #[case] model: &str,
    #[case] image: usize,
    #[case] precision: &str,
) {
    // One batch, six times: a model that trains memorises it, so the loss must fall.
    let data = vec![batches(1, image).remove(0); 6];
    let full = experiment(model, SGD, image);
    let init = through_file(&CandleEngine::new(&full).unwrap().state_dict().unwrap());
    let reference = losses(&mut TchEngine::new(&full).unwrap(), &init, &data);
    let low = experiment_in(model, SGD, image, precision, SCALER);
    let mut engine = TchEngine::new(&low).unwrap();
    let reduced = losses(&mut engine, &init, &data);
    let rel = max_rel(&reference, &reduced);
    let (lo, hi) = if precision.starts_with("bf16") {
        (1e-5, 5e-2)
    } else {
        (1e-7, 5e-3)
    };
    assert!(
        rel > lo && rel < hi,
        "{precision}: losses {reduced:?} vs fp32 {reference:?}: {rel:e} is not a {precision} rounding"
    );
    // It learned as float32 learns: six steps on one batch take off at least half of float32's drop.
    let drop = |l: &[f64]| l[0] - l[l.len() - 1];
    assert!(
        drop(&reference) > 0.0 && drop(&reduced) > 0.5 * drop(&reference),
        "{precision} did not learn: {reduced:?} (float32: {reference:?})"
    );
    if precision == "bf16-mixed" {
        let emulated = losses(&mut CandleEngine::new(&low).unwrap(), &init, &data);
        let rel = max_rel(&emulated, &reduced);
        assert!(
            rel < 1e-2,
            "candle bf16-mixed {emulated:?} vs libtorch autocast {reduced:?} ({rel:e})"
        );
    }
    // Checkpoints stay float32 whatever the training precision, and load back.
    let state = engine.state_dict().unwrap();
    let mut again = TchEngine::new(&low).unwrap();
    again.load_state_dict(&through_file(&state)).unwrap();
    let a = engine.evaluate(&data[0]).unwrap().loss();
    let b = again.evaluate(&data[0]).unwrap().loss();
    assert_eq!(a, b, "{precision}: reloaded weights evaluate differently");
}

/// bf16-mixed ResNet-18 (CIFAR stem) on Candle against libtorch's CPU autocast from the same weights and
/// batches, with Candle's products on each bf16 tier this CPU runs (AMX, AVX512-BF16 and f32 FMAs over
/// rounded operands: the blocked direct convolutions, forward and both gradients at strides 1 and 2) and
/// emulated (the path of a CPU without AVX-512). BatchNorm's and the residual add's outputs and gradients
/// are bf16 on both sides (their arithmetic f32), but oneDNN's summation orders are not ours, so the two
/// agree to bf16's noise rather than bit for bit: the loss within 1%, and every convolution's weight
/// gradient at a cosine above 0.9 with autocast's (0.95-0.98 on an Emerald Rapids; 0.93-0.96 while
/// trainyard kept those in f32).
#[rstest::rstest]
fn resnet_bf16_mixed_matches_libtorch_autocast(
    #[values("amx", "avx512-bf16", "fma", "emulated")] tier: &str,
) {
    use trainyard_conv::bf16::Tier;
    let tier = match tier {
        "emulated" => None,
        name => match Tier::parse(name).filter(|t| t.supported()) {
            Some(t) => Some(t),
            None => {
                eprintln!("SKIPPED: the {name} tier does not run on this CPU");
                return;
            }
        },
    };
    let model = "{num_classes: 10, name: resnet18, cifar_stem: true}";
    let low = experiment_in(model, SGD, 8, "bf16-mixed", "{}");
    let data = batches(1, 8);
    let init = through_file(
        &CandleEngine::new(&experiment(model, SGD, 8))
            .unwrap()
            .state_dict()
            .unwrap(),
    );
    // One step of plain SGD at rate 1 from the same weights: each weight's change is its gradient.
    let step = |engine: &mut dyn Engine| -> (f64, StateDict) {
        engine.load_state_dict(&init).unwrap();
        let loss = engine.forward_backward(&data[0], 1.0).unwrap().loss();
        engine.optimizer_step(1.0, None, None).unwrap();
        (loss, engine.state_dict().unwrap())
    };
    let theirs = step(&mut TchEngine::new(&low).unwrap());
    let mut candle = CandleEngine::new(&low).unwrap();
    candle.pin_bf16_tier(tier).unwrap();
    let ours = step(&mut candle);
    let rel = (ours.0 - theirs.0).abs() / theirs.0;
    assert!(
        rel < 1e-2,
        "{tier:?}: loss {} vs libtorch autocast's {} ({rel:e})",
        ours.0,
        theirs.0
    );
    // Every convolution's weight gradient points where autocast's does.
    let mut convolutions = 0;
    for (name, before) in init
        .iter()
        .filter(|(n, t)| n.ends_with("weight") && t.shape.len() == 4)
    {
        let gradient = |after: &StateDict| -> Vec<f64> {
            before
                .data
                .iter()
                .zip(&after[name].data)
                .map(|(b, a)| f64::from(b - a))
                .collect()
        };
        let (g, h) = (gradient(&ours.1), gradient(&theirs.1));
        let dot: f64 = g.iter().zip(&h).map(|(a, b)| a * b).sum();
        let norm = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>().sqrt();
        let cosine = dot / (norm(&g) * norm(&h)).max(1e-30);
        eprintln!("{tier:?} {name}: cosine {cosine:.4}");
        assert!(
            cosine > 0.9,
            "{tier:?}: {name}'s gradient: cosine {cosine} with autocast's"
        );
        convolutions += 1;
    }
    assert!(
        convolutions >= 20,
        "ResNet-18 has 20 convolutions; compared {convolutions}"
    );
}

/// 16-mixed's GradScaler as torch.amp.GradScaler: a step whose scaled gradients overflow is skipped
/// (weights and optimizer state untouched) and the scale backs off; clean steps grow it after
/// `growth_interval`; the scaler's state travels in checkpoints.
#[test]
fn grad_scaler_skips_overflow_and_grows() {
    let data = batches(4, 8);
    // 1e38 × a loss of ~2.3 overflows float32: every gradient is inf.
    let exp = experiment_in(
        MLP,
        SGD,
        8,
        "16-mixed",
        "{init_scale: 1.0e38, growth_factor: 2.0, backoff_factor: 0.25, growth_interval: 2}",
    );
    let mut engine = TchEngine::new(&exp).unwrap();
    let before = engine.state_dict().unwrap();
    engine.forward_backward(&data[0], 1.0).unwrap();
    let norm = engine.optimizer_step(0.05, None, None).unwrap();
    assert!(norm.is_infinite());
    assert_eq!(loss_scale(&mut engine), Some(0.25e38_f32 as f64));
    let after = engine.state_dict().unwrap();
    for (name, t) in &before {
        if !name.starts_with("optimizer.") {
            assert_eq!(t, &after[name], "{name} changed on a skipped step");
        }
    }
    assert!(
        !after.keys().any(|k| k.ends_with("momentum_buffer")),
        "a skipped step must not create optimizer state"
    );
    assert_eq!(after["optimizer.step"].data, vec![0.0]);

    // From a sane scale: two clean steps → the scale doubles (growth_interval 2).
    let exp = experiment_in(
        MLP,
        SGD,
        8,
        "16-mixed",
        "{init_scale: 1024.0, growth_factor: 2.0, backoff_factor: 0.5, growth_interval: 2}",
    );
    let mut engine = TchEngine::new(&exp).unwrap();
    let scales: Vec<f64> = data
        .iter()
        .map(|b| {
            engine.forward_backward(b, 1.0).unwrap();
            let norm = engine.optimizer_step(0.05, None, None).unwrap();
            // Not skipped (a skipped step reports an infinite norm; without clipping tch skips the norm).
            assert!(!norm.is_infinite());
            loss_scale(&mut engine).unwrap()
        })
        .collect();
    assert_eq!(scales, vec![1024.0, 2048.0, 2048.0, 4096.0]);
    let state = through_file(&engine.state_dict().unwrap());
    let mut resumed = TchEngine::new(&exp).unwrap();
    let mut with_optimizer = engine.state_dict().unwrap();
    with_optimizer.extend(state);
    resumed.load_state_dict(&with_optimizer).unwrap();
    assert_eq!(loss_scale(&mut resumed), Some(4096.0));
}

/// The engine's dynamic loss scale, when it has a scaler.
fn loss_scale(engine: &mut TchEngine) -> Option<f64> {
    engine.loss_scaler().map(|s| s.scale().unwrap())
}

/// The CLI end to end at each reduced precision: trains to the quick start's accuracy bar, and 16-mixed
/// logs its loss scale in metrics.csv.
#[rstest::rstest]
#[case("16-mixed")]
#[case("bf16-mixed")]
#[case("bf16-true")]
fn quickstart_trains_at_reduced_precision(#[case] precision: &str) {
    let p = real_project();
    let arg = format!("trainer.precision={precision}");
    let out = train(
        p.path(),
        &[
            "experiment=quickstart",
            "backend=tch",
            &arg,
            "trainer.log_every_n_steps=8",
        ],
    );
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
    assert_eq!(s["precision"], precision, "{s}");
    let acc = s["final_metrics"]["val/acc1"].as_f64().unwrap();
    assert!(acc > 0.85, "{precision}: val/acc1 {acc}");
    let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = header.iter().position(|c| *c == "loss_scale");
    if precision == "16-mixed" {
        let col = col.expect("16-mixed logs loss_scale");
        let logged: Vec<f64> = csv
            .lines()
            .skip(1)
            .filter_map(|l| l.split(',').nth(col).and_then(|v| v.parse().ok()))
            .collect();
        assert!(!logged.is_empty(), "{csv}");
        assert!(
            logged.iter().all(|&v| v > 0.0 && v <= 65536.0),
            "{logged:?}"
        );
    } else {
        assert!(col.is_none(), "{precision} has no loss scale: {csv}");
    }
}
