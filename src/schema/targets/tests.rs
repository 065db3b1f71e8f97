//! `translate`'s tables: what each known target becomes, and what is refused with its line.

use super::*;
use crate::config::yaml;
use rstest::rstest;

fn translated(text: &str) -> Result<serde_json::Value, ConfigError> {
    let mut node = yaml::parse(text, "t.yaml").unwrap().unwrap();
    translate(&mut node)?;
    Ok(node.to_json())
}

#[rstest]
#[case::trainer_defaults(
    "trainer: {_target_: lightning.pytorch.trainer.Trainer, default_root_dir: /x, min_epochs: 1, max_epochs: 3, devices: 1}",
    "trainer",
    r#"{"min_epochs":1,"max_epochs":3,"devices":1,"accelerator":"auto","precision":"32-true","strategy":"single"}"#
)]
#[case::trainer_ddp_spawn(
    "trainer: {_target_: pytorch_lightning.Trainer, strategy: ddp_spawn, devices: 2, max_epochs: 1, benchmark: true}",
    "trainer",
    r#"{"strategy":"ddp","devices":2,"max_epochs":1,"cudnn_benchmark":true,"accelerator":"auto","precision":"32-true"}"#
)]
#[case::callbacks_renamed(
    "callbacks: {ckpt: {_target_: lightning.pytorch.callbacks.ModelCheckpoint, dirpath: null, verbose: false, save_last: null, monitor: val/acc1}, bar: {_target_: lightning.pytorch.callbacks.RichProgressBar}, summary: {_target_: lightning.pytorch.callbacks.RichModelSummary, max_depth: -1}}",
    "callbacks",
    r#"{"model_checkpoint":{"monitor":"val/acc1","save_last":false,"dirpath":"checkpoints"},"model_summary":{"max_depth":100}}"#
)]
#[case::csv_logger(
    "logger: {csv: {_target_: lightning.pytorch.loggers.csv_logs.CSVLogger, save_dir: /out, name: csv/, prefix: ''}}",
    "logger",
    r#"{"csv":{}}"#
)]
#[case::plateau(
    "scheduler: {_target_: torch.optim.lr_scheduler.ReduceLROnPlateau, _partial_: true, mode: min, factor: 0.1, patience: 10}",
    "scheduler",
    r#"{"mode":"min","factor":0.1,"patience":10,"name":"plateau"}"#
)]
#[case::adam(
    "optimizer: {_target_: torch.optim.Adam, _partial_: true, lr: 0.001, weight_decay: 0.0}",
    "optimizer",
    r#"{"lr":0.001,"weight_decay":0.0,"name":"adam"}"#
)]
#[case::cosine(
    "scheduler: {_target_: torch.optim.lr_scheduler.CosineAnnealingLR, T_max: 10, eta_min: 0.0001}",
    "scheduler",
    r#"{"min_lr":0.0001,"name":"cosine"}"#
)]
#[case::simple_profiler(
    "trainer: {_target_: lightning.pytorch.trainer.Trainer, max_epochs: 1, profiler: {_target_: lightning.pytorch.profilers.SimpleProfiler, dirpath: null, filename: perf}}",
    "trainer",
    r#"{"max_epochs":1,"profiler":{"dirpath":null,"filename":"perf","name":"simple"},"accelerator":"auto","precision":"32-true","devices":"auto","strategy":"ddp"}"#
)]
#[case::clip_by_value(
    "trainer: {_target_: lightning.pytorch.trainer.Trainer, max_epochs: 1, gradient_clip_val: 0.5, gradient_clip_algorithm: value}",
    "trainer",
    r#"{"max_epochs":1,"gradient_clip_val":0.5,"gradient_clip_algorithm":"value","accelerator":"auto","precision":"32-true","devices":"auto","strategy":"ddp"}"#
)]
#[case::pass_through_profiler(
    "trainer: {_target_: lightning.pytorch.trainer.Trainer, max_epochs: 1, profiler: {_target_: pytorch_lightning.profilers.PassThroughProfiler}}",
    "trainer",
    r#"{"max_epochs":1,"profiler":null,"accelerator":"auto","precision":"32-true","devices":"auto","strategy":"ddp"}"#
)]
#[case::timm_vit(
    "model: {_target_: timm.create_model, model_name: vit_base_patch32_224, num_classes: 10}",
    "model",
    r#"{"num_classes":10,"name":"vit","variant":"base","patch_size":32,"image_size":224}"#
)]
#[case::torchvision_resnet(
    "model: {_target_: torchvision.models.resnet50, num_classes: 10, weights: null, progress: false}",
    "model",
    r#"{"num_classes":10,"name":"resnet50"}"#
)]
#[case::torchvision_defaults(
    "model: {_target_: torchvision.models.resnet18, num_classes: 10, pretrained: false, groups: 1, width_per_group: 64, norm_layer: null}",
    "model",
    r#"{"num_classes":10,"name":"resnet18"}"#
)]
#[case::torchvision_vit(
    "model: {_target_: torchvision.models.vit_b_32, num_classes: 10, weights: null, progress: false, attention_dropout: 0.0}",
    "model",
    r#"{"num_classes":10,"name":"vit","variant":"base","patch_size":32,"image_size":224}"#
)]
#[case::torchvision_vit_at_cifar_size(
    "model: {_target_: torchvision.models.vit_b_16, num_classes: 10, image_size: 32, dropout: 0.0}",
    "model",
    r#"{"num_classes":10,"image_size":32,"name":"vit","variant":"base","patch_size":16}"#
)]
#[case::torchvision_vit_legacy_arguments(
    "model: {_target_: torchvision.models.vit_b_16, num_classes: 10, pretrained: false, patch_size: 16, variant: base}",
    "model",
    r#"{"num_classes":10,"patch_size":16,"variant":"base","name":"vit","image_size":224}"#
)]
#[case::torchvision_partial(
    "model: {_target_: torchvision.models.resnet18, _partial_: true, num_classes: 10}",
    "model",
    r#"{"num_classes":10,"name":"resnet18"}"#
)]
#[case::torchvision_keeps_our_keys(
    "model: {_target_: torchvision.models.resnet18, num_classes: 10, cifar_stem: true}",
    "model",
    r#"{"num_classes":10,"cifar_stem":true,"name":"resnet18"}"#
)]
fn known_targets_map_onto_the_schema(
    #[case] text: &str,
    #[case] section: &str,
    #[case] expected: &str,
) {
    let out = translated(text).unwrap();
    let expected: serde_json::Value = serde_json::from_str(expected).unwrap();
    assert_eq!(out[section], expected);
}

