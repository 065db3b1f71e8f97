//! `data=webdataset` and `train pack`: a dataset's split packed into tar shards reads back sample for
//! sample equal to the original files; shards written by Python's `tarfile` as WebDataset writes them
//! (keys with folders, `.json` labels) read too; training on shards runs from the CLI, stops mid-epoch and
//! resumes exactly; bad shards are refused naming the shard and the sample's key.

mod common;
use common::shards::{pack, write_cifar, ON_SHARDS};
use common::{real_project, run_with, succeeded, summary, weights, worst_relative_difference};
use rstest::rstest;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use trainyard::data::webdataset::streamed::StreamedShards;
use trainyard::data::webdataset::{expand_urls, Keys, WebDataset};
use trainyard::data::{Dataset, Image, Split};

fn train(root: &Path, args: &[&str]) -> Output {
    Command::new(common::TRAIN)
        .args(args)
        .current_dir(root)
        .env_remove("TRAIN_CONFIG_PATH")
        .output()
        .unwrap()
}

/// A project with CIFAR-10 (20 training images, 6 test) packed into shards of 7: `train-00000{0..2}.tar`
/// and `val-000000.tar` under `shards/`.
fn packed() -> (tempfile::TempDir, PathBuf) {
    let p = real_project();
    let cifar = p.path().join("data/cifar");
    write_cifar(&cifar, 4, 6);
    let shards = p.path().join("shards");
    for split in ["train", "val"] {
        let said = pack(p.path(), &cifar, &shards, split, 7);
        assert!(said.contains("Packed"), "{said}");
    }
    (p, shards)
}

fn keys() -> Keys {
    Keys::parse("jpg;png", "cls")
}

/// `train pack` writes 3 shards of at most 7 samples, and they read back as the binary files: same
/// pixels, labels and order (PNG is lossless).
#[test]
fn packed_shards_read_back_as_the_original_files() {
    let (p, shards) = packed();
    let pattern = format!("{}/train-{{000000..000002}}.tar", shards.display());
    let paths: Vec<PathBuf> = expand_urls(&pattern)
        .unwrap()
        .into_iter()
        .map(PathBuf::from)
        .collect();
    assert!(paths.iter().all(|p| p.is_file()), "{paths:?}");
    assert!(!shards.join("train-000003.tar").exists());
    let set = WebDataset::open(paths, &keys(), 10, 3).unwrap();
    for (split, set) in [(Split::Train, set)] {
        let original = trainyard::data::cifar::Cifar::open(
            &p.path().join("data/cifar"),
            trainyard::data::cifar::Variant::Cifar10,
            split,
        )
        .unwrap();
        assert_eq!(set.len(), original.len());
        for i in 0..set.len() {
            let (a, b) = (set.get(i).unwrap(), original.get(i).unwrap());
            assert_eq!((a.label, a.width, a.height), (b.label, b.width, b.height));
            assert!(a.pixels == b.pixels, "sample {i} ({}) differs", set.key(i));
        }
    }
    let val = WebDataset::open(vec![shards.join("val-000000.tar")], &keys(), 10, 3).unwrap();
    assert_eq!(val.len(), 6);
}

/// Shards read as streams give each shard's samples in order, equal to what the indexed reader gives,
/// from the start or from any sample on; a shard cut short after it was counted fails naming itself.
#[test]
fn streamed_shards_give_what_the_index_gives() {
    let (_p, shards) = packed();
    let urls = expand_urls(&format!(
        "{}/train-{{000000..000002}}.tar",
        shards.display()
    ))
    .unwrap();
    let paths: Vec<PathBuf> = urls.iter().map(PathBuf::from).collect();
    let index = WebDataset::open(paths, &keys(), 10, 3).unwrap();
    let stream = StreamedShards::open(urls.clone(), &keys(), 10, 3).unwrap();
    assert_eq!(stream.shard_lens(), Some(vec![7, 7, 6]));
    assert_eq!(stream.len(), index.len());
    let read = |shard: usize, start: usize| -> Vec<Image> {
        stream
            .open_shard(shard, start)
            .unwrap()
            .map(|s| s.unwrap().into_image().unwrap())
            .collect()
    };
    let mut i = 0;
    for shard in 0..3 {
        for image in read(shard, 0) {
            assert!(image == index.get(i).unwrap(), "sample {i}");
            i += 1;
        }
    }
    assert_eq!(i, 20);
    let rest = read(1, 3);
    assert_eq!(rest.len(), 4);
    assert!(rest[0] == index.get(10).unwrap());
    assert!(stream.get(16).unwrap() == index.get(16).unwrap());
    // Counted whole, then cut short: the stream says the shard is damaged, never a short epoch.
    let bytes = std::fs::read(&urls[2]).unwrap();
    std::fs::write(&urls[2], &bytes[..bytes.len() / 2 + 100]).unwrap();
    let err = stream
        .open_shard(2, 0)
        .unwrap()
        .find_map(Result::err)
        .expect("an error")
        .to_string();
    assert!(
        err.contains("train-000002.tar") && err.contains("truncated or damaged tar"),
        "{err}"
    );
}

