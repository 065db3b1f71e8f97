//! WebDataset shards streamed from a real S3-compatible server (`rclone serve s3`) to two ranks through a
//! proxy that breaks connections off in the middle of shard bodies: across the ranks' epochs every sample
//! is read exactly once, each equal to the shard's file read locally, and every broken body is resumed
//! where it broke. In-process (the loader and the shard sampler as the trainer drives them), in a test
//! binary of its own because it sets the S3 environment.
//! Needs `--features s3` and `TRAINYARD_RCLONE` (`.ci/run` installs rclone).
#![cfg(feature = "s3")]

mod common;
use common::s3_server::{start_server, CuttingProxy, KEY, SECRET};
use std::sync::Arc;
use trainyard::data::loader::{EpochLoader, LoaderSpec};
use trainyard::data::sampler::{Order, Sampler};
use trainyard::data::shard_sampler::ShardSampler;
use trainyard::data::webdataset::streamed::StreamedShards;
use trainyard::data::webdataset::{expand_urls, Keys, WebDataset};
use trainyard::data::Dataset;

/// Each sample of an epoch as (label, pixels' bits), in the order the loader gave them.
fn epoch(set: Arc<dyn Dataset>, order: &Order) -> Vec<(u32, Vec<u32>)> {
    let spec = LoaderSpec {
        dataset: set,
        transforms: Arc::new(Vec::new()),
        batch_size: 4,
        drop_last: false,
        num_workers: 2,
        prefetch: 2,
        seed: 1,
        stager: None,
        read_ahead: 3,
        skipped: None,
    };
    let mut samples = Vec::new();
    for batch in EpochLoader::new(&spec, 0, order) {
        let batch = batch.unwrap();
        let per = batch.channels * batch.height * batch.width;
        for (i, label) in batch.labels.iter().enumerate() {
            let pixels = batch.images[i * per..(i + 1) * per]
                .iter()
                .map(|v| v.to_bits())
                .collect();
            samples.push((*label, pixels));
        }
    }
    samples
}

#[test]
fn two_ranks_stream_every_sample_once_through_broken_connections() {
    let server = start_server();
    let proxy = CuttingProxy::start(server.port, 9_000);
    let project = common::real_project();
    let cifar = project.path().join("data/cifar");
    common::shards::write_cifar(&cifar, 6, 1);
    let shards = server.root.path().join("ckpts/wds");
    common::shards::pack(project.path(), &cifar, &shards, "train", 4);
    let cache = tempfile::tempdir().unwrap();
    for (k, v) in [
        ("AWS_ACCESS_KEY_ID", KEY),
        ("AWS_SECRET_ACCESS_KEY", SECRET),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ENDPOINT_URL", proxy.endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("TRAINYARD_CACHE", cache.path().to_str().unwrap()),
    ] {
        std::env::set_var(k, v);
    }
    // 30 images in shards of 4: 7 of 4 and one of 2.
    let urls = expand_urls("s3://ckpts/wds/train-{000000..000007}.tar").unwrap();
    let keys = Keys::parse("jpg;png", "cls");
    let streamed: Arc<dyn Dataset> = Arc::new(StreamedShards::open(urls, &keys, 10, 3).unwrap());
    let lens = streamed.shard_lens().unwrap();
    assert_eq!(lens, [4, 4, 4, 4, 4, 4, 4, 2]);
    let local: Vec<_> = (0..8)
        .map(|s| shards.join(format!("train-{s:06}.tar")))
        .collect();
    let indexed: Arc<dyn Dataset> = Arc::new(WebDataset::open(local, &keys, 10, 3).unwrap());
    let mut expected = epoch(indexed, &Order::of((0..30).collect()));
    expected.sort();

    proxy.arm(3);
    let mut read = Vec::new();
    for rank in 0..2 {
        let sampler = Sampler::Shards(ShardSampler {
            lens: lens.clone(),
            num_replicas: 2,
            rank,
            shuffle: true,
            seed: 11,
            buffer: 5,
            even: None,
        });
        let got = epoch(streamed.clone(), &sampler.order(4));
        assert!(
            got.len() >= 14 && got.len() <= 16,
            "rank {rank}: {}",
            got.len()
        );
        read.extend(got);
    }
    read.sort();
    assert_eq!(read.len(), 30);
    assert!(
        read == expected,
        "the ranks' samples are not the dataset's, each once"
    );
    assert_eq!(proxy.cuts(), 3, "the proxy cut every body it was armed for");
}
