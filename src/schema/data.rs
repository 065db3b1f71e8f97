//! `data:`: the data set, its loader and its augmentations.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DataName {
    Cifar10,
    Cifar100,
    Cinic10,
    Imagenet,
    Mnist,
    FashionMnist,
    Synthetic,
    /// Parquet files as the Hugging Face hub publishes datasets (`train-00000-of-00001.parquet`; image
    /// bytes and an integer label per row), in `root`: a directory or an `s3://` prefix.
    Parquet,
    /// WebDataset tar shards (`data.train_urls`: `shards/train-{000000..000099}.tar`, local or `s3://`).
    Webdataset,
    /// A dataset a crate registered under its `_target_` (`registry`); set by `schema::extract`.
    Registered,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// The dataset, in its published file format (`synthetic` generates images; `registered` is set for a
    /// `_target_` dataset).
    pub name: DataName,
    /// The directory holding the dataset's files; unset: `paths.data_dir`.
    #[serde(default)]
    pub root: Option<String>,
    /// Download the dataset's official files (checked against their published MD5) when they are not in
    /// `root`.
    #[serde(default)]
    pub download: bool,
    /// With `download`: a base URL that replaces the official one (same file names).
    #[serde(default)]
    pub mirror: Option<String>,
    /// With `download`: MD5 per file name, replacing the published checksum (for re-packed mirrors).
    #[serde(default)]
    pub checksums: std::collections::BTreeMap<String, String>,
    /// Classes of the dataset (the model's outputs read it as `${data.num_classes}`).
    pub num_classes: usize,
    /// The side of the square images the model receives, after the transforms.
    pub image_size: usize,
    /// Colour channels of the images (1 for MNIST).
    #[serde(default = "three")]
    pub channels: usize,
    /// Samples per step on each process (DataLoader's `batch_size`), unless `batch_size_is_global`.
    pub batch_size: usize,
    /// `batch_size` is the whole step's, divided among the processes (lightning-hydra-template's
    /// MNISTDataModule: `batch_size // trainer.world_size`, refused when it does not divide); false: each
    /// process's.
    #[serde(default)]
    pub batch_size_is_global: bool,
    /// Loader worker threads preparing batches ahead of the step (DataLoader's `num_workers`); 0: in the
    /// training thread.
    #[serde(default)]
    pub num_workers: usize,
    /// On a GPU (backend=tch): the loader copies each batch into page-locked memory, and the step's copy
    /// to the GPU does not block (PyTorch DataLoader's `pin_memory`). false: copied from pageable memory.
    #[serde(default = "yes")]
    pub pin_memory: bool,
    /// Leave out the last, incomplete training batch of each epoch (DataLoader's `drop_last`).
    #[serde(default)]
    pub drop_last: bool,
    /// A sample whose image cannot be decoded (a damaged or cut-off file, a broken shard member) is left
    /// out of its batch, warned about and counted in `summary.json` (`skipped_samples`), as WebDataset's
    /// `warn_and_continue` does; false: it stops the run, naming the file (or shard and key).
    #[serde(default)]
    pub skip_corrupt: bool,
    /// A dataset read as shards (`register_sharded_dataset!`, streamed WebDataset shards): samples are
    /// mixed across the shards a rank reads in a seeded buffer of this many (WebDataset's `shuffle(n)`);
    /// 0 or 1: in shard order.
    #[serde(default = "default_shuffle_buffer")]
    pub shuffle_buffer: usize,
    /// A dataset read as shards: when the ranks' shards hold different numbers of samples, `pad` repeats
    /// a rank's first samples up to the largest share any rank can get (none skipped), `drop` stops
    /// every rank at the smallest (none repeated). Equal shards, as many per rank, need neither.
    #[serde(default)]
    pub uneven_shards: UnevenShards,
    /// synthetic: number of generated training / validation images.
    #[serde(default)]
    pub train_size: Option<usize>,
    /// synthetic: number of generated validation images.
    #[serde(default)]
    pub val_size: Option<usize>,
    /// lightning-hydra-template's MNISTDataModule: the train and test files pooled, then cut into train,
    /// validation and test parts as PyTorch's `random_split` cuts them (three counts adding up to the
    /// pool, or fractions adding up to 1).
    #[serde(default)]
    pub train_val_test_split: Option<Vec<SplitLength>>,
    /// The seed of that cut (the template's `torch.Generator().manual_seed(42)`).
    #[serde(default = "forty_two")]
    pub split_seed: u64,
    /// Augmentation of training images, in order (`random_crop`, `random_resized_crop`, `horizontal_flip`,
    /// `normalize`, ...).
    #[serde(default)]
    pub train_transforms: Vec<Transform>,
    /// Transforms of validation and test images, in order (`resize`, `center_crop`, `normalize`, ...).
    #[serde(default)]
    pub val_transforms: Vec<Transform>,
    /// parquet: the column holding each row's image (a struct `{bytes, path}` as the hub writes it, or
    /// raw bytes); unset: `image` or `img`, whichever the files have.
    #[serde(default)]
    pub image_column: Option<String>,
    /// parquet: the column holding each row's class (an integer).
    #[serde(default = "label")]
    pub label_column: String,
    /// webdataset: the training shards, a WebDataset URL pattern (`train-{000000..001281}.tar`, `{a,b}`,
    /// `::` between patterns), local paths or `s3://`.
    #[serde(default)]
    pub train_urls: Option<String>,
    /// webdataset: the validation shards.
    #[serde(default)]
    pub val_urls: Option<String>,
    /// webdataset: the test shards (what `test: true` reads); unset: the validation shards.
    #[serde(default)]
    pub test_urls: Option<String>,
    /// webdataset: read each shard as a stream, front to back, with nothing stored locally (true; the
    /// shards are dealt whole to the ranks, `shuffle_buffer` mixes them), or index the shards and read
    /// samples by position (false; `s3://` shards are then copied to the local cache first). Unset:
    /// stream `s3://` shards, index local ones.
    #[serde(default)]
    pub stream_shards: Option<bool>,
    /// webdataset: the image member's extensions, in order of preference (`jpg;png`).
    #[serde(default = "image_key")]
    pub image_key: String,
    /// webdataset: the label member's extension: `cls` (the class as text) or `json` (its `label`).
    #[serde(default = "cls")]
    pub label_key: String,
    /// `registered`: the `_target_`, its arguments and what its samples look like (`schema::extract`
    /// fills it).
    #[serde(skip)]
    pub registered: Option<std::sync::Arc<super::RegisteredData>>,
}