/// Shards as Python's `tarfile` writes them for WebDataset: keys in folders, PNG and JPEG members (the
/// preferred extension wins), `.json` labels; the pixels of the PNG ones equal what Python wrote.
#[test]
fn shards_written_by_python_read_as_webdataset_groups_them() {
    let Some(python) = common::torch_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
import io, json, sys, tarfile
import numpy as np
from PIL import Image
out = sys.argv[1]
rng = np.random.default_rng(3)
expected = bytearray()
with tarfile.open(f"{out}/shard-0.tar", "w") as tar:
    def add(name, data):
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    for i in range(5):
        px = rng.integers(0, 256, (6, 9, 3), dtype=np.uint8)
        expected += px.tobytes()
        png = io.BytesIO(); Image.fromarray(px).save(png, format="PNG")
        jpg = io.BytesIO(); Image.fromarray(px).save(jpg, format="JPEG")
        key = f"n0{i % 2}/sample_{i}"
        add(f"{key}.jpg", jpg.getvalue())
        add(f"{key}.png", png.getvalue())
        add(f"{key}.json", json.dumps({"label": i % 3, "note": "x"}).encode())
    # Entries that are not samples (a directory, a symlink), and a key past tar's 100-byte name field.
    d = tarfile.TarInfo("some_dir"); d.type = tarfile.DIRTYPE; tar.addfile(d)
    link = tarfile.TarInfo("link.png"); link.type = tarfile.SYMTYPE; link.linkname = "n00/sample_0.png"
    tar.addfile(link)
    px = rng.integers(0, 256, (6, 9, 3), dtype=np.uint8)
    expected += px.tobytes()
    png = io.BytesIO(); Image.fromarray(px).save(png, format="PNG")
    key = "deep/" + "x" * 120 + "/sample_5"
    add(f"{key}.png", png.getvalue())
    add(f"{key}.json", json.dumps({"label": 2}).encode())
open(f"{out}/expected.bin", "wb").write(bytes(expected))
"#;
    let made = Command::new(python)
        .args(["-c", script, dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let set = WebDataset::open(
        vec![dir.path().join("shard-0.tar")],
        &Keys::parse("png;jpg", "json"),
        3,
        3,
    )
    .unwrap();
    assert_eq!(set.len(), 6);
    let expected = std::fs::read(dir.path().join("expected.bin")).unwrap();
    for i in 0..6 {
        let img = set.get(i).unwrap();
        let key = match i {
            5 => format!("deep/{}/sample_5", "x".repeat(120)),
            _ => format!("n0{}/sample_{i}", i % 2),
        };
        assert_eq!(set.key(i), key);
        assert_eq!((img.width, img.height, img.label), (9, 6, (i % 3) as u32));
        assert!(img.pixels == expected[i * 162..(i + 1) * 162], "sample {i}");
    }
}

fn urls(shards: &Path) -> [String; 2] {
    [
        // Braces start a dict in Hydra's override grammar: the pattern is quoted, as on a command line.
        format!(
            "data.train_urls='{}/train-{{000000..000002}}.tar'",
            shards.display()
        ),
        format!("data.val_urls={}/val-000000.tar", shards.display()),
    ]
}

/// Training on shards from the CLI, indexed or streamed: 20 images at 5 a batch are 4 steps an epoch. A
/// run stopped mid-epoch (step 3 of 4) resumes from its checkpoint with the next unseen batch and ends
/// with the uninterrupted run's weights; the resumed run logs only the steps after the checkpoint (a run
/// that ignored the checkpoint would log from step 1).
#[rstest]
#[case::indexed("data.stream_shards=false")]
#[case::streamed("data.stream_shards=true")]
fn trains_on_shards_and_resumes_mid_epoch_exactly(#[case] reading: &str) {
    let (p, shards) = packed();
    let [train_urls, val_urls] = urls(&shards);
    let mut base: Vec<&str> = ON_SHARDS.to_vec();
    base.extend([train_urls.as_str(), val_urls.as_str(), "seed=7", reading]);
    let straight = run_with(p.path(), "straight", &base, &["trainer.max_epochs=2"]);
    assert_eq!(summary(&straight)["global_step"], 8);
    let stopped = run_with(p.path(), "stopped", &base, &["trainer.max_steps=3"]);
    assert_eq!(summary(&stopped)["global_step"], 3);
    let ckpt = format!(
        "ckpt_path={}",
        stopped.join("checkpoints/last.safetensors").display()
    );
    let resumed = run_with(p.path(), "resumed", &base, &["trainer.max_epochs=2", &ckpt]);
    assert_eq!(summary(&resumed)["global_step"], 8);
    assert!(common::first_logged_step(&resumed) > 3);
    let diff = worst_relative_difference(&weights(&resumed), &weights(&straight));
    assert!(
        diff < 1e-6,
        "resumed and uninterrupted runs differ by {diff:e}"
    );
}

/// DDP over two processes: indexed, the distributed sampler gives each rank 10 of the 20 images, 2 steps
/// of 5 an epoch; streamed, each rank reads whole shards (7, 7 and 6 images), padded to the two largest,
/// 14 images, 3 steps.
#[cfg(feature = "torch")]
#[rstest]
#[case::indexed("data.stream_shards=false", 2)]
#[case::streamed("data.stream_shards=true", 3)]
fn ddp_ranks_share_the_shards(#[case] reading: &str, #[case] steps: u64) {
    let (p, shards) = packed();
    let [train_urls, val_urls] = urls(&shards);
    let mut base: Vec<&str> = ON_SHARDS.to_vec();
    base.extend([train_urls.as_str(), val_urls.as_str(), reading]);
    let run = run_with(
        p.path(),
        "ddp",
        &base,
        &["trainer=ddp_sim", "trainer.max_epochs=1"],
    );
    let s = summary(&run);
    assert_eq!(
        (s["devices"].as_u64(), s["global_step"].as_u64()),
        (Some(2), Some(steps)),
        "{s}"
    );
}

/// A shard pattern naming files that are not there, a truncated shard, a sample without its label, a
/// label past `num_classes`: each refused naming the shard and, where there is one, the sample's key.
#[rstest]
#[case::missing_shard("missing", "train-000000.tar")]
#[case::truncated("truncated", "truncated or damaged tar")]
#[case::no_label("no_label", "sample '000000003' has no .cls member")]
#[case::label_too_big("label_too_big", "its .cls: class 5 is not below data.num_classes=5")]
fn bad_shards_are_refused(
    #[case] what: &str,
    #[case] says: &str,
    #[values(false, true)] streamed: bool,
) {
    let (_p, shards) = packed();
    let shard = shards.join("train-000000.tar");
    let classes = if what == "label_too_big" { 5 } else { 10 };
    match what {
        "missing" => std::fs::remove_file(&shard).unwrap(),
        "truncated" => {
            let bytes = std::fs::read(&shard).unwrap();
            std::fs::write(&shard, &bytes[..bytes.len() / 2 + 100]).unwrap();
        }
        "no_label" => {
            let mut tar = tar::Archive::new(std::fs::File::open(&shard).unwrap());
            let mut out = tar::Builder::new(Vec::new());
            for entry in tar.entries().unwrap() {
                let mut entry = entry.unwrap();
                let name = entry.path().unwrap().to_string_lossy().to_string();
                if name == "000000003.cls" {
                    continue;
                }
                let mut header = entry.header().clone();
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
                out.append_data(&mut header, &name, data.as_slice())
                    .unwrap();
            }
            std::fs::write(&shard, out.into_inner().unwrap()).unwrap();
        }
        _ => {}
    }
    let err = match streamed {
        false => WebDataset::open(vec![shard.clone()], &keys(), classes, 3).err(),
        true => StreamedShards::open(vec![shard.display().to_string()], &keys(), classes, 3).err(),
    }
    .expect("refused")
    .to_string();
    assert!(err.contains(says), "expected '{says}' in: {err}");
    assert!(err.contains("train-000000.tar"), "names the shard: {err}");
}

/// A damaged image stops the run naming its shard and key; from the CLI, bad patterns and missing URLs
/// are refused before training.
#[test]
fn a_damaged_image_and_bad_urls_are_named() {
    let (p, shards) = packed();
    let shard = shards.join("train-000000.tar");
    let mut bytes = std::fs::read(&shard).unwrap();
    // The first member's data starts after its 512-byte header: overwrite the PNG signature.
    bytes[512..520].copy_from_slice(b"garbage!");
    std::fs::write(&shard, bytes).unwrap();
    let set = WebDataset::open(vec![shard.clone()], &keys(), 10, 3).unwrap();
    let streamed = StreamedShards::open(vec![shard.display().to_string()], &keys(), 10, 3).unwrap();
    let mut stream = streamed.open_shard(0, 0).unwrap();
    for err in [
        set.get(0).unwrap_err().to_string(),
        stream
            .next()
            .unwrap()
            .unwrap()
            .into_image()
            .unwrap_err()
            .to_string(),
    ] {
        assert!(
            err.contains("train-000000.tar")
                && err.contains("sample '000000000'")
                && err.contains("cannot be decoded"),
            "{err}"
        );
    }
    assert!(set.get(1).is_ok());
    assert!(stream.next().unwrap().unwrap().into_image().is_ok());
    let bad = format!(
        "data.train_urls='{}/train-{{000..002.tar'",
        shards.display()
    );
    let mut args: Vec<&str> = ON_SHARDS.to_vec();
    args.extend([bad.as_str(), "data.val_urls=x.tar"]);
    let out = train(p.path(), &args);
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && text.contains("data.train_urls") && text.contains("without '}'"),
        "{text}"
    );
    // No training shards named: training needs them (evaluating alone would not, `train eval`).
    let mut args: Vec<&str> = ON_SHARDS.to_vec();
    args.push("data.val_urls=x.tar");
    let out = train(p.path(), &args);
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && text.contains("data.train_urls")
            && text.contains("training split"),
        "{text}"
    );
}

