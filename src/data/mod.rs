//! Data: data sets in their real on-disk formats, augmentation, the distributed sampler and the loader.
//! Everything here is backend-neutral: batches are plain `f32` NCHW buffers and `u32` labels.

pub mod cifar;
pub mod download;
pub mod folder;
pub mod fused;
pub mod jpeg;
pub mod loader;
pub mod mnist;
pub mod parquet;
pub mod registered;
pub mod sampler;
pub mod shard_sampler;
pub mod skipped;
pub mod split;
pub mod stream;
pub mod synthetic;
pub mod transforms;
pub mod webdataset;

use crate::schema::{DataConfig, DataName};
use std::path::PathBuf;
use std::sync::Arc;

/// One decoded image, 8-bit, channels last (HWC), with its class.
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    pub height: usize,
    pub width: usize,
    pub channels: usize,
    pub pixels: Vec<u8>,
    pub label: u32,
}

/// A random-access data set. `get` must be callable from several worker threads at once.
pub trait Dataset: Send + Sync {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn get(&self, index: usize) -> Result<Image, DataError>;
    fn num_classes(&self) -> usize;
    /// Does it yield ready tensors (`tensor`) rather than images to decode and transform (`get`)?
    fn yields_tensors(&self) -> bool {
        false
    }
    /// Sample `index` as the encoded file it was read from (its bytes and extension: `jpg`, `png`), for
    /// `train pack` to copy into shards without re-encoding; `None` where there is no such file (the
    /// images are made or stored raw), and `pack` encodes the decoded image as PNG.
    fn encoded(&self, index: usize) -> Option<Result<(Vec<u8>, String), DataError>> {
        let _ = index;
        None
    }
    /// Sample `index` still encoded, with its class, where the dataset stores image files: the loader then
    /// decodes only what the transforms need (`fused::apply_encoded`). `None`: use `get`.
    fn encoded_image(&self, index: usize) -> Option<Result<EncodedImage, DataError>> {
        let _ = index;
        None
    }
    /// What names sample `index` to a user (`train predict`'s `id` column): its file's path, its
    /// WebDataset key. `None`: its index is all there is.
    fn sample_id(&self, index: usize) -> Option<String> {
        let _ = index;
        None
    }
    /// Sample `index`'s class without decoding its image, where the dataset knows it (`train pack`).
    fn label(&self, index: usize) -> Option<Result<u32, DataError>> {
        let _ = index;
        None
    }
    /// A sample as a tensor and its target (datasets a crate registered).
    fn tensor(&self, index: usize) -> Result<crate::registry::Sample, DataError> {
        let _ = index;
        Err(DataError::Unsupported(
            "this dataset yields images, not tensors".into(),
        ))
    }
    /// Its shards' sample counts when it is read as a stream of shards (sample `i` is then the
    /// `i - start`-th of the shard it falls in): the loader reads each shard in order (`stream`) and the
    /// sampler hands out whole shards (`shard_sampler`). `None`: read by index.
    fn shard_lens(&self) -> Option<Vec<usize>> {
        None
    }
    /// Shard `shard`'s samples from its `start`-th on, in order (streamed datasets).
    fn open_shard(&self, shard: usize, start: usize) -> Result<SampleIter<'_>, DataError> {
        let _ = (shard, start);
        Err(DataError::Unsupported(
            "this dataset is read by index, not as shards".into(),
        ))
    }
}

/// A shard's samples in order (`Dataset::open_shard`).
pub type SampleIter<'a> = Box<dyn Iterator<Item = Result<Streamed, DataError>> + Send + 'a>;

/// One sample read from a shard: a registered dataset's tensor, or an image still encoded, which the
/// loader worker that takes it decodes (the shard's reader thread only reads, so decoding runs on
/// every worker).
#[derive(Debug, Clone, PartialEq)]
pub enum Streamed {
    Tensor(crate::registry::Sample),
    Encoded(EncodedImage),
}

