//! TorchScript modules exported from PyTorch, trained on the tch backend (`model=torchscript`):
//! the same weights as PyTorch training the same module on the same batches (SGD and AdamW, 1e-5), a
//! dict/tuple output and a module's own loss, checkpoints that resume exactly, `train export` loaded back
//! by PyTorch, and each bad input refused before the first step with what to do.
//! PyTorch comes from TRAINYARD_TORCH_PYTHON (`.ci/run` makes one); without it the tests say SKIPPED,
//! except under CI, where they fail.
#![cfg(feature = "torch")]

mod common;

use common::{torch_python, train};
use rstest::rstest;
use std::path::{Path, PathBuf};
use std::process::Command;
use trainyard::backend::{build, Placement};
use trainyard::data::loader::Batch;
use trainyard::platform::rng::Rng;

const ORACLE: &str = "tests/fixtures/torchscript_oracle.py";
const STEPS: usize = 4;

/// The test modules, scripted by PyTorch into a temp dir.
fn modules(python: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    oracle(python, &["make", &dir.path().display().to_string()]);
    dir
}

fn oracle(python: &str, args: &[&str]) -> String {
    let out = Command::new(python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(ORACLE))
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "torchscript_oracle.py {args:?}:\n{text}"
    );
    text
}

fn experiment(model: &str, optimizer: &str) -> trainyard::schema::Experiment {
    let text = format!(
        "task_name: t\nseed: 7\nbackend: tch\nmodel: {model}\n\
         data: {{name: synthetic, num_classes: 5, image_size: 8, batch_size: 6}}\n\
         optimizer: {optimizer}\nscheduler: {{name: constant}}\n\
         trainer: {{strategy: single, devices: 1, accelerator: cpu, precision: 32-true, max_epochs: 1}}\n\
         paths: {{root_dir: ., data_dir: d, log_dir: l, output_dir: o}}\n"
    );
    let node = trainyard::config::yaml::parse(&text, "t.yaml")
        .unwrap()
        .unwrap();
    trainyard::schema::extract(&node).unwrap()
}

fn batches() -> Vec<Batch> {
    let mut rng = Rng::new(11);
    (0..STEPS)
        .map(|_| Batch {
            images: (0..6 * 3 * 8 * 8).map(|_| rng.normal() as f32).collect(),
            labels: (0..6).map(|_| rng.below(5) as u32).collect(),
            channels: 3,
            height: 8,
            width: 8,
            staged: None,
            tensors: None,
        })
        .collect()
}

/// The batches as PyTorch reads them: x0, y0, x1, ...
fn write_batches(path: &Path, batches: &[Batch]) {
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for (i, b) in batches.iter().enumerate() {
        tensors.push((format!("x{i}"), vec![6, 3, 8, 8], b.images.clone()));
        let labels = b.labels.iter().map(|&l| l as f32).collect();
        tensors.push((format!("y{i}"), vec![6], labels));
    }
    common::write_safetensors(path, &tensors);
}

/// PyTorch and trainyard train the same scripted module on the same batches: the same weights and
/// BatchNorm statistics after every step's update, within 1e-5.
#[rstest]
#[case::cnn_sgd("cnn", "sgd")]
#[case::cnn_adamw("cnn", "adamw")]
#[case::transformer_sgd("transformer", "sgd")]
#[case::transformer_adamw("transformer", "adamw")]
fn training_matches_pytorch(#[case] name: &str, #[case] optimizer: &str) {
    let Some(python) = torch_python() else {
        return;
    };
    let dir = modules(&python);
    let path = dir.path().join(format!("{name}.pt"));
    let model = format!(
        "{{_target_: trainyard.TorchScript, path: '{}', num_classes: 5}}",
        path.display()
    );
    let (opt, momentum) = match optimizer {
        "sgd" => ("{name: sgd, lr: 0.05, momentum: 0.9}", Some(0.9)),
        _ => ("{name: adamw, lr: 0.001, weight_decay: 0.01}", None),
    };
    let exp = experiment(&model, opt);
    let mut engine = build(&exp, &Placement::single()).unwrap();
    let data = batches();
    for b in &data {
        engine.forward_backward(b, 1.0).unwrap();
        let lr = exp.optimizer.lr;
        engine.optimizer_step(lr, momentum, None).unwrap();
    }
    write_batches(&dir.path().join("batches.safetensors"), &data);
    let d = dir.path().display().to_string();
    oracle(&python, &["train", &d, name, optimizer, &STEPS.to_string()]);
    let theirs = trainyard::storage::checkpoint::load(
        &dir.path()
            .join(format!("{name}-{optimizer}-torch.safetensors")),
    )
    .unwrap()
    .state;
    let ours = engine.state_dict().unwrap();
    let mut compared = 0;
    for (key, want) in &theirs {
        let got = ours.get(key).unwrap_or_else(|| {
            panic!("trainyard's state has no '{key}' (PyTorch's state_dict name)")
        });
        assert_eq!(got.shape, want.shape, "{key}");
        let worst = got
            .data
            .iter()
            .zip(&want.data)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= 1e-5,
            "{name}/{optimizer}: '{key}' differs by {worst}"
        );
        compared += 1;
    }
    assert_eq!(compared, theirs.len());
    if name == "cnn" {
        // BatchNorm counted the batches (a buffer the module keeps, saved under its own name).
        assert_eq!(
            ours["features.1.num_batches_tracked"].data,
            vec![STEPS as f32]
        );
    }
}