/// One part's size in `data.train_val_test_split`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum SplitLength {
    Count(usize),
    Fraction(f64),
}

fn forty_two() -> u64 {
    42
}

fn image_key() -> String {
    "jpg;png;jpeg".into()
}

fn cls() -> String {
    "cls".into()
}

fn label() -> String {
    "label".into()
}

fn three() -> usize {
    3
}

fn default_shuffle_buffer() -> usize {
    1000
}

/// `data.uneven_shards`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum UnevenShards {
    #[default]
    Pad,
    Drop,
}

fn yes() -> bool {
    true
}

/// One augmentation step, written as a one-key mapping: `- random_crop: {size: 32, padding: 4}`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
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

#[cfg(test)]
mod tests {
    /// `data.pin_memory`, as a GPU run reads it: on unless the config turns it off.
    #[rstest::rstest]
    #[case::by_default("", true)]
    #[case::turned_off(", pin_memory: false", false)]
    fn pin_memory_is_on_unless_turned_off(#[case] extra: &str, #[case] want: bool) {
        let text = format!(
            "task_name: t\nseed: 3\nmodel: {{name: mlp, num_classes: 4, hidden: [8]}}\n\
             data: {{name: synthetic, num_classes: 4, image_size: 8, batch_size: 4{extra}}}\n\
             optimizer: {{name: sgd, lr: 0.1}}\nscheduler: {{name: constant}}\n\
             trainer: {{strategy: single, devices: 1, accelerator: cpu, precision: 32, max_epochs: 1}}\n\
             paths: {{root_dir: ., data_dir: d, log_dir: l, output_dir: o}}\n"
        );
        let node = crate::config::yaml::parse(&text, "t.yaml")
            .unwrap()
            .unwrap();
        let exp = crate::schema::extract(&node).unwrap();
        assert_eq!(exp.data.pin_memory, want);
    }
}
