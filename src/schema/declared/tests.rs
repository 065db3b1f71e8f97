use super::*;
use crate::config::yaml;
use rstest::rstest;

/// A whole experiment whose `model` is the YAML `model` (block style, indented under `model:`).
fn experiment_text(model: &str) -> String {
    format!(
        "task_name: t\nseed: 3\nmodel:\n{model}\
         data: {{name: synthetic, num_classes: 4, image_size: 8, batch_size: 4}}\n\
         optimizer: {{name: sgd, lr: 0.1}}\nscheduler: {{name: constant}}\n\
         trainer: {{strategy: single, devices: 1, accelerator: cpu, precision: 32, max_epochs: 1}}\n\
         paths: {{root_dir: ., data_dir: d, log_dir: l, output_dir: o}}\n"
    )
}

fn extract(model: &str) -> Result<crate::schema::Experiment, ConfigError> {
    let node = yaml::parse(&experiment_text(model), "t.yaml")
        .unwrap()
        .unwrap();
    crate::schema::extract(&node)
}

const SMALL: &str = "  name: declared\n  num_classes: 4\n  layers:\n\
    \x20   - {type: Conv2d, out_channels: 8, kernel_size: 3, padding: 1}\n\
    \x20   - {type: ReLU}\n\
    \x20   - {type: AdaptiveAvgPool2d, output_size: 1}\n\
    \x20   - {type: Flatten}\n\
    \x20   - {type: Linear, out_features: 4}\n";

#[test]
fn a_declared_model_reads_its_layers_with_their_arguments() {
    let exp = extract(SMALL).unwrap();
    let spec = exp.model.declared.expect("declared layers");
    let kinds: Vec<&LayerKind> = spec.layers.iter().map(|l| &l.kind).collect();
    assert_eq!(
        kinds[0],
        &LayerKind::Conv2d {
            in_channels: None,
            out_channels: 8,
            kernel_size: 3,
            stride: 1,
            padding: 1,
            bias: true
        }
    );
    assert_eq!(kinds[1], &LayerKind::ReLU);
    assert_eq!(kinds[2], &LayerKind::AdaptiveAvgPool2d { output_size: 1 });
    assert_eq!(
        kinds[4],
        &LayerKind::Linear {
            in_features: None,
            out_features: 4,
            bias: true
        }
    );
    assert_eq!(spec.layers[4].key, "model.layers.4");
    assert!(
        spec.layers[4].origin.contains("t.yaml:"),
        "{}",
        spec.layers[4].origin
    );
}

#[test]
fn blocks_take_arguments_and_repeat_makes_a_sequential_of_copies() {
    let model = "  name: declared\n  num_classes: 4\n  width: 6\n  blocks:\n    res:\n\
        \x20     args: {planes: 2}\n      type: Residual\n      body:\n\
        \x20       - {type: Conv2d, out_channels: $planes, kernel_size: 3, padding: 1}\n\
        \x20       - {type: BatchNorm2d, eps: 0.001}\n\
        \x20 layers:\n\
        \x20   - {block: res, planes: 3, repeat: 2}\n\
        \x20   - {_target_: torch.nn.Flatten}\n\
        \x20   - {type: Linear, out_features: 4}\n";
    let spec = extract(model).unwrap().model.declared.unwrap();
    let LayerKind::Sequential(copies) = &spec.layers[0].kind else {
        panic!("{:?}", spec.layers[0].kind)
    };
    assert_eq!(copies.len(), 2);
    let LayerKind::Residual { body, shortcut } = &copies[1].kind else {
        panic!("{:?}", copies[1].kind)
    };
    assert!(shortcut.is_none());
    assert!(matches!(
        body[0].kind,
        LayerKind::Conv2d {
            out_channels: 3,
            ..
        }
    ));
    assert!(matches!(body[1].kind, LayerKind::BatchNorm2d { eps, .. } if eps == 0.001));
    assert_eq!(body[0].key, "model.layers.0 → model.blocks.res.body.0");
    assert_eq!(
        spec.layers[1].kind,
        LayerKind::Flatten {
            start_dim: 1,
            end_dim: -1
        }
    );
}

#[test]
fn a_block_argument_left_out_takes_its_default() {
    let model = "  name: declared\n  num_classes: 4\n  blocks:\n    c:\n\
        \x20     args: {planes: 5}\n      type: Conv2d\n      out_channels: $planes\n      kernel_size: 1\n\
        \x20 layers:\n    - {block: c}\n    - {type: Flatten}\n    - {type: Linear, out_features: 4}\n";
    let spec = extract(model).unwrap().model.declared.unwrap();
    assert!(matches!(
        spec.layers[0].kind,
        LayerKind::Conv2d {
            out_channels: 5,
            ..
        }
    ));
}