/// A module returning a dict (logits under a key) or its own loss (a tuple, given the targets) trains;
/// the own loss (2·CE + 1 in the fixture, about 4.2 at the start; plain CE is about 1.6) is the one
/// reported.
#[rstest]
#[case::dict("dict_out.pt", "logits: logits", (1.0, 2.5))]
#[case::own_loss("own_loss.pt", "logits: 0, loss: 1", (3.0, 6.0))]
fn structured_outputs_train(#[case] file: &str, #[case] outputs: &str, #[case] start: (f64, f64)) {
    let Some(python) = torch_python() else {
        return;
    };
    let dir = modules(&python);
    let model = format!(
        "{{_target_: trainyard.TorchScript, path: '{}', num_classes: 5, {outputs}}}",
        dir.path().join(file).display()
    );
    let exp = experiment(&model, "{name: sgd, lr: 0.1}");
    let mut engine = build(&exp, &Placement::single()).unwrap();
    let data = batches();
    let first = engine.forward_backward(&data[0], 1.0).unwrap();
    engine.optimizer_step(0.1, None, None).unwrap();
    for _ in 0..10 {
        engine.forward_backward(&data[0], 1.0).unwrap();
        engine.optimizer_step(0.1, None, None).unwrap();
    }
    let later = engine.evaluate(&data[0]).unwrap();
    let (l0, l1) = (
        first.loss_sum / first.count as f64,
        later.loss_sum / later.count as f64,
    );
    assert!(
        start.0 < l0 && l0 < start.1,
        "{file}: first loss {l0}, expected in {start:?}"
    );
    assert!(l1 < l0 * 0.8, "{file}: loss {l0} -> {l1}: not learning");
}

/// A small project with the repository's conf/ and the test modules.
fn project(python: &str) -> (tempfile::TempDir, PathBuf) {
    let root = common::real_project();
    let modules = modules(python);
    let dest = root.path().join("nets");
    common::copy_dir(modules.path(), &dest);
    (root, dest)
}

const RUN: &[&str] = &[
    "model=torchscript",
    "data=synthetic",
    "data.num_classes=5",
    "data.image_size=8",
    "data.train_size=48",
    "data.val_size=12",
    "data.batch_size=6",
    "data.num_workers=0",
    "trainer.accelerator=cpu",
    "callbacks.model_summary=null",
];

/// Two epochs straight, or one then a resume from its last checkpoint: the same weights (and the test
/// fails when the resume ignores the checkpoint: the resumed run would start from the module's file).
/// The checkpoint keeps the module's own names; `train export` writes them into the module, which
/// PyTorch loads with the same tensors.
#[test]
fn checkpoints_resume_and_export_back_to_pytorch() {
    let Some(python) = torch_python() else {
        return;
    };
    let (root, nets) = project(&python);
    // Dropout 0.5 in the module: its masks must be the same after the resume.
    let path = format!("model.path={}", nets.join("cnn_dropout.pt").display());
    let every_epoch = [
        path.as_str(),
        "trainer.max_epochs=2",
        "callbacks.model_checkpoint.save_top_k=-1",
        "callbacks.model_checkpoint.monitor=null",
    ];
    let straight = common::run_with(root.path(), "straight", RUN, &every_epoch);
    let ckpt = format!(
        "ckpt_path={}",
        straight.join("checkpoints/epoch_000.safetensors").display()
    );
    let mut resume = every_epoch.to_vec();
    resume.push(&ckpt);
    let resumed = common::run_with(root.path(), "resumed", RUN, &resume);
    let csv = std::fs::read_to_string(resumed.join("metrics.csv")).unwrap();
    assert!(
        csv.lines().skip(1).all(|l| !l.starts_with("0,")),
        "the resumed run must not train epoch 0 again:\n{csv}"
    );
    let (a, b) = (common::weights(&straight), common::weights(&resumed));
    assert!(a.contains_key("features.0.weight") && a.contains_key("features.1.running_mean"));
    let worst = common::worst_relative_difference(&b, &a);
    assert_eq!(
        worst, 0.0,
        "a resumed run must continue exactly where the first stopped"
    );

    let last = straight.join("checkpoints/last.safetensors");
    let out = train(
        root.path(),
        &[
            "export",
            &format!("ckpt={}", last.display()),
            "out=trained.pt",
        ],
    );
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("Exported"), "{text}");
    let weights = root.path().join("weights.safetensors");
    let tensors: Vec<(String, Vec<usize>, Vec<f32>)> = a
        .iter()
        .map(|(k, t)| (k.clone(), t.shape.clone(), t.data.clone()))
        .collect();
    common::write_safetensors(&weights, &tensors);
    let said = oracle(
        &python,
        &[
            "check",
            &root.path().join("trained.pt").display().to_string(),
            &weights.display().to_string(),
        ],
    );
    assert!(said.contains("export ok"), "{said}");
}

