//! Extraction and validation, case by case; and the shipped config trees.

use super::*;
use crate::config::errors::ConfigError;
use crate::config::tree::Node;
use crate::config::yaml;
use rstest::rstest;

const GOOD: &str = "task_name: t
seed: 1
model:
  name: cnn
  num_classes: 10
  channels: [8, 16]
data:
  name: synthetic
  num_classes: 10
  image_size: 32
  batch_size: 64
  train_transforms:
    - random_crop: {size: 32, padding: 4}
    - horizontal_flip: {}
optimizer:
  name: sgd
  lr: 0.1
scheduler:
  name: onecycle
  max_lr: 0.1
trainer:
  strategy: single
  accelerator: cpu
  devices: 1
  precision: 32
  max_epochs: 2
  limit_train_batches: 10
  limit_val_batches: 0.5
callbacks:
  model_checkpoint:
    dirpath: out/ckpt
    monitor: val/acc1
    mode: max
logger:
  csv: {}
paths:
  root_dir: .
  data_dir: ./data
  log_dir: ./logs
  output_dir: ./out
";

fn parse(text: &str) -> Node {
    yaml::parse(text, "exp.yaml").unwrap().unwrap()
}

#[test]
fn a_good_experiment_extracts() {
    let e = extract(&parse(GOOD)).unwrap();
    assert!(e.model.name.is("cnn"));
    assert_eq!(e.trainer.precision, Precision::Full);
    assert_eq!(e.trainer.limit_train_batches, Limit::Batches(10));
    assert_eq!(e.trainer.limit_val_batches, Limit::Fraction(0.5));
    assert_eq!(
        e.data.train_transforms[1],
        Transform::HorizontalFlip { p: 0.5 }
    );
    assert_eq!(
        e.callbacks.model_checkpoint.unwrap().filename,
        "epoch_{epoch:03d}"
    );
    assert_eq!(e.trainer.devices, Devices::Count(1));
}

fn with(replace: &str, by: &str) -> String {
    assert!(GOOD.contains(replace), "{replace}");
    GOOD.replacen(replace, by, 1)
}

#[test]
fn hydra_node_is_ignored_and_null_sections_mean_none() {
    let text = with("logger:\n  csv: {}\n", "logger: null\nhydra:\n  sweeper:\n    params:\n      seed: 1,2\n")
            .replace("callbacks:\n  model_checkpoint:\n    dirpath: out/ckpt\n    monitor: val/acc1\n    mode: max\n", "callbacks: null\n");
    let e = extract(&parse(&text)).unwrap();
    assert_eq!(e.logger, LoggerConfig::default());
    assert_eq!(e.callbacks, CallbacksConfig::default());
}

