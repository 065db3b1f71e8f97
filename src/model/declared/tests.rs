use super::*;
use crate::testing::experiment;
use rstest::rstest;

/// A declared model over 8x8 RGB images with 4 classes.
fn declared(layers: &str) -> anyhow::Result<Declared> {
    let exp = experiment(
        &format!("{{name: declared, num_classes: 4, layers: {layers}}}"),
        "{name: sgd, lr: 0.1}",
        "{strategy: single, devices: 1}",
        4,
    );
    Declared::new(exp.model.declared.as_ref().unwrap(), 3, 8, 4)
}

const RESIDUAL: &str = "[{type: Conv2d, out_channels: 8, kernel_size: 3, padding: 1, bias: false}, \
    {type: BatchNorm2d}, {type: ReLU}, \
    {type: Residual, body: [{type: Conv2d, out_channels: 16, kernel_size: 3, stride: 2, padding: 1}], \
     shortcut: [{type: Conv2d, out_channels: 16, kernel_size: 1, stride: 2, bias: false}, {type: BatchNorm2d}]}, \
    {type: ReLU}, {type: MaxPool2d, kernel_size: 2}, {type: AdaptiveAvgPool2d, output_size: 1}, \
    {type: Flatten}, {type: Dropout, p: 0.1}, {type: Linear, out_features: 4}]";

#[test]
fn shapes_are_inferred_from_the_data_and_names_follow_nn_sequential() {
    let m = declared(RESIDUAL).unwrap();
    let names: Vec<(String, Vec<usize>)> =
        m.specs().into_iter().map(|s| (s.name, s.shape)).collect();
    let want: Vec<(&str, Vec<usize>)> = vec![
        ("0.weight", vec![8, 3, 3, 3]),
        ("1.weight", vec![8]),
        ("1.bias", vec![8]),
        ("3.body.0.weight", vec![16, 8, 3, 3]),
        ("3.body.0.bias", vec![16]),
        ("3.shortcut.0.weight", vec![16, 8, 1, 1]),
        ("3.shortcut.1.weight", vec![16]),
        ("3.shortcut.1.bias", vec![16]),
        ("9.weight", vec![4, 16]),
        ("9.bias", vec![4]),
    ];
    let want: Vec<(String, Vec<usize>)> = want.into_iter().map(|(n, s)| (n.into(), s)).collect();
    assert_eq!(names, want);
    let buffers: Vec<String> = m.buffers().into_iter().map(|(n, ..)| n).collect();
    assert_eq!(
        buffers,
        [
            "1.running_mean",
            "1.running_var",
            "1.num_batches_tracked",
            "3.shortcut.1.running_mean",
            "3.shortcut.1.running_var",
            "3.shortcut.1.num_batches_tracked"
        ]
    );
    assert_eq!(m.layers[3].output, vec![16, 4, 4]);
    assert_eq!(m.layers[5].output, vec![16, 2, 2]);
    assert_eq!(m.layers[7].output, vec![16]);
    assert_eq!(m.head().as_deref(), Some("9"));
}

#[test]
fn each_layer_with_parameters_starts_a_stage_and_the_rest_join_it() {
    let m = declared(RESIDUAL).unwrap();
    let stages = m.stages();
    // conv+bn+relu; the residual with its relu, pools, flatten and dropout; the head.
    assert_eq!(
        stages,
        vec![
            vec!["0", "1", "2"],
            vec!["3", "4", "5", "6", "7", "8"],
            vec!["9"]
        ]
    );
    let params: Vec<(String, Vec<usize>)> =
        m.specs().into_iter().map(|s| (s.name, s.shape)).collect();
    let units = crate::model::stages::unit_layouts(&stages, &params).unwrap();
    assert_eq!(units.iter().map(Vec::len).collect::<Vec<_>>(), [3, 5, 2]);
}

/// Each shape mismatch names the layer's key, its module, the shapes and a fix, before any training.
#[rstest]
#[case::in_channels(
    "[{type: Conv2d, in_channels: 4, out_channels: 8, kernel_size: 3}]",
    &["model.layers.0", "Conv2d '0'", "input [3, 8, 8]", "in_channels is 4 but its input has 3 channels"]
)]
#[case::linear_before_flatten(
    "[{type: Linear, out_features: 4}]",
    &["model.layers.0", "put a Flatten before it"]
)]
#[case::in_features(
    "[{type: Flatten}, {type: Linear, in_features: 100, out_features: 4}]",
    &["model.layers.1", "in_features is 100 but its input has 192 features"]
)]
#[case::residual_shapes(
    "[{type: Residual, body: [{type: Conv2d, out_channels: 8, kernel_size: 3, stride: 2, padding: 1}]}, {type: Flatten}, {type: Linear, out_features: 4}]",
    &["model.layers.0", "its body gives [8, 4, 4] but its shortcut gives [3, 8, 8]", "give the block a shortcut"]
)]
#[case::nested_path(
    "[{type: Sequential, layers: [{type: ReLU}, {type: BatchNorm2d, num_features: 5}]}]",
    &["model.layers.0.layers.1", "BatchNorm2d '0.1'", "num_features is 5 but its input has 3 channels"]
)]
#[case::batchnorm1d_on_images(
    "[{type: BatchNorm1d}, {type: Flatten}, {type: Linear, out_features: 4}]",
    &["model.layers.0", "BatchNorm1d takes [features] or [channels, length] inputs, not [3, 8, 8]"]
)]
#[case::batchnorm1d_features(
    "[{type: Flatten}, {type: Linear, out_features: 6}, {type: BatchNorm1d, num_features: 5}]",
    &["model.layers.2", "num_features is 5 but its input has 6 features"]
)]
#[case::window_too_big(
    "[{type: Conv2d, out_channels: 2, kernel_size: 11}]",
    &["model.layers.0", "the 11x11 window does not fit a 8x8 input"]
)]
#[case::wrong_output(
    "[{type: Flatten}, {type: Linear, out_features: 7}]",
    &["model.layers.1", "gives [7] per image, but model.num_classes is 4"]
)]
#[case::conv_after_flatten(
    "[{type: Flatten}, {type: Conv2d, out_channels: 2, kernel_size: 1}]",
    &["model.layers.1", "takes images [C, H, W], not [192]"]
)]
fn shapes_that_do_not_fit_are_refused_with_the_layer_and_shapes(
    #[case] layers: &str,
    #[case] wanted: &[&str],
) {
    let err = declared(layers).unwrap_err().to_string();
    for w in wanted {
        assert!(err.contains(w), "missing {w:?} in:\n{err}");
    }
    assert!(err.contains("t.yaml:"), "no place in:\n{err}");
}
