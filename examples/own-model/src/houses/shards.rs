//! The same table as CSV part files read as a stream of shards (`own_model.data.CsvShards`), as data too
//! large to index is read: one file per shard, a row at a time. Opening the dataset makes one pass over
//! the training files to count their rows (each shard's length) and to standardise the features with
//! their mean and deviation; training then reads each shard front to back.

use anyhow::Context;
use trainyard::registry::{DataContext, DataSplit, Sample, Samples, Shard, ShardedDataset, Target};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ShardsArgs {
    /// The training files, in WebDataset's brace notation (`train-{000..005}.csv`).
    train_files: String,
    /// The validation (and test) files.
    val_files: String,
    /// The column to predict.
    target: String,
}

struct CsvShards {
    files: Vec<(String, usize)>,
    target: usize,
    mean: Vec<f64>,
    std: Vec<f64>,
}

fn expand(field: &str, pattern: &str) -> anyhow::Result<Vec<String>> {
    trainyard::data::webdataset::expand_urls(pattern)
        .map_err(|e| anyhow::anyhow!("field `{field}`: {e}"))
}

/// A file's header and its rows as numbers, lazily; errors name the file, the line and the column.
fn rows(
    path: &str,
) -> anyhow::Result<(
    csv::StringRecord,
    impl Iterator<Item = anyhow::Result<Vec<f64>>>,
)> {
    let mut reader = csv::Reader::from_path(path).with_context(|| format!("cannot read {path}"))?;
    let header = reader.headers()?.clone();
    let columns = header.clone();
    let path = path.to_string();
    let rows = reader.into_records().enumerate().map(move |(i, record)| {
        let record = record?;
        columns
            .iter()
            .zip(&record)
            .map(|(column, cell)| {
                cell.trim().parse().with_context(|| {
                    format!(
                        "{path}:{}: column '{column}' holds '{cell}', not a number",
                        i + 2
                    )
                })
            })
            .collect()
    });
    Ok((header, rows))
}

fn csv_shards(args: ShardsArgs, ctx: &DataContext) -> anyhow::Result<CsvShards> {
    let train = expand("train_files", &args.train_files)?;
    let (header, _) = rows(&train[0]).context("field `train_files`")?;
    let target = header
        .iter()
        .position(|c| c == args.target)
        .with_context(|| {
            format!(
                "field `target`: {} has no column '{}' (it has {:?})",
                train[0],
                args.target,
                header.iter().collect::<Vec<_>>()
            )
        })?;
    // One pass over the training rows: each file's length and the features' sums.
    let features = header.len() - 1;
    let (mut sum, mut squares, mut n) = (vec![0.0; features], vec![0.0; features], 0.0);
    let mut train_files = Vec::new();
    for path in &train {
        let mut count = 0;
        for row in rows(path)?.1 {
            let mut row = row?;
            row.remove(target);
            for (j, v) in row.iter().enumerate() {
                sum[j] += v;
                squares[j] += v * v;
            }
            n += 1.0;
            count += 1;
        }
        train_files.push((path.clone(), count));
    }
    let mean: Vec<f64> = sum.iter().map(|s| s / n).collect();
    let std = squares
        .iter()
        .zip(&mean)
        .map(|(q, m)| {
            let var = q / n - m * m;
            if var > 0.0 {
                var.sqrt()
            } else {
                1.0
            }
        })
        .collect();
    let files = match ctx.split {
        DataSplit::Train => train_files,
        DataSplit::Val | DataSplit::Test => expand("val_files", &args.val_files)?
            .into_iter()
            .map(|path| Ok((path.clone(), rows(&path)?.1.count())))
            .collect::<anyhow::Result<_>>()?,
    };
    Ok(CsvShards {
        files,
        target,
        mean,
        std,
    })
}

impl ShardedDataset for CsvShards {
    fn shards(&self) -> Vec<Shard> {
        self.files
            .iter()
            .map(|(path, len)| Shard {
                name: path.clone(),
                len: *len,
            })
            .collect()
    }

    fn open(&self, shard: usize, start: usize) -> anyhow::Result<Samples<'_>> {
        let (_, rows) = rows(&self.files[shard].0)?;
        Ok(Box::new(rows.skip(start).map(move |row| self.sample(row?))))
    }
}

impl CsvShards {
    /// A row as a sample: the standardised features, and the target's value.
    fn sample(&self, mut row: Vec<f64>) -> anyhow::Result<Sample> {
        let y = row.remove(self.target) as f32;
        let x: Vec<f32> = row
            .iter()
            .zip(&self.mean)
            .zip(&self.std)
            .map(|((v, m), s)| ((v - m) / s) as f32)
            .collect();
        Ok(Sample {
            shape: vec![x.len()],
            input: x,
            target: Target::Values {
                values: vec![y],
                shape: vec![1],
            },
        })
    }
}

trainyard::register_sharded_dataset!("own_model.data.CsvShards", csv_shards);
