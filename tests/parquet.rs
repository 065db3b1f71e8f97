//! `data=parquet`: datasets in the Hugging Face hub's parquet layout, written by pyarrow in the hub's
//! schema (tests/fixtures/hub_parquet.py), read back image for image and label for label equal to the
//! same images in CIFAR-10's binary files and MNIST's IDX files; trained on from the CLI; bad files
//! refused naming the file, the row and the fix. Needs a python with pyarrow and Pillow
//! (TRAINYARD_TORCH_PYTHON, which `.ci/run` gives both).

mod common;
use rstest::rstest;
use std::path::{Path, PathBuf};
use std::process::Command;
use trainyard::data::parquet::{Columns, ParquetDataset};
use trainyard::data::{Dataset, Split};

/// `hub_parquet.py KIND` run into a fresh directory.
fn fixture(python: &str, kind: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hub_parquet.py");
    let out = Command::new(python)
        .arg(script)
        .args([kind, dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hub_parquet.py {kind}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

fn columns() -> Columns {
    Columns {
        image: None,
        label: "label".into(),
    }
}

/// Every image and label of `a` and `b`, compared in order.
fn assert_same_samples(a: &dyn Dataset, b: &dyn Dataset) {
    assert_eq!(a.len(), b.len());
    for i in 0..a.len() {
        let (x, y) = (a.get(i).unwrap(), b.get(i).unwrap());
        assert_eq!(
            (x.height, x.width, x.channels, x.label),
            (y.height, y.width, y.channels, y.label),
            "sample {i}"
        );
        assert!(x.pixels == y.pixels, "sample {i}: pixels differ");
    }
}

/// CIFAR-10 as uoft-cs/cifar10 publishes it (`plain_text/`, `img` {bytes, path}, two training files of
/// several row groups each) reads back as the binary files: same images, labels, order; the class names
/// come from the files' metadata.
#[rstest]
#[case::train_split(Split::Train)]
#[case::val_split(Split::Val)]
#[case::test_split(Split::Test)]
fn hub_cifar10_reads_back_as_its_binary_files(#[case] split: Split) {
    let Some(python) = common::torch_python() else {
        return;
    };
    let dir = fixture(&python, "cifar10");
    let hub = ParquetDataset::open(&dir.path().join("hub"), split, &columns(), 10, 3).unwrap();
    let original = trainyard::data::cifar::Cifar::open(
        &dir.path().join("original"),
        trainyard::data::cifar::Variant::Cifar10,
        split,
    )
    .unwrap();
    assert_eq!(hub.len(), if split == Split::Train { 20 } else { 6 });
    assert_same_samples(&hub, &original);
    assert_eq!(
        hub.class_names().unwrap()[..3],
        ["airplane", "automobile", "bird"]
    );
}

/// MNIST as ylecun/mnist publishes it (`image`, grayscale PNG) reads back as its IDX files.
#[rstest]
#[case::train_split(Split::Train)]
#[case::test_split(Split::Test)]
fn hub_mnist_reads_back_as_its_idx_files(#[case] split: Split) {
    let Some(python) = common::torch_python() else {
        return;
    };
    let dir = fixture(&python, "mnist");
    let hub = ParquetDataset::open(&dir.path().join("hub"), split, &columns(), 10, 1).unwrap();
    let original =
        trainyard::data::mnist::Mnist::open_in(&dir.path().join("original"), false, split).unwrap();
    assert_same_samples(&hub, &original);
}

/// Images stored as plain binary (not the `{bytes, path}` struct) read too.
#[test]
fn raw_image_bytes_read_too() {
    let Some(python) = common::torch_python() else {
        return;
    };
    let dir = fixture(&python, "variants");
    let set = ParquetDataset::open(
        &dir.path().join("raw_bytes"),
        Split::Train,
        &columns(),
        10,
        3,
    )
    .unwrap();
    assert_eq!(set.len(), 12);
    let img = set.get(11).unwrap();
    assert_eq!((img.height, img.width, img.label), (8, 8, 1));
}

fn train(root: &Path, args: &[&str]) -> std::process::Output {
    Command::new(common::TRAIN)
        .args(args)
        .current_dir(root)
        .env_remove("TRAIN_CONFIG_PATH")
        .output()
        .unwrap()
}

/// `train data=parquet_cifar10 data.root=<the hub's files>` trains and validates on them; so does
/// `data=parquet_mnist`.
#[rstest]
#[case::cifar10("cifar10", "parquet_cifar10", 20)]
#[case::mnist("mnist", "parquet_mnist", 30)]
fn trains_from_the_hubs_files(#[case] kind: &str, #[case] preset: &str, #[case] train_size: u64) {
    let Some(python) = common::torch_python() else {
        return;
    };
    let dir = fixture(&python, kind);
    let p = common::real_project();
    let data = format!("data={preset}");
    let root = format!("data.root={}", dir.path().join("hub").display());
    let out = train(
        p.path(),
        &[
            "experiment=quickstart",
            &data,
            &root,
            "model=cnn",
            "data.train_size=null",
            "data.val_size=null",
            "data.batch_size=5",
            "data.num_workers=2",
            "trainer.max_epochs=1",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = newest_run(p.path());
    let s = common::summary(&run);
    assert_eq!(s["epochs_completed"], 1, "{s}");
    // Every training image was seen once: 20 (or 30) images at 5 a batch.
    assert_eq!(s["global_step"].as_u64(), Some(train_size / 5), "{s}");
}

fn newest_run(root: &Path) -> PathBuf {
    let mut runs: Vec<PathBuf> = Vec::new();
    for task in std::fs::read_dir(root.join("logs")).unwrap().flatten() {
        if let Ok(dir) = std::fs::read_dir(task.path().join("runs")) {
            runs.extend(dir.flatten().map(|e| e.path()));
        }
    }
    runs.sort();
    runs.pop().expect("a run directory")
}

/// Bad files: each refused with the file, the row where it matters, and what to do.
#[rstest]
#[case::no_label_column(
    "no_label",
    Split::Train,
    "no column 'label' (data.label_column); its columns are: image, target"
)]
#[case::path_only("path_only", Split::Train, "holds only a path (img")]
#[case::unlabelled("unlabelled", Split::Train, "label -1 in column 'label'")]
#[case::wrong_class_count(
    "bad_names",
    Split::Train,
    "names 3 classes for 'label' but data.num_classes=10; set data.num_classes=3"
)]
#[case::no_validation_split("raw_bytes", Split::Val, "validation files named validation-*.parquet")]
#[case::no_directory("nowhere", Split::Train, "nowhere")]
fn bad_files_are_refused(#[case] variant: &str, #[case] split: Split, #[case] says: &str) {
    let Some(python) = common::torch_python() else {
        return;
    };
    let dir = fixture(&python, "variants");
    let err = match ParquetDataset::open(&dir.path().join(variant), split, &columns(), 10, 3) {
        Ok(set) => (0..set.len())
            .find_map(|i| set.get(i).err())
            .map(|e| e.to_string())
            .expect("should have failed"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(says), "expected '{says}' in: {err}");
    if variant != "nowhere" && variant != "raw_bytes" {
        assert!(err.contains(variant), "names the file: {err}");
    }
}

/// A corrupt image inside a file stops the run naming the file, the row and the column.
#[test]
fn a_corrupt_image_names_its_file_and_row() {
    let Some(python) = common::torch_python() else {
        return;
    };
    let dir = fixture(&python, "variants");
    let set = ParquetDataset::open(
        &dir.path().join("corrupt_image"),
        Split::Train,
        &columns(),
        10,
        3,
    )
    .unwrap();
    let err = set.get(9).unwrap_err().to_string();
    assert!(
        err.contains("corrupt_image/train-00000-of-00001.parquet")
            && err.contains("row 2 of row group 1")
            && err.contains("cannot be decoded as an image"),
        "{err}"
    );
    assert!(set.get(8).is_ok());
}