/// Each bad input is one clear error before the first step, naming the file and what to do.
#[rstest]
#[case::not_torchscript("garbage.pt", &[], "is not a TorchScript file")]
#[case::newer_format("newer.pt", &[], "newer PyTorch")]
#[case::no_such_file("missing.pt", &[], "no such file")]
#[case::dict_without_logits_key("dict_out.pt", &[], "say which output holds the logits: model.logits= one of [logits, features]")]
#[case::wrong_logits_key("dict_out.pt", &["model.logits=probs"], "has no output 'probs' for the logits")]
#[case::rejected_shape("dict_out.pt", &["model.logits=logits", "data.image_size=16"], "forward refused inputs of shape [2, 3, 16, 16]")]
#[case::wrong_classes("cnn.pt", &["data.num_classes=7"], "classification needs [N, 7]")]
#[case::unknown_argument("cnn.pt", &["+model.logit=0"], "model.logit")]
#[case::candle("cnn.pt", &["backend=candle"], "runs on libtorch only")]
#[case::fsdp("cnn.pt", &["trainer=fsdp_sim"], "trainer.strategy=fsdp with model _target_ trainyard.TorchScript")]
#[case::true_precision("cnn.pt", &["trainer.precision=bf16-true"], "does not cast a registered model's own")]
fn bad_inputs_are_refused(#[case] file: &str, #[case] extra: &[&str], #[case] says: &str) {
    let Some(python) = torch_python() else {
        return;
    };
    let (root, nets) = project(&python);
    std::fs::write(
        nets.join("garbage.pt"),
        b"this is a state_dict, not a module",
    )
    .unwrap();
    let path = format!("model.path={}", nets.join(file).display());
    let mut args: Vec<&str> = RUN.to_vec();
    args.push(&path);
    args.extend_from_slice(extra);
    let out = train(root.path(), &args);
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{args:?} should fail:\n{text}");
    assert!(
        text.contains(says),
        "{args:?}: expected '{says}' in:\n{text}"
    );
    assert!(!text.contains("panicked"), "{text}");
    assert!(
        !text.contains("Epoch 0"),
        "refused after training started:\n{text}"
    );
}

/// DataParallel and DDP (gradients through c10d's reducer, over Gloo) train a scripted module; mixed
/// precision trains it under libtorch's autocast.
#[rstest]
#[case::dp(&["trainer=dp_sim"], "dp")]
#[case::ddp(&["trainer=ddp_sim"], "ddp")]
#[case::bf16_mixed(&["trainer.precision=bf16-mixed"], "single")]
fn strategies_and_precisions_train(#[case] extra: &[&str], #[case] strategy: &str) {
    let Some(python) = torch_python() else {
        return;
    };
    let (root, nets) = project(&python);
    let path = format!("model.path={}", nets.join("cnn.pt").display());
    let mut args = vec![path.as_str(), "trainer.max_epochs=2", "optimizer.lr=0.05"];
    args.extend_from_slice(extra);
    let run = common::run_with(root.path(), "run", RUN, &args);
    let s = common::summary(&run);
    assert_eq!(s["strategy"], strategy, "{s}");
    let devices = if strategy == "single" { 1 } else { 2 };
    assert_eq!(s["devices"], devices, "{s}");
    let rows = common::csv_rows(&run);
    let losses: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.iter().find(|(k, _)| k == "train/loss").map(|(_, v)| *v))
        .collect();
    assert!(
        // Five classes: chance is ln 5 = 1.609; a model that learns nothing stays there.
        losses.len() >= 2
            && losses[losses.len() - 1] < losses[0]
            && losses[losses.len() - 1] < 5f64.ln() - 0.05,
        "{strategy}: train/loss by epoch {losses:?}"
    );
}

/// libtorch's autocast reaches inside a scripted graph: under bf16-mixed a scripted Linear computes in
/// bfloat16 on the CPU (what `trainer.precision=bf16-mixed` relies on).
#[test]
fn autocast_applies_inside_the_scripted_graph() {
    use trainyard::backend::torch::amp::{autocast, Mode};
    use trainyard::registry::tch::{CModule, Device, Kind, Tensor};
    let Some(python) = torch_python() else {
        return;
    };
    let dir = modules(&python);
    let module = CModule::load(dir.path().join("dict_out.pt")).unwrap();
    let x = Tensor::zeros([2, 3, 8, 8], (Kind::Float, Device::Cpu));
    let logits = |module: &CModule| match module
        .forward_is(&[trainyard::registry::tch::IValue::Tensor(x.shallow_clone())])
        .unwrap()
    {
        trainyard::registry::tch::IValue::GenericDict(pairs) => match &pairs[0].1 {
            trainyard::registry::tch::IValue::Tensor(t) => t.kind(),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    assert_eq!(logits(&module), Kind::Float);
    let mode = Mode::of(trainyard::schema::Precision::MixedBf16);
    let _guard = autocast(mode, Device::Cpu).unwrap();
    assert_eq!(logits(&module), Kind::BFloat16);
}