impl Streamed {
    /// The tensor sample (a registered dataset's); an image is an error, as `Dataset::tensor` says.
    pub fn into_tensor(self) -> Result<crate::registry::Sample, DataError> {
        match self {
            Streamed::Tensor(sample) => Ok(sample),
            Streamed::Encoded(image) => Err(DataError::Unsupported(format!(
                "{}: {} is an image, not a tensor",
                image.shard, image.name
            ))),
        }
    }

    /// The decoded image; a tensor sample is an error.
    pub fn into_image(self) -> Result<Image, DataError> {
        match self {
            Streamed::Encoded(image) => image.decode(),
            Streamed::Tensor(_) => Err(DataError::Unsupported(
                "the dataset's shards yield tensors, not images".into(),
            )),
        }
    }
}

/// An image file's bytes as a shard holds them, with its class and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedImage {
    pub bytes: Vec<u8>,
    pub label: u32,
    /// Channels the dataset yields (1: gray, 3: RGB).
    pub channels: usize,
    /// The shard's or file's path or URL, and what names the sample within it (`sample '<key>'`, a
    /// parquet row; empty for a file of its own), for errors.
    pub shard: std::sync::Arc<str>,
    pub name: String,
}

impl EncodedImage {
    /// The decoded image; an error names the shard and the sample's key.
    pub fn decode(self) -> Result<Image, DataError> {
        decode_image(&self.bytes, self.channels, self.label).map_err(|e| self.corrupt(e))
    }