#[rstest]
#[case::user_model(
    "model: {_target_: src.models.cifar_module.CifarLitModule}\n",
    "is Python code of your project"
)]
#[case::user_data(
    "data: {_target_: src.data.cifar_datamodule.CIFARDataModule}\n",
    "is Python code of your project"
)]
#[case::unknown_trainer(
    "trainer: {_target_: my.Trainer}\n",
    "my.Trainer is not one trainyard knows"
)]
#[case::unknown_callback(
    "callbacks: {x: {_target_: lightning.pytorch.callbacks.Foo}}\n",
    "Known here"
)]
#[case::mlflow_prefix(
    "logger: {m: {_target_: lightning.pytorch.loggers.mlflow.MLFlowLogger, prefix: x}}\n",
    "logger.mlflow.prefix=x"
)]
#[case::advanced_profiler(
    "trainer: {_target_: lightning.pytorch.trainer.Trainer, profiler: {_target_: lightning.pytorch.profilers.AdvancedProfiler}}\n",
    "cProfile"
)]
#[case::weights_only("callbacks: {c: {_target_: lightning.pytorch.callbacks.ModelCheckpoint, save_weights_only: true}}\n", "optimizer state")]
#[case::plateau_min_lrs(
    "scheduler: {_target_: torch.optim.lr_scheduler.ReduceLROnPlateau, min_lr: [0.1, 0.2]}\n",
    "one floor per parameter group"
)]
#[case::timm_download(
    "model: {_target_: timm.create_model, model_name: resnet50, pretrained: true}\n",
    "does not download"
)]
#[case::torchvision_download(
    "model: {_target_: torchvision.models.resnet18, weights: IMAGENET1K_V1}\n",
    "does not do"
)]
#[case::torchvision_typo(
    "model: {_target_: torchvision.models.resnet19}\n",
    "Did you mean 'torchvision.models.resnet18'?"
)]
#[case::torchvision_elsewhere(
    "model: {_target_: torchvision.models.vgg16}\n",
    "not one of the zoo's architectures"
)]
#[case::torchvision_vit_large(
    "model: {_target_: torchvision.models.vit_l_16}\n",
    "ViT-L and ViT-H are not built here"
)]
#[case::torchvision_vit_typo(
    "model: {_target_: torchvision.models.vit_b_23}\n",
    "Did you mean 'torchvision.models.vit_b_32'?"
)]
#[case::torchvision_vit_attention_dropout(
    "model: {_target_: torchvision.models.vit_b_16, attention_dropout: 0.1}\n",
    "model.attention_dropout"
)]
#[case::torchvision_vit_dropout(
    "model: {_target_: torchvision.models.vit_b_32, dropout: 0.1}\n",
    "model.dropout"
)]
#[case::torchvision_vit_download(
    "model: {_target_: torchvision.models.vit_b_16, weights: IMAGENET1K_V1}\n",
    "does not do"
)]
#[case::torchvision_resnext(
    "model: {_target_: torchvision.models.resnet50, groups: 32, width_per_group: 4}\n",
    "model.groups"
)]
#[case::torchvision_pretrained(
    "model: {_target_: torchvision.models.resnet50, pretrained: true}\n",
    "does not do"
)]
#[case::torchvision_vit_other_patch(
    "model: {_target_: torchvision.models.vit_b_16, patch_size: 8}\n",
    "Error in config key 'model.patch_size' = 8: torchvision.models.vit_b_16 is ViT-B/16"
)]
#[case::torchvision_vit_other_variant(
    "model: {_target_: torchvision.models.vit_b_32, variant: tiny}\n",
    "model.variant"
)]
#[case::torchvision_vit_pretrained(
    "model: {_target_: torchvision.models.vit_b_32, pretrained: true}\n",
    "vit_base_patch32.safetensors"
)]
#[case::partial_not_a_flag(
    "model: {_target_: torchvision.models.resnet18, _partial_: 'yes'}\n",
    "Error in config key 'model._partial_': expected true or false, got yes"
)]
#[case::partial_of_a_callback(
    "callbacks: {c: {_target_: lightning.pytorch.callbacks.ModelCheckpoint, _partial_: 1}}\n",
    "'callbacks.c._partial_': expected true or false, got 1"
)]
#[case::optimizer_asked_whole(
    "optimizer: {_target_: torch.optim.Adam, _partial_: false, lr: 0.1}\n",
    "optimizer._partial_': _target_ torch.optim.Adam is completed later with what only the run has (the model's parameters)"
)]
#[case::scheduler_asked_whole(
    "scheduler: {_target_: torch.optim.lr_scheduler.CosineAnnealingLR, _partial_: false, T_max: 10}\n",
    "it cannot be built whole"
)]
#[case::two_checkpoints("callbacks: {a: {_target_: lightning.pytorch.callbacks.ModelCheckpoint}, b: {_target_: lightning.pytorch.callbacks.ModelCheckpoint}}\n", "already configured")]
fn refused_targets_name_the_line(#[case] text: &str, #[case] expected: &str) {
    let err = translated(text).unwrap_err().to_string();
    assert!(err.contains(expected), "{err}");
    assert!(err.contains("t.yaml:1:"), "file and line: {err}");
}
