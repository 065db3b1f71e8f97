//! A project's own dataset read as a stream of shards (`register_sharded_dataset!`, PyTorch's
//! `IterableDataset`): this test binary registers generated shards of a regression table, each shard an
//! iterator, and trains through trainyard's whole command line in this process. Each training sample is
//! read once per epoch, the shards are read front to back (opened once, at their start), the run learns,
//! and a run stopped mid-epoch resumes at the next unread sample and ends equal to an uninterrupted one.
//! A shard that breaks its promise fails with its name and the sample's place.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use trainyard::registry::{DataContext, DataSplit, Sample, Samples, Shard, ShardedDataset, Target};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TableArgs {
    /// Samples in each training shard (validation: one shard of `val_size`).
    shard_lens: Vec<usize>,
    val_size: usize,
    /// Where this test's records of what was read go (tests run side by side).
    tag: String,
    /// A shard that yields fewer samples than it says (the bad-input case).
    #[serde(default)]
    short_shard: Option<usize>,
}

/// Row `id` of the table: y = x0 - x1/2 + x2/3 + 0.5, x from a hash of (split, id).
fn row(split: u64, id: usize) -> (Vec<f32>, f32) {
    let mut state = (id as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ split;
    let mut uniform = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let x: Vec<f32> = (0..3).map(|_| uniform()).collect();
    let y = x[0] - x[1] / 2.0 + x[2] / 3.0 + 0.5;
    (x, y)
}

/// (tag, split, event): `open <shard> <start>` and `read <id>`.
static RECORD: Mutex<Vec<(String, DataSplit, String)>> = Mutex::new(Vec::new());

struct Table {
    lens: Vec<usize>,
    split: DataSplit,
    tag: String,
    short_shard: Option<usize>,
}

fn table(args: TableArgs, ctx: &DataContext) -> anyhow::Result<Table> {
    let lens = match ctx.split {
        DataSplit::Train => args.shard_lens,
        _ => vec![args.val_size],
    };
    Ok(Table {
        lens,
        split: ctx.split,
        tag: args.tag,
        short_shard: args.short_shard,
    })
}

impl ShardedDataset for Table {
    fn shards(&self) -> Vec<Shard> {
        self.lens
            .iter()
            .enumerate()
            .map(|(i, &len)| Shard {
                name: format!("rows-{i:03}.csv"),
                len,
            })
            .collect()
    }

    fn open(&self, shard: usize, start: usize) -> anyhow::Result<Samples<'_>> {
        let note = |event: String| {
            RECORD
                .lock()
                .unwrap()
                .push((self.tag.clone(), self.split, event))
        };
        note(format!("open {shard} {start}"));
        let base: usize = self.lens[..shard].iter().sum();
        let end = match self.short_shard {
            Some(s) if s == shard => self.lens[shard] - 1,
            _ => self.lens[shard],
        };
        let split = self.split as u64;
        Ok(Box::new((start..end).map(move |i| {
            note(format!("read {}", base + i));
            let (x, y) = row(split, base + i);
            Ok(Sample {
                input: x,
                shape: vec![3],
                target: Target::Values {
                    values: vec![y],
                    shape: vec![1],
                },
            })
        })))
    }
}

trainyard::register_sharded_dataset!("tests.data.ShardedTable", table);

const LENS: [usize; 5] = [40, 24, 56, 32, 48];

fn project() -> tempfile::TempDir {
    let dir = common::real_project();
    let conf = dir.path().join("conf");
    std::fs::write(
        conf.join("data/table.yaml"),
        "_target_: tests.data.ShardedTable\nshard_lens: [40, 24, 56, 32, 48]\nval_size: 64\n\
         tag: none\nbatch_size: 16\nnum_workers: 2\nnum_classes: 1\nshuffle_buffer: 32\n",
    )
    .unwrap();
    std::fs::write(
        conf.join("model/regressor.yaml"),
        "name: mlp\nnum_classes: ${data.num_classes}\nhidden: [32]\ndropout: 0.0\n",
    )
    .unwrap();
    dir
}

