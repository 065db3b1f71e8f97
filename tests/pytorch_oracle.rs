//! The zoo against PyTorch itself (issue 44's oracle, as a test): ResNet-18 with torchvision's ImageNet
//! and CIFAR stems and timm's ViT-Tiny/8, on each backend. PyTorch writes a model's initial weights, a
//! batch, its eval-mode logits and every tensor after one SGD step (tests/fixtures/zoo_oracle.py); ours
//! loads the same weights, and must give the same logits, the same update of every parameter (the
//! gradient, weight decay and momentum together) and the same BatchNorm statistics.
//!
//! Tolerances, relative to each quantity's largest magnitude, against a float64 PyTorch (ours run in
//! float32): logits 1e-4 (and, on tch, which runs libtorch's own kernels, 1e-5 from PyTorch's float32
//! eager); each update 1e-4, or three times PyTorch's own float32 error on the same step where that is
//! larger (a BatchNorm weight's small update carries ~1e-4 of float32 rounding in any float32
//! implementation, PyTorch's included, as reduction orders differ with thread counts). PyTorch comes from TRAINYARD_TORCH_PYTHON with torchvision and timm (`.ci/run` installs
//! them); without it the test says SKIPPED, except under CI, where it fails.

mod common;

use rstest::rstest;
use std::path::Path;
use trainyard::backend::{build, load_pretrained, Placement};
use trainyard::data::loader::Batch;
use trainyard::tensor::HostTensor;

const LR: f64 = 0.1;

fn experiment(backend: &str, model: &str, size: usize) -> trainyard::schema::Experiment {
    let text = format!(
        "task_name: oracle\nseed: 0\nbackend: {backend}\nmodel: {model}\n\
         data: {{name: synthetic, num_classes: 10, image_size: {size}, batch_size: 4}}\n\
         optimizer: {{name: sgd, lr: {LR}, momentum: 0.9, weight_decay: 0.0005}}\n\
         scheduler: {{name: constant}}\n\
         trainer: {{strategy: single, accelerator: cpu, devices: 1, precision: 32, max_epochs: 1}}\n\
         paths: {{root_dir: ., data_dir: d, log_dir: l, output_dir: o}}\n"
    );
    let node = trainyard::config::yaml::parse(&text, "oracle.yaml")
        .unwrap()
        .unwrap();
    trainyard::schema::extract(&node).unwrap()
}

fn load(path: &Path) -> std::collections::BTreeMap<String, HostTensor> {
    trainyard::storage::checkpoint::load(path)
        .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()))
        .state
        .into_iter()
        .collect()
}

/// The largest |a - b| relative to b's largest |value|, after checking shapes and finiteness.
fn relative_error(what: &str, ours: &HostTensor, reference: &HostTensor) -> f64 {
    assert_eq!(ours.shape, reference.shape, "{what}: shape");
    assert!(
        ours.data.iter().all(|v| v.is_finite()),
        "{what}: ours is not finite"
    );
    let scale = reference
        .data
        .iter()
        .fold(0.0f64, |m, v| m.max(v.abs() as f64));
    let worst = ours
        .data
        .iter()
        .zip(&reference.data)
        .fold(0.0f64, |m, (a, b)| m.max((*a as f64 - *b as f64).abs()));
    worst / scale.max(1e-12)
}

/// (case, zoo model, image side) — the files zoo_oracle.py writes are named by the case.
const CASES: [(&str, &str, usize); 3] = [
    ("resnet18", "{name: resnet18, num_classes: 10}", 64),
    (
        "resnet18_cifar",
        "{name: resnet18, num_classes: 10, cifar_stem: true}",
        32,
    ),
    (
        "vit_tiny",
        "{name: vit, variant: tiny, patch_size: 8, image_size: 32, num_classes: 10}",
        32,
    ),
];

