//! CIFAR-10 files made for a test, packed by `train pack` into WebDataset shards, and the overrides that
//! train on shards.

use std::path::Path;
use std::process::Command;

/// CIFAR-10's binary files (the real format) in `dir`: 5 training files of `per_file` images and a test
/// file of `test` images, random pixels, labels cycling through the classes.
pub fn write_cifar(dir: &Path, per_file: usize, test: usize) {
    std::fs::create_dir_all(dir).unwrap();
    let mut seed = 12345u64;
    let mut byte = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as u8
    };
    let mut file = |name: &str, n: usize, first: usize| {
        let mut bytes = Vec::new();
        for i in 0..n {
            bytes.push(((first + i) % 10) as u8);
            bytes.extend((0..3072).map(|_| byte()));
        }
        std::fs::write(dir.join(name), bytes).unwrap();
    };
    for k in 1..=5 {
        file(&format!("data_batch_{k}.bin"), per_file, k * per_file);
    }
    file("test_batch.bin", test, 3);
}

/// `train pack` run in `project`: the CIFAR-10 files in `cifar`, split `split` (`train`, `val`), in shards
/// of `maxcount` under `out`; what it printed (it must succeed).
pub fn pack(project: &Path, cifar: &Path, out: &Path, split: &str, maxcount: usize) -> String {
    let out = Command::new(super::TRAIN)
        .args([
            "pack",
            &format!("out={}", out.display()),
            &format!("split={split}"),
            &format!("maxcount={maxcount}"),
            "data=cifar10",
            &format!("data.root={}", cifar.display()),
        ])
        .current_dir(project)
        .env_remove("TRAIN_CONFIG_PATH")
        .output()
        .unwrap();
    super::succeeded(&out)
}

/// Training a small cnn on CIFAR-shaped shards, 5 a batch (the URLs are the test's).
pub const ON_SHARDS: &[&str] = &[
    "experiment=quickstart",
    "data=webdataset",
    "data.train_size=null",
    "data.val_size=null",
    "data.num_classes=10",
    "data.image_size=32",
    "data.batch_size=5",
    "data.num_workers=2",
    "model=cnn",
    "optimizer=sgd",
    "scheduler=constant",
    "trainer.log_every_n_steps=1",
    "callbacks.model_summary=null",
];
