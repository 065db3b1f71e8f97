//! `data:`: the data set, its loader and its augmentations.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DataName {
    Cifar10,
    Cifar100,
    Cinic10,
    Imagenet,
    Mnist,
    FashionMnist,
    Synthetic,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    pub name: DataName,
    #[serde(default)]
    pub root: Option<String>,
    #[serde(default)]
    pub download: bool,
    /// With `download`: a base URL that replaces the official one (same file names).
    #[serde(default)]
    pub mirror: Option<String>,
    /// With `download`: MD5 per file name, replacing the published checksum (for re-packed mirrors).
    #[serde(default)]
    pub checksums: std::collections::BTreeMap<String, String>,
    pub num_classes: usize,
    pub image_size: usize,
    #[serde(default = "three")]
    pub channels: usize,
    pub batch_size: usize,
    #[serde(default)]
    pub num_workers: usize,
    #[serde(default)]
    pub drop_last: bool,
    /// synthetic: number of generated training / validation images.
    #[serde(default)]
    pub train_size: Option<usize>,
    #[serde(default)]
    pub val_size: Option<usize>,
    #[serde(default)]
    pub train_transforms: Vec<Transform>,
    #[serde(default)]
    pub val_transforms: Vec<Transform>,
}

fn three() -> usize {
    3
}

/// One augmentation step, written as a one-key mapping: `- random_crop: {size: 32, padding: 4}`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Transform {
    RandomCrop {
        size: usize,
        #[serde(default)]
        padding: usize,
    },
    RandomResizedCrop {
        size: usize,
        #[serde(default = "default_scale")]
        scale: [f64; 2],
        #[serde(default = "default_ratio")]
        ratio: [f64; 2],
    },
    HorizontalFlip {
        #[serde(default = "half")]
        p: f64,
    },
    Resize {
        size: usize,
    },
    CenterCrop {
        size: usize,
    },
    Normalize {
        mean: Vec<f64>,
        std: Vec<f64>,
    },
}

fn default_scale() -> [f64; 2] {
    [0.08, 1.0]
}
fn default_ratio() -> [f64; 2] {
    [3.0 / 4.0, 4.0 / 3.0]
}
fn half() -> f64 {
    0.5
}