    /// An error naming the shard (or file) and the sample within it.
    pub fn corrupt(&self, e: impl std::fmt::Display) -> DataError {
        let sample = match self.name.is_empty() {
            true => String::new(),
            false => format!("{}: ", self.name),
        };
        DataError::Corrupt {
            path: self.shard.to_string(),
            message: format!("{sample}cannot be decoded as an image: {e}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Train,
    Val,
    /// The held-out part `test: true` measures after training: the third part of
    /// `data.train_val_test_split`, else the data set's test files.
    Test,
}

/// A data set that cannot be read: says where it looked and how to get it.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{name} not found: looked for {looked_for}\n    {hint}")]
    Missing {
        name: String,
        looked_for: String,
        hint: String,
    },
    #[error("{path}: {message}")]
    Corrupt { path: String, message: String },
    #[error("{0}")]
    Unsupported(String),
}

impl DataError {
    pub fn corrupt(path: &std::path::Path, message: impl Into<String>) -> Self {
        DataError::Corrupt {
            path: path.display().to_string(),
            message: message.into(),
        }
    }
}

/// The extension of an encoded image's format (`png`, `jpg`, `webp`, ...), from its first bytes; `jpg`
/// when they say nothing known.
pub fn image_extension(bytes: &[u8]) -> String {
    match image::guess_format(bytes) {
        Ok(image::ImageFormat::Png) => "png".into(),
        Ok(format) => format
            .extensions_str()
            .first()
            .map_or("jpg".into(), |e| e.to_string()),
        Err(_) => "jpg".into(),
    }
}

/// An encoded image file (JPEG, PNG, ...) decoded as the loader takes it: JPEGs by libjpeg-turbo
/// (`jpeg`, Pillow's decoder; one it cannot convert, such as CMYK, by the `image` crate), the rest by
/// the `image` crate.
pub fn decode_image(bytes: &[u8], channels: usize, label: u32) -> Result<Image, String> {
    if jpeg::is_jpeg(bytes) {
        match jpeg::decode(bytes, channels, label) {
            Ok(image) => return Ok(image),
            Err(jpeg::Failure::Truncated) => return Err(jpeg::Failure::Truncated.to_string()),
            Err(failure) => {
                return image::load_from_memory(bytes)
                    .map(|d| decoded_image(d, channels, label))
                    .map_err(|_| failure.to_string())
            }
        }
    }
    image::load_from_memory(bytes)
        .map(|d| decoded_image(d, channels, label))
        .map_err(|e| e.to_string())
}

/// A decoded image as the loader takes it: 8-bit RGB, or gray when the dataset has one channel.
pub fn decoded_image(decoded: image::DynamicImage, channels: usize, label: u32) -> Image {
    let (width, height, channels, pixels) = if channels == 1 {
        let gray = decoded.into_luma8();
        (gray.width(), gray.height(), 1, gray.into_raw())
    } else {
        let rgb = decoded.into_rgb8();
        (rgb.width(), rgb.height(), 3, rgb.into_raw())
    };
    Image {
        height: height as usize,
        width: width as usize,
        channels,
        pixels,
        label,
    }
}

/// Open the train, validation or test split named by the config.
pub fn open(cfg: &DataConfig, split: Split, seed: u64) -> Result<Arc<dyn Dataset>, DataError> {
    if let Some(lengths) = &cfg.train_val_test_split {
        let pool: Arc<dyn Dataset> = Arc::new(split::Concat::new(vec![
            open_files(cfg, Split::Train, seed)?,
            open_files(cfg, Split::Test, seed)?,
        ]));
        return split::part_of(pool, lengths, cfg.split_seed, split);
    }
    open_files(cfg, split, seed)
}

/// `data.root` of a parquet dataset as a local directory: an `s3://` prefix is copied to the local
/// cache first (only the files not already there, or of another size).
fn parquet_root(cfg: &DataConfig) -> Result<PathBuf, DataError> {
    let root = cfg.root.clone().unwrap_or_else(|| "data".into());
    if !crate::storage::s3::is_s3(&root) {
        return Ok(PathBuf::from(root));
    }
    crate::storage::s3::mirror_prefix(&root, ".parquet")
        .map_err(|e| DataError::Unsupported(format!("data.root={root}: {e:#}")))
}

/// The split as the data set's own files have it.
fn open_files(cfg: &DataConfig, split: Split, seed: u64) -> Result<Arc<dyn Dataset>, DataError> {
    let root = || PathBuf::from(cfg.root.clone().unwrap_or_else(|| "data".into()));
    Ok(match cfg.name {
        DataName::Synthetic => Arc::new(synthetic::Synthetic::new(cfg, split, seed)),
        DataName::Cifar10 => Arc::new(cifar::Cifar::open(&root(), cifar::Variant::Cifar10, split)?),
        DataName::Cifar100 => Arc::new(cifar::Cifar::open(
            &root(),
            cifar::Variant::Cifar100,
            split,
        )?),
        DataName::Mnist | DataName::FashionMnist => Arc::new(mnist::Mnist::open_in(
            &root(),
            cfg.name == DataName::FashionMnist,
            split,
        )?),
        DataName::Cinic10 => Arc::new(folder::ImageFolder::open(&root(), split, "cinic10")?),
        DataName::Imagenet => Arc::new(folder::ImageFolder::open(&root(), split, "imagenet")?),
        DataName::Parquet => Arc::new(parquet::ParquetDataset::open(
            &parquet_root(cfg)?,
            split,
            &parquet::Columns {
                image: cfg.image_column.clone(),
                label: cfg.label_column.clone(),
            },
            cfg.num_classes,
            cfg.channels,
        )?),
        DataName::Webdataset => {
            let (urls, key) = webdataset::urls_of(
                split,
                cfg.train_urls.as_deref(),
                cfg.val_urls.as_deref(),
                cfg.test_urls.as_deref(),
            )?;
            let keys = webdataset::Keys::parse(&cfg.image_key, &cfg.label_key);
            let shards = webdataset::split_urls(urls, key)?;
            let remote = shards.iter().any(|u| crate::storage::s3::is_s3(u));
            if cfg.stream_shards.unwrap_or(remote) {
                let opened = webdataset::streamed::StreamedShards::open(
                    shards,
                    &keys,
                    cfg.num_classes,
                    cfg.channels,
                );
                // A shard that cannot be reached or listed is said with the key and pattern naming it.
                Arc::new(opened.map_err(|e| match e {
                    DataError::Unsupported(m) => {
                        DataError::Unsupported(format!("{key}={urls}: {m}"))
                    }
                    other => other,
                })?)
            } else {
                Arc::new(webdataset::WebDataset::open(
                    webdataset::split_paths(urls, key)?,
                    &keys,
                    cfg.num_classes,
                    cfg.channels,
                )?)
            }
        }
        DataName::Registered => Arc::new(registered::Registered::open(cfg, split, seed)?),
    })
}
