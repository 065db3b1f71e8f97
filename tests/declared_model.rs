//! Declared models (`model.name: declared`, torch.nn layers in YAML) end to end from the command line:
//! they train on every strategy, resume exactly, compose like any config (blocks from a group, overrides
//! of a layer's argument), and bad input fails before training with the key and the file:line.

mod common;
use common::{real_project, summary, train};
use rstest::rstest;
use std::path::{Path, PathBuf};

/// A small declared network: a conv stem, a residual block chosen from `model/block/`, a strided block
/// with a shortcut, global pooling and a linear head (every structural form once).
const TINY: &str = "\
defaults:
  - block@blocks.basic: basic
  - _self_
name: declared
num_classes: ${data.num_classes}
width: 8
layers:
  - {type: Conv2d, out_channels: \"${model.width}\", kernel_size: 3, padding: 1, bias: false}
  - {type: BatchNorm2d}
  - {type: ReLU}
  - {block: basic, planes: \"${model.width}\"}
  - {type: ReLU}
  - type: Residual
    body:
      - {type: Conv2d, out_channels: 16, kernel_size: 3, stride: 2, padding: 1}
      - {type: ReLU}
    shortcut:
      - {type: Conv2d, out_channels: 16, kernel_size: 1, stride: 2}
  - {type: MaxPool2d, kernel_size: 2}
  - {type: AdaptiveAvgPool2d, output_size: 1}
  - {type: Flatten}
  - {type: Dropout, p: 0.1}
  - {type: Linear, out_features: \"${model.num_classes}\"}
";

/// The quick start on the tiny declared model, small and fast.
const SMALL: &[&str] = &[
    "experiment=quickstart",
    "model=tiny",
    "data.train_size=1024",
    "data.val_size=128",
    "trainer.max_epochs=3",
    "data.batch_size=32",
    "data.num_workers=0",
    "callbacks.model_summary=null",
];

fn project() -> tempfile::TempDir {
    let p = real_project();
    std::fs::write(p.path().join("conf/model/tiny.yaml"), TINY).unwrap();
    p
}

/// Run `train` with SMALL and `extra` into `root/dir`; panics with the output when it fails.
fn run(root: &Path, dir: &str, extra: &[&str]) -> PathBuf {
    common::run_with(root, dir, SMALL, extra)
}

/// It learns: 10 classes (chance 0.1), and its weights moved from where they started.
fn assert_learned(run: &Path) {
    let s = summary(run);
    let acc = s["final_metrics"]["val/acc1"].as_f64().unwrap();
    assert!(acc > 0.5, "val/acc1 {acc} is not far above chance: {s}");
    let loss = s["final_metrics"]["train/loss"].as_f64().unwrap();
    assert!(
        loss < 1.5,
        "train/loss {loss} is not well below chance (2.30): {s}"
    );
}

#[rstest]
#[case::single(&[])]
#[case::data_parallel(&["trainer=dp_sim"])]
#[case::bf16(&["trainer.precision=bf16-mixed"])]
#[cfg_attr(feature = "torch", case::tch(&["backend=tch"]))]
#[cfg_attr(feature = "torch", case::ddp(&["trainer=ddp_sim", "data.batch_size=16"]))]
#[cfg_attr(
    feature = "torch",
    case::fsdp(&["trainer=fsdp_sim", "data.batch_size=16", "trainer.fsdp.sharding_strategy=FULL_SHARD"])
)]
#[cfg_attr(feature = "torch", case::tch_bf16(&["backend=tch", "trainer.precision=bf16-mixed"]))]
fn a_declared_model_learns_on_every_strategy(#[case] extra: &[&str]) {
    let p = project();
    let run = run(p.path(), "run", extra);
    assert_learned(&run);
    let s = summary(&run);
    // It ran as asked: the strategy and the devices, not a silent fall-back to one device.
    let strategy = extra
        .iter()
        .find_map(|a| a.strip_prefix("trainer="))
        .map_or("single", |t| t.trim_end_matches("_sim"));
    assert_eq!(s["strategy"], strategy, "{s}");
    let devices = if strategy == "single" { 1 } else { 2 };
    assert_eq!(s["devices"], devices, "{s}");
    // Parameters of TINY: conv 216, bn 16, block 2x(576+16), residual 1152+16, shortcut 128+16, head 170.
    assert_eq!(
        s["num_parameters"],
        216 + 16 + 2 * (576 + 16) + 1152 + 16 + 128 + 16 + 170,
        "{s}"
    );
}

/// The checkpoint holds nn.Sequential's names, and a run resumed from its first epoch's checkpoint
/// continues where it stopped: only the later epochs run, and it ends where the uninterrupted run ends.
#[test]
fn a_declared_model_checkpoints_under_sequential_names_and_resumes_exactly() {
    let p = project();
    let keep_all = [
        "callbacks.model_checkpoint.save_top_k=-1",
        "callbacks.model_checkpoint.monitor=null",
    ];
    let straight = run(p.path(), "straight", &keep_all);
    let names: Vec<String> = common::weights(&straight).into_keys().collect();
    for want in [
        "0.weight",
        "1.running_var",
        "3.body.0.weight",
        "3.body.1.num_batches_tracked",
        "5.body.0.bias",
        "5.shortcut.0.weight",
        "10.weight",
        "10.bias",
    ] {
        assert!(names.iter().any(|n| n == want), "no {want} in {names:?}");
    }
    let ckpt = format!(
        "ckpt_path={}",
        straight.join("checkpoints/epoch_000.safetensors").display()
    );
    let resumed = run(p.path(), "resumed", &[keep_all[0], keep_all[1], &ckpt]);
    let epochs: Vec<f64> = common::csv_rows(&resumed)
        .iter()
        .filter_map(|row| row.iter().find(|(k, _)| k == "epoch").map(|(_, v)| *v))
        .collect();
    assert!(
        !epochs.is_empty() && epochs.iter().all(|&e| e >= 1.0),
        "the resumed run must run the later epochs only: {epochs:?}"
    );
    let (a, b) = (common::weights(&straight), common::weights(&resumed));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (name, t) in &a {
        assert_eq!(
            t.data, b[name].data,
            "{name} differs from the uninterrupted run"
        );
    }
}

/// Overrides reach into the layer list like into any config node.
#[test]
fn a_layer_argument_and_a_block_repeat_are_overridable_from_the_command_line() {
    let p = project();
    let run = run(
        p.path(),
        "wide",
        &[
            "model.layers.5.body.0.out_channels=24",
            "model.layers.5.shortcut.0.out_channels=24",
            "+model.layers.3.repeat=2",
            "trainer.max_epochs=1",
        ],
    );
    let names: Vec<String> = common::weights(&run).into_keys().collect();
    assert!(names.iter().any(|n| n == "3.1.body.0.weight"), "{names:?}");
    let w = &common::weights(&run)["5.body.0.weight"];
    assert_eq!(w.shape, vec![24, 8, 3, 3]);
}

/// Bad input: one clear error before any training, naming the key, the file:line (or override) and a fix.
#[rstest]
#[case::unknown_layer(&["model.layers.2.type=Relu"], &["model.layers.2.type", "unknown layer 'Relu'", "Did you mean 'ReLU'?", "model.layers.2.type=Relu"])]
#[case::unknown_argument(&["+model.layers.0.kernal=3"], &["model.layers.0.kernal", "Conv2d has no argument 'kernal'", "Did you mean 'kernel_size'?"])]
#[case::missing_argument(&["~model.layers.10.out_features"], &["model.layers.10", "Linear needs `out_features`", "tiny.yaml:23"])]
#[case::shapes(&["model.layers.5.shortcut.0.stride=1"], &["model.layers.5", "Residual '5'", "its body gives [16, 16, 16] but its shortcut gives [16, 32, 32]", "tiny.yaml:13"])]
#[case::in_block(&["+model.blocks.basic.body.1.num_features=3"], &["model.layers.3 → model.blocks.basic.body.1", "num_features is 3 but its input has 8 channels"])]
#[case::wrong_head(&["model.layers.10.out_features=7"], &["model.layers.10", "gives [7] per image, but model.num_classes is 10"])]
fn bad_declared_models_fail_before_training(#[case] extra: &[&str], #[case] wanted: &[&str]) {
    let p = project();
    let mut args: Vec<&str> = SMALL.to_vec();
    args.extend_from_slice(extra);
    let out = train(p.path(), &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    for w in wanted {
        assert!(err.contains(w), "missing {w:?} in:\n{err}");
    }
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        !p.path().join("logs/quickstart/runs").exists()
            || std::fs::read_dir(p.path().join("logs/quickstart/runs"))
                .unwrap()
                .flatten()
                .all(|d| !d.path().join("metrics.csv").exists()),
        "no training may start"
    );
}

/// The shipped `declared_resnet18` is torchvision's CIFAR ResNet-18: the built-in's parameter count.
#[test]
fn declared_resnet18_has_the_built_in_resnet18_parameter_count() {
    let p = real_project();
    let tiny = [
        "experiment=quickstart",
        "data.train_size=16",
        "data.val_size=8",
        "data.batch_size=8",
        "data.num_workers=0",
        "trainer.max_epochs=1",
        // One step and no validation: only the summary's parameter count is read (two whole epochs
        // of a ResNet-18 in the debug build took 30 s).
        "trainer.limit_train_batches=1",
        "trainer.limit_val_batches=0",
        "callbacks.model_summary=null",
    ];
    let count = |dir: &str, model: &[&str]| {
        let mut args: Vec<&str> = tiny.to_vec();
        args.extend_from_slice(model);
        let run_dir = format!("hydra.run.dir={dir}");
        args.push(&run_dir);
        let out = train(p.path(), &args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        summary(&p.path().join(dir))["num_parameters"]
            .as_u64()
            .unwrap()
    };
    let declared = count("declared", &["model=declared_resnet18"]);
    let builtin = count(
        "builtin",
        &["model=resnet18", "model.cifar_stem=true", "~model.channels"],
    );
    assert_eq!(declared, builtin);
    assert_eq!(
        declared, 11_173_962,
        "torchvision's resnet18(num_classes=10)"
    );
}

/// `model.pretrained` on a declared model: every weight loads from another run's checkpoint except the
/// classifier head (the last layer with parameters), left as initialised when the class count differs.
#[test]
fn a_declared_model_starts_from_pretrained_weights_with_a_new_head() {
    let p = project();
    let source = run(p.path(), "source", &["trainer.max_epochs=1"]);
    let ckpt = source.join("checkpoints/last.safetensors");
    let pretrained = format!("+model.pretrained={}", ckpt.display());
    let args = [
        pretrained.as_str(),
        "data.num_classes=4",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=1",
        "optimizer.lr=1e-9",
    ];
    let tuned = run(p.path(), "tuned", &args);
    let log = std::fs::read_to_string(tuned.join("train.log")).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("newly initialised:"))
        .unwrap_or_else(|| panic!("no pretrained line in:\n{log}"));
    let mut kept: Vec<&str> = line
        .rsplit("newly initialised: ")
        .next()
        .unwrap()
        .split(", ")
        .collect();
    kept.sort_unstable();
    assert_eq!(kept, ["10.bias", "10.weight"], "{line}");
    let (before, after) = (common::weights(&source), common::weights(&tuned));
    assert_eq!(after["10.weight"].shape, vec![4, 16]);
    // One step at lr 1e-9 leaves every loaded parameter where the source run left it (BatchNorm's
    // running statistics move with any training step, so they are not compared).
    let mut compared = 0;
    for (name, b) in &before {
        let buffer = name.contains("running_") || name.ends_with("num_batches_tracked");
        if name.starts_with("10.") || name.starts_with("optimizer.") || buffer {
            continue;
        }
        let a = &after[name];
        assert_eq!(a.shape, b.shape, "{name}");
        let moved = b
            .data
            .iter()
            .zip(&a.data)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(moved < 1e-6, "{name} was not loaded: moved {moved}");
        compared += 1;
    }
    assert!(compared >= 10, "only {compared} parameters compared");
}
