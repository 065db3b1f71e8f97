//! The Rust half of `bench/loader_bench.py` and `bench/parquet_bench.py`: one pass over a training split
//! with the trainer's loader (worker threads decoding and augmenting), printing images per second as JSON.
//!
//! usage: loader_bench <root> <num_workers> <batch_size> <epochs> [folder|parquet|webdataset|webdataset-stream]
//! folder (default): an image folder of JPEGs with ImageNet's training transforms (random resized crop
//! 224, horizontal flip, normalize); parquet: the hub's CIFAR-10 parquet files with CIFAR's (random crop
//! 32 padded by 4, flip, normalize); webdataset: the `.tar` shards in <root>, CIFAR-shaped, the same,
//! indexed; webdataset-stream: the same shards streamed (whole shards in a shuffled order, a shuffle
//! buffer of 1000). The time includes opening the dataset (reading the shards' headers).
//!
//! `loader_bench <root> entropy <rounds>`: the JPEGs under <root> decoded whole and at 1/8 scale (where
//! little but the Huffman decoding is left) by trainyard's Huffman decoder and by libjpeg-turbo's,
//! alternating, on one thread; prints the median milliseconds per image of each as JSON.

use std::sync::Arc;
use std::time::Instant;
use trainyard::data::folder::ImageFolder;
use trainyard::data::loader::{EpochLoader, LoaderSpec};
use trainyard::data::parquet::{Columns, ParquetDataset};
use trainyard::data::sampler::{DistributedSampler, Order, Sampler};
use trainyard::data::shard_sampler::ShardSampler;
use trainyard::data::webdataset::streamed::StreamedShards;
use trainyard::data::webdataset::{Keys, WebDataset};
use trainyard::data::{Dataset, Split};
use trainyard::schema::Transform;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [root, mode, rounds] = &args[..] {
        if mode == "entropy" {
            return entropy_ab(std::path::Path::new(root), rounds.parse()?);
        }
    }
    let (root, workers, batch_size, epochs, kind) = match &args[..] {
        [r, w, b, e] => (r, w, b, e, "folder"),
        [r, w, b, e, k] => (r, w, b, e, k.as_str()),
        _ => anyhow::bail!(
            "usage: loader_bench <root> <num_workers> <batch_size> <epochs> [folder|parquet|webdataset|webdataset-stream]"
        ),
    };
    let root = std::path::Path::new(root);
    let started = Instant::now();
    let (dataset, transforms): (Arc<dyn Dataset>, _) = match kind {
        "parquet" => (
            Arc::new(ParquetDataset::open(
                root,
                Split::Train,
                &Columns {
                    image: None,
                    label: "label".into(),
                },
                10,
                3,
            )?),
            cifar_transforms(),
        ),
        "webdataset" => (
            Arc::new(WebDataset::open(
                shards_in(root)?,
                &Keys::parse("png;jpg", "cls"),
                10,
                3,
            )?),
            cifar_transforms(),
        ),
        "webdataset-stream" => (
            Arc::new(StreamedShards::open(
                shards_in(root)?
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect(),
                &Keys::parse("png;jpg", "cls"),
                10,
                3,
            )?),
            cifar_transforms(),
        ),
        _ => (
            Arc::new(ImageFolder::open(root, Split::Train, "bench")?),
            imagenet_transforms(),
        ),
    };
    let spec = LoaderSpec {
        dataset: dataset.clone(),
        transforms: Arc::new(transforms),
        batch_size: batch_size.parse()?,
        drop_last: false,
        num_workers: workers.parse()?,
        prefetch: 2,
        stager: None,
        seed: 0,
        read_ahead: BUFFER,
        skipped: None,
    };
    let sampler = match dataset.shard_lens() {
        Some(lens) => Sampler::Shards(ShardSampler {
            lens,
            num_replicas: 1,
            rank: 0,
            shuffle: true,
            seed: 0,
            buffer: BUFFER,
            even: Some(Default::default()),
        }),
        None => Sampler::Samples(DistributedSampler::single(dataset.len(), true, 0)),
    };
    let epochs: u64 = epochs.parse()?;
    let mut images = 0usize;
    for epoch in 0..epochs {
        let order: Order = sampler.order(epoch);
        for batch in EpochLoader::new(&spec, epoch, &order) {
            images += batch?.len();
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{{\"images\": {images}, \"seconds\": {seconds:.4}, \"images_per_s\": {:.1}}}",
        images as f64 / seconds
    );
    Ok(())
}

/// Per-image decode times of the two Huffman decoders on the JPEGs under `root` (see the module doc).
fn entropy_ab(root: &std::path::Path, rounds: usize) -> anyhow::Result<()> {
    use trainyard::data::jpeg;
    let mut files = Vec::new();
    for class in std::fs::read_dir(root.join("train"))? {
        for file in std::fs::read_dir(class?.path())? {
            files.push(std::fs::read(file?.path())?);
        }
    }
    let mut json = Vec::new();
    for scale in [8u8, 1] {
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            for own in [true, false] {
                let started = Instant::now();
                for bytes in &files {
                    let rows = if own {
                        jpeg::decode_region(bytes, 3, scale, None, Vec::new())
                    } else {
                        jpeg::decode_region_libjpeg(bytes, 3, scale, None)
                    };
                    std::hint::black_box(rows.map_err(|e| anyhow::anyhow!("{e}"))?);
                }
                let ms = started.elapsed().as_secs_f64() * 1e3 / files.len() as f64;
                if own { &mut ours } else { &mut theirs }.push(ms);
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        json.push(format!(
            "\"scale_{scale}\": {{\"trainyard_ms\": {:.4}, \"libjpeg_ms\": {:.4}}}",
            median(&mut ours),
            median(&mut theirs)
        ));
    }
    println!("{{{}, \"images\": {}}}", json.join(", "), files.len());
    Ok(())
}

/// The shuffle buffer of streamed shards (the `webdataset` library's `.shuffle(1000)` in the Python half).
const BUFFER: usize = 1000;

/// The `.tar` files in `root`, by name.
fn shards_in(root: &std::path::Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut shards: Vec<std::path::PathBuf> = std::fs::read_dir(root)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "tar"))
        .collect();
    shards.sort();
    Ok(shards)
}

/// ImageNet's training input: random resized crop 224, horizontal flip, normalize.
fn imagenet_transforms() -> Vec<Transform> {
    vec![
        Transform::RandomResizedCrop {
            size: 224,
            scale: [0.08, 1.0],
            ratio: [3.0 / 4.0, 4.0 / 3.0],
        },
        Transform::HorizontalFlip { p: 0.5 },
        Transform::Normalize {
            mean: vec![0.485, 0.456, 0.406],
            std: vec![0.229, 0.224, 0.225],
        },
    ]
}

/// CIFAR's training input (`conf/data/cifar10.yaml`): random crop 32 padded by 4, flip, normalize.
fn cifar_transforms() -> Vec<Transform> {
    vec![
        Transform::RandomCrop {
            size: 32,
            padding: 4,
        },
        Transform::HorizontalFlip { p: 0.5 },
        Transform::Normalize {
            mean: vec![0.4914, 0.4822, 0.4465],
            std: vec![0.2470, 0.2435, 0.2616],
        },
    ]
}