#[rstest]
#[case::candle("candle")]
#[cfg_attr(feature = "torch", case::tch("tch"))]
fn the_zoo_matches_pytorch(#[case] backend: &str) {
    let tolerance: f64 = 1e-4;
    let Some(python) = common::torch_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/zoo_oracle.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the PyTorch side failed (it needs torch, torchvision, timm, safetensors):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut report = Vec::new();
    for (name, model, size) in CASES {
        let exp = experiment(backend, model, size);
        let mut engine = build(&exp, &Placement::single()).unwrap();
        let weights = load(&dir.path().join(format!("{name}-w.safetensors")));
        let head = trainyard::model::Architecture::new(&exp.model, 3, size)
            .unwrap()
            .head();
        let published = weights.clone().into_iter().collect();
        let kept = load_pretrained(&mut *engine, &published, &head).unwrap();
        assert!(
            kept.is_empty(),
            "{name}: PyTorch's weights did not cover {kept:?}"
        );
        let inputs = load(&dir.path().join(format!("{name}-b.safetensors")));
        let batch = Batch {
            images: inputs["x"].data.clone(),
            labels: inputs["y"].data.iter().map(|v| *v as u32).collect(),
            channels: 3,
            height: size,
            width: size,
            staged: None,
            tensors: None,
        };
        let reference = load(&dir.path().join(format!("{name}-ref.safetensors")));
        let logits = engine.predict(&batch).unwrap();
        let logits_error = relative_error(
            &format!("{name} logits"),
            &logits,
            &reference["eval_logits"],
        );
        let f32_reference = load(&dir.path().join(format!("{name}-f32.safetensors")));
        if backend == "tch" {
            let same_kernels = relative_error(
                &format!("{name} logits"),
                &logits,
                &f32_reference["eval_logits"],
            );
            assert!(
                same_kernels <= 1e-5,
                "{name} [tch]: logits {same_kernels:e} from PyTorch's float32 eager (the same kernels)"
            );
        }

        engine.forward_backward(&batch, 1.0).unwrap();
        engine.optimizer_step(LR, None, None).unwrap();
        let after = engine.state_dict().unwrap();
        // Each parameter's update (w1 - w0: lr x (gradient + decay), momentum's first step) against
        // PyTorch's, relative to its largest; buffers (BatchNorm's running statistics) as values.
        let worst = |state: &trainyard::tensor::StateDict| -> (String, f64) {
            let mut worst = (String::new(), 0.0f64);
            for (key, start) in &weights {
                let theirs = &reference[key];
                let ours = state
                    .get(key)
                    .unwrap_or_else(|| panic!("{name}: {key} is missing from the state"));
                let error = match key.ends_with("num_batches_tracked") {
                    true => {
                        assert_eq!(ours.data, theirs.data, "{name}: {key}");
                        0.0
                    }
                    false if key.contains("running_") => relative_error(key, ours, theirs),
                    false => {
                        let delta = |t: &HostTensor| HostTensor {
                            shape: t.shape.clone(),
                            data: t.data.iter().zip(&start.data).map(|(a, b)| a - b).collect(),
                        };
                        relative_error(key, &delta(ours), &delta(theirs))
                    }
                };
                if error > worst.1 {
                    worst = (key.clone(), error);
                }
            }
            worst
        };
        let ours = worst(&after);
        let pytorch_f32 = worst(&f32_reference.into_iter().collect()).1;
        let allowed = tolerance.max(3.0 * pytorch_f32);
        report.push(format!(
            "{name} [{backend}]: logits {logits_error:.1e}, worst update {:.1e} ({}), PyTorch float32's own {pytorch_f32:.1e}",
            ours.1, ours.0
        ));
        assert!(
            logits_error <= tolerance && ours.1 <= allowed,
            "{name} [{backend}] differs from PyTorch beyond {tolerance:e}:\n{}",
            report.join("\n")
        );
    }
    eprintln!("{}", report.join("\n"));
}
