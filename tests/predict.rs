//! `train predict` (Lightning's `trainer.predict`): one row per input of the split, in the split's order,
//! with what `train eval` measures on the same weights (the rows' top-1 is its test/acc1); the same rows
//! on every strategy (each input once over the ranks); parquet as well as CSV; the samples' own names
//! where the data set has them; bad output names refused with their key.

mod common;

use common::{succeeded, summary, train};
use rstest::rstest;
use std::path::Path;

const SMALL: &[&str] = &[
    "experiment=quickstart",
    "data.train_size=512",
    "data.val_size=101",
    "data.batch_size=32",
];

/// A checkpoint that predicts more than one class: the quickstart trained for three epochs.
fn fit(p: &Path) -> String {
    let args: Vec<&str> = SMALL
        .iter()
        .chain(&["trainer.max_epochs=3", "hydra.run.dir=logs/fit"])
        .copied()
        .collect();
    succeeded(&train(p, &args));
    format!(
        "ckpt_path={}",
        p.join("logs/fit/checkpoints/last.safetensors").display()
    )
}

/// `train predict` of `ckpt` with `extra`, into `logs/<dir>`; its stdout.
fn predict(p: &Path, ckpt: &str, dir: &str, extra: &[&str]) -> String {
    let run = format!("hydra.run.dir=logs/{dir}");
    let args: Vec<&str> = ["predict"]
        .iter()
        .chain(SMALL)
        .chain(&[ckpt, run.as_str()])
        .chain(extra)
        .copied()
        .collect();
    succeeded(&train(p, &args))
}

/// The CSV's header and rows.
fn read_csv(path: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap().split(',').map(String::from).collect();
    let rows = lines
        .map(|l| l.split(',').map(String::from).collect())
        .collect();
    (header, rows)
}

#[test]
fn each_input_once_in_order_and_its_top1_is_evals() {
    let p = tempfile::tempdir().unwrap();
    let ckpt = fit(p.path());
    let stdout = predict(p.path(), &ckpt, "pred", &[]);
    assert!(
        stdout.contains("predicted the 101 inputs of the test split")
            && stdout.contains("Predictions: logs/pred/predictions.csv"),
        "{stdout}"
    );
    let (header, rows) = read_csv(&p.path().join("logs/pred/predictions.csv"));
    assert_eq!(header, ["index", "target", "pred", "prob"]);
    assert_eq!(rows.len(), 101);
    let index: Vec<usize> = rows.iter().map(|r| r[0].parse().unwrap()).collect();
    assert_eq!(index, (0..101).collect::<Vec<_>>());
    let mut classes = std::collections::BTreeSet::new();
    let mut hits = 0;
    for r in &rows {
        let prob: f64 = r[3].parse().unwrap();
        assert!((0.1..=1.0).contains(&prob), "the likeliest of 10: {r:?}");
        classes.insert(r[2].clone());
        hits += usize::from(r[1] == r[2]);
    }
    assert!(classes.len() > 1, "a trained model: {classes:?}");

    let eval: Vec<&str> = ["eval"]
        .iter()
        .chain(SMALL)
        .chain(&[ckpt.as_str(), "hydra.run.dir=logs/eval"])
        .copied()
        .collect();
    succeeded(&train(p.path(), &eval));
    let acc1 = summary(&p.path().join("logs/eval"))["final_metrics"]["test/acc1"]
        .as_f64()
        .unwrap();
    assert!(
        (hits as f64 / 101.0 - acc1).abs() < 1e-9,
        "{hits}/101 against eval's {acc1}"
    );
    let s = summary(&p.path().join("logs/pred"));
    assert_eq!(s["eval_only"]["samples"], 101, "{s}");
    assert_eq!(s["train_time_s"], 0.0, "predicting trains nothing: {s}");
}

#[rstest]
#[case::data_parallel(&["trainer=dp_sim"])]
#[cfg_attr(feature = "torch", case::ddp(&["trainer=ddp_sim"]))]
#[cfg_attr(feature = "torch", case::fsdp(&["trainer=fsdp_sim"]))]
fn every_strategy_writes_one_process_rows(#[case] trainer: &[&str]) {
    let p = tempfile::tempdir().unwrap();
    let ckpt = fit(p.path());
    predict(p.path(), &ckpt, "single", &[]);
    predict(p.path(), &ckpt, "other", trainer);
    let (_, single) = read_csv(&p.path().join("logs/single/predictions.csv"));
    let (_, other) = read_csv(&p.path().join("logs/other/predictions.csv"));
    assert_eq!(single.len(), other.len());
    for (a, b) in single.iter().zip(&other) {
        assert_eq!(a[..3], b[..3], "{trainer:?}");
        let (pa, pb): (f64, f64) = (a[3].parse().unwrap(), b[3].parse().unwrap());
        assert!((pa - pb).abs() < 1e-5, "{a:?} against {b:?}");
    }
}

#[test]
fn parquet_rows_name_the_files_they_came_from() {
    let p = tempfile::tempdir().unwrap();
    // A CINIC-10-style image folder: 10 classes, 2 images each, in its validation split.
    for class in 0..10 {
        let dir = p.path().join(format!("cinic/valid/class{class}"));
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..2 {
            let img = image::RgbImage::from_fn(32, 32, |x, y| {
                image::Rgb([(x * 8) as u8, (y * 8) as u8, (class * 20 + i) as u8])
            });
            img.save(dir.join(format!("img{i}.png"))).unwrap();
        }
    }
    let out = train(
        p.path(),
        &[
            "predict",
            "experiment=quickstart",
            "data=cinic10",
            "data.root=cinic",
            "data.train_size=null",
            "data.val_size=null",
            "data.num_workers=1",
            "predict.split=val",
            "predict.output=out/rows.parquet",
            "hydra.run.dir=logs/pq",
        ],
    );
    let stdout = succeeded(&out);
    assert!(
        stdout.contains("of the val split with the model's initial weights"),
        "{stdout}"
    );
    let file = std::fs::File::open(p.path().join("logs/pq/out/rows.parquet")).unwrap();
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::RowAccessor;
    let reader = SerializedFileReader::new(file).unwrap();
    let rows: Vec<parquet::record::Row> = reader
        .get_row_iter(None)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(rows.len(), 20);
    let names: Vec<String> = rows[0].get_column_iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(names, ["index", "id", "target", "pred", "prob"]);
    for row in &rows {
        let text = row.to_string();
        let target = row.get_long(2).unwrap();
        assert!(
            text.contains(&format!("class{target}/img")),
            "the id is the file of that class: {text}"
        );
    }
}

#[rstest]
#[case::format(&["predict.output=rows.txt"], &["predict.output", "rows.txt", ".parquet"])]
#[case::split(&["predict.split=holdout"], &["predict.split", "holdout"])]
fn bad_predict_settings_are_named(#[case] extra: &[&str], #[case] expected: &[&str]) {
    let p = tempfile::tempdir().unwrap();
    let args: Vec<&str> = ["predict", "experiment=quickstart"]
        .iter()
        .chain(extra)
        .copied()
        .collect();
    let out = train(p.path(), &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for part in expected {
        assert!(err.contains(part), "{part} not in {err}");
    }
}

#[test]
fn predict_answers_help() {
    let p = tempfile::tempdir().unwrap();
    let stdout = succeeded(&train(p.path(), &["predict", "--help"]));
    assert!(
        stdout.contains("train predict") && stdout.contains("predict.output"),
        "{stdout}"
    );
}