/// With `data.skip_corrupt=true` a damaged image is left out of its batch, indexed or streamed: the run
/// ends, and its summary counts the sample and names its shard and key; without it the run stops there,
/// naming them.
#[rstest]
#[case::indexed("data.stream_shards=false")]
#[case::streamed("data.stream_shards=true")]
fn a_damaged_image_is_skipped_when_asked(#[case] reading: &str) {
    let (p, shards) = packed();
    let shard = shards.join("train-000000.tar");
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[512..520].copy_from_slice(b"garbage!");
    std::fs::write(&shard, bytes).unwrap();
    let [train_urls, val_urls] = urls(&shards);
    let mut base: Vec<&str> = ON_SHARDS.to_vec();
    base.extend([
        train_urls.as_str(),
        val_urls.as_str(),
        reading,
        "trainer.max_epochs=1",
    ]);
    let out = train(p.path(), &base);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("train-000000.tar")
            && err.contains("sample '000000000'"),
        "{err}"
    );
    let run = run_with(p.path(), "skipping", &base, &["data.skip_corrupt=true"]);
    let s = summary(&run);
    assert_eq!(s["global_step"], 4, "{s}");
    let skipped = &s["skipped_samples"];
    assert_eq!(skipped["count"], 1, "{s}");
    let first = skipped["first"][0].as_str().unwrap();
    assert!(
        first.contains("train-000000.tar") && first.contains("sample '000000000'"),
        "{first}"
    );
}