fn args(project: &Path, run: &Path, tag: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "train",
        "-cp",
        &project.join("conf").display().to_string(),
        "-cn",
        "train",
        "data=table",
        &format!("data.tag={tag}"),
        "+loss._target_=torch.nn.MSELoss",
        "model=regressor",
        "optimizer=adam",
        "optimizer.lr=0.01",
        "scheduler=constant",
        "trainer.max_epochs=3",
        "callbacks.model_checkpoint.monitor=val/loss",
        "callbacks.model_checkpoint.mode=min",
        "callbacks.early_stopping.monitor=val/loss",
        "callbacks.early_stopping.mode=min",
        &format!("hydra.run.dir={}", run.display()),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn run(project: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let dir = project.join(name);
    let code =
        trainyard::app::main_entry(args(project, &dir, name, extra).into_iter().map(Into::into));
    assert_eq!(code, std::process::ExitCode::SUCCESS, "run {name} failed");
    dir
}

/// What run `tag` did with `split`'s shards.
fn events(tag: &str, split: DataSplit) -> Vec<String> {
    RECORD
        .lock()
        .unwrap()
        .iter()
        .filter(|(t, s, _)| t == tag && *s == split)
        .map(|(_, _, e)| e.clone())
        .collect()
}

/// How often each training sample was read.
fn read_counts(tag: &str) -> BTreeMap<usize, usize> {
    let mut counts = BTreeMap::new();
    for e in events(tag, DataSplit::Train) {
        if let Some(id) = e.strip_prefix("read ") {
            *counts.entry(id.parse().unwrap()).or_default() += 1;
        }
    }
    counts
}

#[test]
fn a_sharded_dataset_is_read_once_per_epoch_learns_and_resumes_mid_epoch() {
    let project = project();
    let total: usize = LENS.iter().sum();
    let straight = run(project.path(), "straight", &[]);
    let s = common::summary(&straight);
    let loss = s["final_metrics"]["val/loss"].as_f64().unwrap();
    assert!(loss < 0.02, "val/loss {loss}: it did not learn: {s}");
    // Three epochs, each sample once in each, plus the first sample read when the config was checked.
    let counts = read_counts("straight");
    assert_eq!(counts.len(), total, "every sample read");
    for (id, n) in &counts {
        assert_eq!(*n, 3 + usize::from(*id == 0), "sample {id}");
    }
    // Each shard opened at its start once per epoch (and shard 0 for the check): streamed, not fetched
    // sample by sample.
    let opens = events("straight", DataSplit::Train)
        .into_iter()
        .filter(|e| e.starts_with("open"))
        .collect::<Vec<_>>();
    assert_eq!(opens.len(), 3 * LENS.len() + 1, "{opens:?}");
    assert!(opens.iter().all(|e| e.ends_with(" 0")), "{opens:?}");
    // 200 samples in batches of 16: 13 steps an epoch.
    assert_eq!(s["global_step"], 39, "{s}");

    // Stopped in the second epoch, after 5 of its 13 batches, and resumed from that checkpoint.
    let stopped = run(project.path(), "stopped", &["trainer.max_steps=18"]);
    let last = stopped.join("checkpoints/last.safetensors");
    let resumed = run(
        project.path(),
        "resumed",
        &[&format!("ckpt_path={}", last.display())],
    );
    assert_eq!(common::summary(&resumed)["global_step"], 39);
    let diff =
        common::worst_relative_difference(&common::weights(&resumed), &common::weights(&straight));
    assert!(
        diff < 1e-6,
        "resumed and uninterrupted runs differ by {diff:e}"
    );
    // The resumed run did not read the second epoch again: shards are opened at their first sample still
    // unseen (the trained ones in between are read past, as a stream is), and whole shards already
    // trained are not opened.
    let resumed_reads: usize = read_counts("resumed").values().sum();
    let unseen = 1 + (total - 5 * 16) + total;
    assert!(
        (unseen..1 + 2 * total - 16).contains(&resumed_reads),
        "the resumed run read {resumed_reads} samples; {unseen} were unseen"
    );
}

/// What a run that must not start, or must stop, says (in this process, where the dataset is
/// registered).
fn failure(extra: &[&str]) -> String {
    let project = project();
    let dir = project.path().join("bad");
    let args = args(project.path(), &dir, "bad", extra);
    match trainyard::app::try_main(args.into_iter().map(Into::into)) {
        Err(e) => e,
        Ok(code) => {
            let log = std::fs::read_to_string(dir.join("train.log")).unwrap_or_default();
            assert_ne!(
                code,
                std::process::ExitCode::SUCCESS,
                "{extra:?} was accepted"
            );
            log
        }
    }
}

#[rstest::rstest]
#[case::short_shard(&["+data.short_shard=3"], &["tests.data.ShardedTable", "rows-003.csv", "ended after 31 samples", "len 32"])]
#[case::unknown_argument(&["+data.shards=3"], &["data.shards", "unknown field `shards`", "+data.shards=3"])]
#[case::uneven_typo(&["+data.uneven_shards=pda"], &["data.uneven_shards", "pda"])]
fn a_broken_shard_or_argument_is_named(#[case] extra: &[&str], #[case] wanted: &[&str]) {
    let e = failure(extra);
    for w in wanted {
        assert!(e.contains(w), "missing {w:?} in:\n{e}");
    }
}