#[rstest]
#[case(
    with("  max_epochs: 2", "  max_epoch: 2"),
    "Error in config key 'trainer.max_epoch': unknown key",
    "exp.yaml:26:14",
    "Did you mean 'trainer.max_epochs'?"
)]
#[case(
    with("  precision: 32", "  precision: 64"),
    "unknown precision '64'",
    "exp.yaml:25:14",
    "16-mixed"
)]
#[case(
    with("  name: sgd", "  name: sgdd"),
    "'sgdd' is not a valid choice",
    "exp.yaml:16:9",
    "Did you mean 'sgd'?"
)]
#[case(
    with("  batch_size: 64", "  batch_size: many"),
    "Error in config key 'data.batch_size' = many: expected",
    "exp.yaml:11:15",
    "string \"many\""
)]
#[case(
    with("  lr: 0.1\n", "  lr: ???\n"),
    "Missing mandatory value: optimizer.lr",
    "exp.yaml:17:7",
    "Set it with optimizer.lr=<value>"
)]
#[case(
    with("task_name: t\n", ""),
    "Error in config key 'task_name': missing",
    "",
    "+task_name=<value>"
)]
#[case(
    with("  channels: [8, 16]", "  channels: [8, 16]\n  patch_size: 16"),
    "Error in config key 'model.patch_size' = 16: model 'cnn' does not use this key (only vit do)",
    "exp.yaml:7:15",
    "Remove it"
)]
#[case(
    with("  num_classes: 10\n  channels", "  num_classes: 100\n  channels"),
    "the model predicts 100 classes but the data set has 10",
    "exp.yaml:5:16",
    "${data.num_classes}"
)]
#[case(
    with("  devices: 1", "  devices: 4"),
    "strategy single runs one process",
    "",
    "trainer=ddp"
)]
#[case(
    with("    - horizontal_flip: {}", "    - horizontal_flop: {}"),
    "'horizontal_flop' is not a valid choice",
    "exp.yaml:14:",
    "Did you mean 'horizontal_flip'?"
)]
#[case(
    with("  name: cnn", "  name: resnt18"),
    "unknown model 'resnt18' (did you mean 'resnet18'?)",
    "exp.yaml:4:9",
    "expected one of mlp, cnn, resnet18"
)]
#[case(
    with(
        "  name: cnn\n  num_classes: 10\n  channels: [8, 16]",
        "  name: resnet18\n  num_classes: 10\n  hidden: [8]"
    ),
    "model 'resnet18' does not use this key (only mlp do)",
    "exp.yaml:6:11",
    "Remove it"
)]
#[case(
    with(
        "  name: cnn\n  num_classes: 10\n  channels: [8, 16]",
        "  name: resnet18\n  num_classes: 10\n  dropout: 0.5"
    ),
    "resnet18 has no dropout before its head",
    "exp.yaml:6:12",
    "mlp, cnn, vit"
)]
#[case(
    with("  precision: 32", "  precision: bf16_mixed"),
    "unknown precision 'bf16_mixed' (did you mean 'bf16-mixed'?)",
    "exp.yaml:25:14",
    "32-true"
)]
#[case(
    with("  lr: 0.1\n", "  lr: 0.1\n  betas: [0.9, 0.99]\n"),
    "optimizer 'sgd' does not use this key (only adam, adamw do)",
    "exp.yaml:18:10",
    ""
)]
#[case(
    with("  lr: 0.1\n", "  lr: 0.1\n  nesterov: true\n"),
    "Nesterov momentum needs momentum > 0",
    "exp.yaml:18:13",
    "optimizer.momentum=0.9"
)]
#[case(
    with("  name: synthetic", "  name: synthetic\n  bogus: 1"),
    "Error in config key 'data.bogus': unknown key",
    "exp.yaml:9:10",
    "Known keys here: name, root"
)]
#[case(
    with("  devices: 1", "  devices: lots"),
    "devices must be a number or 'auto'",
    "",
    ""
)]
fn errors_name_key_place_and_fix(
    #[case] text: String,
    #[case] first: &str,
    #[case] place: &str,
    #[case] fix: &str,
) {
    let err = extract(&parse(&text)).unwrap_err().to_string();
    assert!(err.contains(first), "{err}");
    assert!(err.contains(place), "{err}");
    assert!(err.contains(fix), "{err}");
}

/// The shipped `conf/` and `experiments/` trees, composed and resolved by the real config engine, extract.
mod shipped {
    use super::*;
    use crate::config::compose::RunMode;
    use crate::config::grammar::parse_override;
    use crate::config::hydra::{compose_with_hydra, split_hydra};
    use crate::config::interpolate::{resolve_all, ResolveContext};
    use crate::config::repository::{Repository, SearchRoot};
    use crate::config::yaml;
    use rstest::rstest;
    use std::path::{Path, PathBuf};

    fn project() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    /// Compose `train` under `root` (conf/ + experiments/ as the `experiment` group), resolve, extract.
    fn run_in(root: &Path, overrides: &[&str]) -> Result<Experiment, ConfigError> {
        let repo = Repository::new(vec![
            SearchRoot {
                dir: root.join("conf"),
                mount: String::new(),
                provider: "main".into(),
            },
            SearchRoot {
                dir: root.join("experiments"),
                mount: "experiment".into(),
                provider: "project".into(),
            },
        ]);
        let overrides: Vec<_> = overrides
            .iter()
            .map(|o| parse_override(o).unwrap_or_else(|e| panic!("{o}: {e}")))
            .collect();
        let composed = compose_with_hydra(&repo, "train", &overrides, RunMode::Run)?;
        let (job, mut hydra) = split_hydra(composed.config);
        let pinned = yaml::parse("runtime:\n  output_dir: /tmp/run\n", "<test>").unwrap();
        hydra.merge(pinned.unwrap());
        let mut ctx = ResolveContext::from_process();
        ctx.env.remove("PROJECT_ROOT");
        ctx.hydra = Some(hydra);
        extract(&resolve_all(&job, &ctx)?)
    }