/// `train pack` reads the dataset as a run with the same overrides would: generated data follows `seed`
/// (the same seed packs the same bytes, another seed other images), and `-cp`/`-cn` name the configs as
/// for `train` itself.
#[test]
fn pack_follows_the_seed_and_the_config_location() {
    let p = real_project();
    let pack = |cwd: &Path, args: &[&str]| {
        let mut all = vec![
            "pack",
            "data=synthetic",
            "data.train_size=6",
            "data.val_size=2",
        ];
        all.extend_from_slice(args);
        succeeded(&train(cwd, &all));
    };
    let shard = |dir: &str| std::fs::read(p.path().join(dir).join("train-000000.tar")).unwrap();
    pack(p.path(), &["out=s1", "seed=1"]);
    pack(p.path(), &["out=s1_again", "seed=1"]);
    pack(p.path(), &["out=s2", "seed=2"]);
    assert!(
        shard("s1") == shard("s1_again"),
        "the same seed packed different bytes"
    );
    assert!(
        shard("s1") != shard("s2"),
        "another seed packed the same images"
    );
    // From a directory with no project, the configs named by -cp/-cn (and --config-name=...).
    let elsewhere = tempfile::tempdir().unwrap();
    let conf = p.path().join("conf");
    let out = format!("out={}", elsewhere.path().join("s3").display());
    pack(
        elsewhere.path(),
        &[
            "-cp",
            conf.to_str().unwrap(),
            "--config-name=train",
            &out,
            "seed=1",
        ],
    );
    assert!(std::fs::read(elsewhere.path().join("s3/train-000000.tar")).unwrap() == shard("s1"));
}