/// Each bad input: one error naming the key, the place (t.yaml:line) and a fix.
#[rstest]
#[case::unknown_layer(
    "    - {type: Conv2D, out_channels: 8, kernel_size: 3}\n",
    &["model.layers.0.type", "unknown layer 'Conv2D'", "Did you mean 'Conv2d'?", "t.yaml:8"]
)]
#[case::unknown_argument(
    "    - {type: Conv2d, out_channels: 8, kernal_size: 3}\n",
    &["model.layers.0.kernal_size", "Conv2d has no argument 'kernal_size'", "Did you mean 'kernel_size'?", "t.yaml:8"]
)]
#[case::missing_argument(
    "    - {type: Conv2d, kernel_size: 3}\n",
    &["model.layers.0", "Conv2d needs `out_channels`", "t.yaml:8"]
)]
#[case::wrong_type(
    "    - {type: Conv2d, out_channels: wide, kernel_size: 3}\n",
    &["model.layers.0.out_channels", "expected a non-negative integer", "'wide'", "t.yaml:8"]
)]
#[case::no_type(
    "    - {out_channels: 8}\n",
    &["model.layers.0", "a layer needs `type`", "t.yaml:8"]
)]
#[case::unsupported_value(
    "    - {type: Conv2d, out_channels: 8, kernel_size: 3, groups: 2}\n",
    &["model.layers.0.groups", "groups=2 is not supported", "t.yaml:8"]
)]
#[case::non_square(
    "    - {type: MaxPool2d, kernel_size: [2, 3]}\n",
    &["model.layers.0.kernel_size", "only square windows", "t.yaml:8"]
)]
#[case::unknown_block(
    "    - {block: basik}\n",
    &["model.layers.0.block", "no block 'basik'", "Did you mean 'basic'?", "t.yaml:8"]
)]
#[case::unknown_block_argument(
    "    - {block: basic, plaens: 4}\n",
    &["model.layers.0.plaens", "block 'basic' has no argument 'plaens'", "Did you mean 'planes'?", "t.yaml:8"]
)]
#[case::repeat_zero(
    "    - {block: basic, repeat: 0}\n",
    &["model.layers.0.repeat", "at least 1", "t.yaml:8"]
)]
#[case::nested_error_names_the_whole_path(
    "    - type: Residual\n      body:\n        - {type: ReLU}\n        - {type: Lineer, out_features: 3}\n",
    &["model.layers.0.body.1.type", "Did you mean 'Linear'?", "t.yaml:11"]
)]
#[case::dropout_out_of_range(
    "    - {type: Dropout, p: 1.5}\n",
    &["model.layers.0.p", "outside [0, 1)"]
)]
fn bad_layers_fail_with_the_key_the_place_and_a_fix(#[case] layers: &str, #[case] wanted: &[&str]) {
    let model = format!(
        "  name: declared\n  num_classes: 4\n  blocks:\n    basic:\n      args: {{planes: 2}}\n      type: ReLU\n  layers:\n{layers}"
    );
    // The layers start on line 8 of t.yaml (after task_name, seed, model:, name, num_classes, blocks, layers:).
    let model = model.replacen(
        "  blocks:\n    basic:\n      args: {planes: 2}\n      type: ReLU\n",
        "  blocks: {basic: {args: {planes: 2}, type: ReLU}}\n",
        1,
    );
    let err = extract(&model).unwrap_err().to_string();
    for w in wanted {
        assert!(err.contains(w), "missing {w:?} in:\n{err}");
    }
}

#[test]
fn a_block_that_uses_an_argument_nobody_gives_is_refused() {
    let model = "  name: declared\n  num_classes: 4\n  blocks: {c: {type: Conv2d, out_channels: $width, kernel_size: 1}}\n\
        \x20 layers:\n    - {block: c}\n";
    let err = extract(model).unwrap_err().to_string();
    assert!(err.contains("uses $width but no value is given"), "{err}");
}

#[test]
fn a_block_that_uses_itself_is_refused_not_followed_forever() {
    let model = "  name: declared\n  num_classes: 4\n  blocks: {loop: {type: Sequential, layers: [{block: loop}]}}\n\
        \x20 layers:\n    - {block: loop}\n";
    let err = extract(model).unwrap_err().to_string();
    assert!(err.contains("does it use itself?"), "{err}");
}

#[rstest]
#[case::no_layers("  name: declared\n  num_classes: 4\n", "needs `layers`")]
#[case::typo_of_layers(
    "  name: declared\n  num_classes: 4\n  layres: []\n  layers: [{type: Flatten}]\n",
    "Did you mean 'model.layers'?"
)]
#[case::layers_on_a_zoo_model("  name: cnn\n  num_classes: 4\n  layers: []\n", "unknown key")]
fn a_model_node_in_the_wrong_shape_is_refused(#[case] model: &str, #[case] wanted: &str) {
    let err = extract(model).unwrap_err().to_string();
    assert!(err.contains(wanted), "missing {wanted:?} in:\n{err}");
}

#[test]
fn free_keys_of_a_declared_model_are_variables_not_errors() {
    // A zoo-only key (the quick start's `channels`) on a declared model is one of its variables.
    let model = format!("{SMALL}  channels: [16, 32]\n  width: 8\n");
    assert!(extract(&model).is_ok());
}
