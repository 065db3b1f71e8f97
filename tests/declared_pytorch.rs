//! A declared model's checkpoint loads into the same `nn.Sequential` in PyTorch (strict: every name and
//! shape) and gives the same logits (1e-5), on each backend: the model is trained a few steps (so weights
//! and BatchNorm statistics are no longer their starting values), then both run one batch in eval mode.
//! PyTorch comes from TRAINYARD_TORCH_PYTHON (a python with torch and safetensors; `.ci/run` makes one);
//! without it the test says SKIPPED, except under CI, where it fails.

mod common;

use common::{torch_python, write_safetensors};
use rstest::rstest;
use std::path::Path;
use std::process::Command;
use trainyard::backend::{build, Placement};
use trainyard::data::loader::Batch;
use trainyard::platform::rng::Rng;

/// Every layer type and structure a declared model has, as JSON (which is YAML too): PyTorch builds the
/// same list with torch.nn's modules.
const LAYERS: &str = r#"[
  {"type": "Conv2d", "out_channels": 8, "kernel_size": 3, "padding": 1, "bias": false},
  {"type": "BatchNorm2d", "eps": 0.001, "momentum": 0.2},
  {"type": "ReLU"},
  {"type": "Residual", "body": [
      {"type": "Conv2d", "in_channels": 8, "out_channels": 8, "kernel_size": 3, "padding": 1},
      {"type": "BatchNorm2d"}, {"type": "SiLU"},
      {"type": "Conv2d", "out_channels": 8, "kernel_size": 1, "bias": false},
      {"type": "BatchNorm2d"}]},
  {"type": "ReLU"},
  {"type": "Residual", "repeat": 2, "body": [{"type": "Conv2d", "out_channels": 8, "kernel_size": 3, "padding": 1}]},
  {"type": "MaxPool2d", "kernel_size": 3, "stride": 2, "padding": 1},
  {"type": "Sequential", "layers": [
      {"type": "Residual",
       "body": [{"type": "Conv2d", "out_channels": 16, "kernel_size": 3, "stride": 2, "padding": 1},
                {"type": "BatchNorm2d"}, {"type": "ReLU"}],
       "shortcut": [{"type": "Conv2d", "out_channels": 16, "kernel_size": 1, "stride": 2}]},
      {"type": "GELU"},
      {"type": "Conv2d", "out_channels": 16, "kernel_size": 3, "padding": 1},
      {"type": "ReLU"},
      {"type": "MaxPool2d", "kernel_size": 2}]},
  {"type": "AvgPool2d", "kernel_size": 2},
  {"type": "AdaptiveAvgPool2d", "output_size": 1},
  {"type": "Flatten"},
  {"type": "Dropout", "p": 0.2},
  {"type": "Linear", "out_features": 12},
  {"type": "BatchNorm1d", "momentum": 0.3},
  {"type": "ReLU"},
  {"type": "LayerNorm", "normalized_shape": 12, "eps": 0.0001},
  {"type": "GELU", "approximate": "tanh"},
  {"type": "Identity"},
  {"type": "Linear", "in_features": 12, "out_features": 5}
]"#;

fn experiment(backend: &str) -> trainyard::schema::Experiment {
    let text = format!(
        "task_name: t\nseed: 7\nbackend: {backend}\n\
         model: {{name: declared, num_classes: 5, layers: {}}}\n\
         data: {{name: synthetic, num_classes: 5, image_size: 16, batch_size: 6}}\n\
         optimizer: {{name: sgd, lr: 0.05, momentum: 0.9}}\nscheduler: {{name: constant}}\n\
         trainer: {{strategy: single, devices: 1, accelerator: cpu, precision: 32, max_epochs: 1}}\n\
         paths: {{root_dir: ., data_dir: d, log_dir: l, output_dir: o}}\n",
        LAYERS.replace('\n', " ")
    );
    let node = trainyard::config::yaml::parse(&text, "t.yaml")
        .unwrap()
        .unwrap();
    trainyard::schema::extract(&node).unwrap()
}

fn batch(seed: u64) -> Batch {
    let mut rng = Rng::new(seed);
    Batch {
        images: (0..6 * 3 * 16 * 16).map(|_| rng.normal() as f32).collect(),
        labels: vec![0, 1, 2, 3, 4, 0],
        channels: 3,
        height: 16,
        width: 16,
        staged: None,
        tensors: None,
    }
}

#[rstest]
#[case::candle("candle")]
#[cfg_attr(feature = "torch", case::tch("tch"))]
fn pytorch_loads_the_checkpoint_and_gives_the_same_logits(#[case] backend: &str) {
    let Some(python) = torch_python() else {
        return;
    };
    let exp = experiment(backend);
    let mut engine = build(&exp, &Placement::single()).unwrap();
    let start = engine.state_dict().unwrap();
    for step in 0..3 {
        engine.forward_backward(&batch(step), 1.0).unwrap();
        engine.optimizer_step(0.05, Some(0.9), None).unwrap();
    }
    let state = engine.state_dict().unwrap();
    // Trained: the weights moved and BatchNorm counted its batches.
    assert_ne!(state["0.weight"].data, start["0.weight"].data);
    assert_eq!(state["1.num_batches_tracked"].data, vec![3.0]);
    let input = batch(99);
    let logits = engine.predict(&input).unwrap();
    assert_eq!(logits.shape, vec![6, 5]);

    let dir = tempfile::tempdir().unwrap();
    let ckpt: Vec<(String, Vec<usize>, Vec<f32>)> = state
        .iter()
        .map(|(k, t)| (k.clone(), t.shape.clone(), t.data.clone()))
        .collect();
    write_safetensors(&dir.path().join("ckpt.safetensors"), &ckpt);
    write_safetensors(
        &dir.path().join("io.safetensors"),
        &[
            ("input".into(), vec![6, 3, 16, 16], input.images.clone()),
            ("logits".into(), logits.shape.clone(), logits.data.clone()),
        ],
    );
    std::fs::write(dir.path().join("layers.json"), LAYERS).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/declared_oracle.py");
    let out = Command::new(python)
        .arg(script)
        .args(["layers.json", "ckpt.safetensors", "io.safetensors", "1e-5"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{backend}: {text}");
    assert!(out.status.success(), "PyTorch disagrees:\n{text}");
    assert!(text.contains("loaded strictly"), "{text}");
}
