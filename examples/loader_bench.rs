//! The Rust half of `bench/loader_bench.py`: one pass over an image folder's training split with the
//! trainer's loader (worker threads decoding JPEG and augmenting), printing images per second as JSON.
//!
//! usage: loader_bench <root> <num_workers> <batch_size> <epochs>
//! (ImageNet's training transforms: random resized crop 224, horizontal flip, normalize.)

use std::sync::Arc;
use std::time::Instant;
use trainyard::data::folder::ImageFolder;
use trainyard::data::loader::{EpochLoader, LoaderSpec};
use trainyard::data::sampler::DistributedSampler;
use trainyard::data::{Dataset, Split};
use trainyard::schema::Transform;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [root, workers, batch_size, epochs] = &args[..] else {
        anyhow::bail!("usage: loader_bench <root> <num_workers> <batch_size> <epochs>");
    };
    let dataset: Arc<dyn Dataset> = Arc::new(ImageFolder::open(
        std::path::Path::new(root),
        Split::Train,
        "bench",
    )?);
    let transforms = vec![
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
    ];
    let spec = LoaderSpec {
        dataset: dataset.clone(),
        transforms: Arc::new(transforms),
        batch_size: batch_size.parse()?,
        drop_last: false,
        num_workers: workers.parse()?,
        prefetch: 2,
        stager: None,
        seed: 0,
    };
    let sampler = DistributedSampler::single(dataset.len(), true, 0);
    let epochs: u64 = epochs.parse()?;
    let started = Instant::now();
    let mut images = 0usize;
    for epoch in 0..epochs {
        for batch in EpochLoader::new(&spec, epoch, &sampler.indices(epoch)) {
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