    fn run(overrides: &[&str]) -> Result<Experiment, ConfigError> {
        run_in(&project(), overrides)
    }

    fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                yaml_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                out.push(path);
            }
        }
    }

    #[test]
    fn every_shipped_yaml_file_parses_and_says_what_it_is_for() {
        let mut files = Vec::new();
        yaml_files(&project().join("conf"), &mut files);
        yaml_files(&project().join("experiments"), &mut files);
        assert!(files.len() >= 40, "{files:?}");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let shown = file.display().to_string();
            yaml::parse(&text, &shown).unwrap_or_else(|e| panic!("{shown}: {e}"));
            let comment = text
                .lines()
                .find(|l| !l.starts_with("# @package"))
                .unwrap_or_default();
            assert!(
                comment.starts_with("# ") && comment.len() > 8,
                "{shown}: no comment saying what it is for"
            );
        }
    }

    #[test]
    fn every_shipped_experiment_extracts() {
        let names: Vec<String> = std::fs::read_dir(project().join("experiments"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        assert!(names.len() >= 4, "{names:?}");
        for name in names {
            let e = run(&[&format!("experiment={name}")])
                .unwrap_or_else(|err| panic!("experiment={name}:\n{err}"));
            assert_ne!(
                e.task_name, "train",
                "experiment={name} should name its task"
            );
            assert!(!e.tags.is_empty(), "experiment={name} has no tags");
        }
    }

    #[rstest]
    #[case::plain(&[], |e: &Experiment| e.model.name.is("cnn") && e.task_name == "train" && e.seed == 42)]
    #[case::cifar(&["experiment=cifar"], |e: &Experiment| e.model.name.is("vit")
        && e.model.variant == Some(VitVariant::Base) && e.model.patch_size == Some(32)
        && e.model.image_size == Some(224) && e.data.name == DataName::Cifar10
        && e.trainer.strategy == Strategy::Ddp && e.trainer.precision == Precision::Mixed16
        && e.scheduler.name == SchedulerName::Onecycle && e.scheduler.max_lr == Some(0.03)
        && e.model.num_classes == 10 && e.logger.tensorboard.is_some())]
    #[case::imagenet(&["experiment=imagenet_resnet50"], |e: &Experiment| e.model.name.is("resnet50")
        && e.model.num_classes == 1000 && e.trainer.precision == Precision::MixedBf16
        && e.scheduler.name == SchedulerName::Step && !e.optimizer.nesterov && e.trainer.max_epochs == 90)]
    #[case::cinic(&["experiment=cinic_resnet152"], |e: &Experiment| e.model.name.is("resnet152") && e.model.cifar_stem
        && e.data.name == DataName::Cinic10)]
    #[case::quickstart(&["experiment=quickstart"], |e: &Experiment| e.trainer.accelerator == Accelerator::Cpu
        && e.trainer.max_epochs == 2 && e.data.name == DataName::Synthetic
        && e.callbacks.early_stopping.is_none() && e.callbacks.model_checkpoint.as_ref()
            .is_some_and(|c| c.dirpath == "/tmp/run/checkpoints"))]
    #[case::mlp_mnist(&["model=mlp", "data=mnist"], |e: &Experiment| e.model.hidden == Some(vec![512, 256]) && e.data.channels == 1)]
    #[case::resnet18_cifar(&["model=resnet18", "data=cifar10"], |e: &Experiment| e.model.name.is("resnet18"))]
    #[case::vit_synthetic(&["model=vit_b32"], |e: &Experiment| e.model.image_size == Some(32))]
    #[case::adam_cosine(&["optimizer=adam", "scheduler=cosine"], |e: &Experiment| e.optimizer.name == OptimizerName::Adam
        && e.scheduler.warmup_epochs == Some(1.0))]
    #[case::adamw_constant(&["optimizer=adamw", "scheduler=constant"], |e: &Experiment| e.optimizer.weight_decay == 0.05)]
    #[case::single(&["trainer=single"], |e: &Experiment| e.trainer.strategy == Strategy::Single && e.trainer.max_steps == -1)]
    #[case::dp(&["trainer=dp"], |e: &Experiment| e.trainer.strategy == Strategy::Dp && e.trainer.devices == Devices::Count(2))]
    #[case::ddp(&["trainer=ddp"], |e: &Experiment| e.trainer.devices == Devices::Auto
        && e.trainer.ddp.as_ref().is_some_and(|d| d.bucket_cap_mb == 25.0))]
    #[case::ddp_sim(&["trainer=ddp_sim"], |e: &Experiment| e.trainer.accelerator == Accelerator::Cpu
        && e.trainer.devices == Devices::Count(2) && e.trainer.process_group_backend == Some(ProcessGroupBackend::Gloo))]
    #[case::fsdp(&["trainer=fsdp"], |e: &Experiment| e.trainer.fsdp.as_ref().is_some_and(|f| f.sharding_strategy == ShardingStrategy::FullShard))]
    #[case::no_callbacks(&["callbacks=none", "logger=many"], |e: &Experiment| e.callbacks == CallbacksConfig::default()
        && e.logger.csv.is_some() && e.logger.tensorboard.is_some() && e.logger.console.is_some())]
    #[case::fdr(&["experiment=cifar", "debug=fdr"], |e: &Experiment| e.trainer.fast_dev_run == FastDevRun::Flag(true)
        && e.callbacks == CallbacksConfig::default() && e.logger == LoggerConfig::default())]
    #[case::limit_caps_an_experiment(&["experiment=imagenet_resnet50", "debug=limit"], |e: &Experiment| e.trainer.max_epochs == 3
        && e.trainer.limit_train_batches == Limit::Batches(5))]
    #[case::overfit(&["debug=overfit"], |e: &Experiment| e.trainer.overfit_batches == Limit0::Batches(3)
        && e.callbacks.early_stopping.is_none())]
    #[case::sweep_lr(&["sweep=lr"], |e: &Experiment| e.task_name == "sweep_lr")]
    #[case::sweep_bs(&["sweep=batch_size", "experiment=quickstart"], |e: &Experiment| e.task_name == "sweep_batch_size")]
    #[case::precision_alias(&["trainer.precision=bf16"], |e: &Experiment| e.trainer.precision == Precision::MixedBf16)]
    #[case::precision_int(&["trainer.precision=16"], |e: &Experiment| e.trainer.precision == Precision::Mixed16)]
    #[case::fast_dev_run_n(&["trainer.fast_dev_run=3", "trainer.limit_val_batches=0.25"], |e: &Experiment|
        e.trainer.fast_dev_run == FastDevRun::Batches(3) && e.trainer.limit_val_batches == Limit::Fraction(0.25))]
    fn shipped_configs_extract(#[case] overrides: &[&str], #[case] check: fn(&Experiment) -> bool) {
        let e = run(overrides).unwrap_or_else(|err| panic!("{overrides:?}:\n{err}"));
        assert!(check(&e), "{overrides:?}: {e:#?}");
    }

    #[rstest]
    #[case::unknown_key(&["+trainer.precison=bf16-mixed"],
        "Error in config key 'trainer.precison': unknown key\n    (set at override '+trainer.precison=bf16-mixed')\n    Did you mean 'trainer.precision'?")]
    #[case::bad_choice(&["trainer.strategy=sngle"],
        "Error in config key 'trainer.strategy': 'sngle' is not a valid choice\n    (set at override 'trainer.strategy=sngle')\n    Did you mean 'single'?\n    Valid choices: single, dp, ddp, fsdp")]
    #[case::wrong_type(&["data.batch_size=many"],
        "Error in config key 'data.batch_size' = many: expected")]
    #[case::wrong_type_place(&["data.batch_size=many"], "(set at override 'data.batch_size=many')")]
    #[case::missing_value(&["model.num_classes=???"],
        "Missing mandatory value: model.num_classes\n    (set at override 'model.num_classes=???')\n    Set it with model.num_classes=<value>")]
    #[case::missing_key(&["~task_name"], "Error in config key 'task_name': missing")]
    #[case::missing_key_fix(&["~task_name"], "+task_name=<value>")]
    #[case::wrong_for_model(&["model=resnet50", "+model.hidden=[64]"],
        "Error in config key 'model.hidden' = [64]: model 'resnet50' does not use this key (only mlp do)")]
    #[case::bad_transform(&["data.train_transforms=[{flip: {p: 0.5}}]"], "Valid choices: random_crop")]
    #[case::clip_algorithm(&["trainer.gradient_clip_algorithm=vlaue"], "Did you mean 'value'?")]
    #[case::class_mismatch(&["model.num_classes=100"], "the model predicts 100 classes but the data set has 10")]
    fn shipped_config_errors(#[case] overrides: &[&str], #[case] expected: &str) {
        let err = run(overrides).unwrap_err().to_string();
        assert!(
            err.contains(expected),
            "{overrides:?}:\n{err}\n--- expected to contain:\n{expected}"
        );
    }

    /// Errors in files point at the file, line and column (here: a copy of the shipped tree, edited).
    #[rstest]
    #[case::unknown_key(
        "conf/trainer/default.yaml",
        "precision: 32-true",
        "precison: 32-true",
        "Error in config key 'trainer.precison': unknown key",
        "conf/trainer/default.yaml:6:11",
        "Did you mean 'trainer.precision'?"
    )]
    #[case::missing(
        "conf/model/cnn.yaml",
        "channels: [32, 64, 128]",
        "channels: ???",
        "Missing mandatory value: model.channels",
        "conf/model/cnn.yaml:4:11",
        "Set it with model.channels=<value>"
    )]
    #[case::wrong_type(
        "conf/data/synthetic.yaml",
        "batch_size: 64",
        "batch_size: [64]",
        "Error in config key 'data.batch_size' = [64]: expected",
        "conf/data/synthetic.yaml:6:13",
        "found sequence"
    )]
    #[case::bad_choice(
        "conf/optimizer/sgd.yaml",
        "name: sgd",
        "name: SGD",
        "'SGD' is not a valid choice",
        "conf/optimizer/sgd.yaml:2:7",
        "Valid choices: sgd, adam, adamw"
    )]
    fn file_errors_point_at_the_line(
        #[case] file: &str,
        #[case] from: &str,
        #[case] to: &str,
        #[case] first: &str,
        #[case] place: &str,
        #[case] fix: &str,
    ) {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["conf", "experiments"] {
            copy_tree(&project().join(sub), &dir.path().join(sub));
        }
        let target = dir.path().join(file);
        let text = std::fs::read_to_string(&target).unwrap();
        assert!(text.contains(from), "{file} has no '{from}'");
        std::fs::write(&target, text.replacen(from, to, 1)).unwrap();
        let err = run_in(dir.path(), &[]).unwrap_err().to_string();
        assert!(err.contains(first), "{err}");
        assert!(
            err.contains(&format!("{place})")),
            "{err}\n--- expected place {place}"
        );
        assert!(err.contains(fix), "{err}");
    }

    fn copy_tree(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let path = entry.unwrap().path();
            let dest = to.join(path.file_name().unwrap());
            if path.is_dir() {
                copy_tree(&path, &dest);
            } else {
                std::fs::copy(&path, &dest).unwrap();
            }
        }
    }
}

/// `seed: null` or no `seed` (Lightning's "do not seed"): one is drawn for the run, below 2^32 (the ranks
/// agree on rank 0's through an f64); a given seed is kept.
#[test]
fn a_null_or_missing_seed_is_drawn() {
    for text in [with("seed: 1\n", "seed: null\n"), with("seed: 1\n", "")] {
        let e = extract(&parse(&text)).unwrap();
        assert!(e.seed_drawn && e.seed <= u64::from(u32::MAX), "{text}");
    }
    let e = extract(&parse(GOOD)).unwrap();
    assert!(!e.seed_drawn && e.seed == 1);
}
