//! A CSV table as a map-style dataset (`own_model.data.CsvTable`): every column but `target` is a feature,
//! standardised with the training rows' mean and deviation; the last `val_fraction` of the rows are the
//! validation split. A malformed file is refused with its path, line and column.

use anyhow::Context;
use trainyard::registry::{DataContext, DataSplit, MapDataset, Sample, Target};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TableArgs {
    /// The CSV file (a header row, then numbers).
    path: String,
    /// The column to predict.
    target: String,
    /// The share of rows, at the end of the file, kept for validation.
    #[serde(default = "a_fifth")]
    val_fraction: f64,
}

fn a_fifth() -> f64 {
    0.2
}

struct Table {
    rows: Vec<(Vec<f32>, f32)>,
}

fn csv_table(args: TableArgs, ctx: &DataContext) -> anyhow::Result<Table> {
    anyhow::ensure!(
        args.val_fraction > 0.0 && args.val_fraction < 1.0,
        "field `val_fraction`: {} is not between 0 and 1",
        args.val_fraction
    );
    let mut reader = csv::Reader::from_path(&args.path)
        .with_context(|| format!("field `path`: cannot read {}", args.path))?;
    let header = reader.headers()?.clone();
    let target = header
        .iter()
        .position(|c| c == args.target)
        .with_context(|| {
            let columns: Vec<&str> = header.iter().collect();
            format!(
                "field `target`: {} has no column '{}' (it has {columns:?})",
                args.path, args.target
            )
        })?;
    let mut rows = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let record = record?;
        let line = i + 2;
        let mut values = Vec::with_capacity(record.len());
        for (column, cell) in header.iter().zip(&record) {
            let value: f32 = cell.trim().parse().with_context(|| {
                format!(
                    "{}:{line}: column '{column}' holds '{cell}', not a number",
                    args.path
                )
            })?;
            values.push(value);
        }
        let y = values.remove(target);
        rows.push((values, y));
    }
    let train_rows = rows.len() - (rows.len() as f64 * args.val_fraction).round() as usize;
    anyhow::ensure!(train_rows > 0, "{}: too few rows to split", args.path);
    let (mean, std) = statistics(&rows[..train_rows]);
    for (x, _) in &mut rows {
        for ((v, m), s) in x.iter_mut().zip(&mean).zip(&std) {
            *v = (*v - m) / s;
        }
    }
    let rows = match ctx.split {
        DataSplit::Train => rows[..train_rows].to_vec(),
        DataSplit::Val | DataSplit::Test => rows[train_rows..].to_vec(),
    };
    Ok(Table { rows })
}

/// Each feature's mean and standard deviation (1 where a column is constant).
fn statistics(rows: &[(Vec<f32>, f32)]) -> (Vec<f32>, Vec<f32>) {
    let n = rows.len() as f32;
    let features = rows[0].0.len();
    let mean: Vec<f32> = (0..features)
        .map(|j| rows.iter().map(|(x, _)| x[j]).sum::<f32>() / n)
        .collect();
    let std = (0..features)
        .map(|j| {
            let var = rows
                .iter()
                .map(|(x, _)| (x[j] - mean[j]).powi(2))
                .sum::<f32>()
                / n;
            if var > 0.0 {
                var.sqrt()
            } else {
                1.0
            }
        })
        .collect();
    (mean, std)
}

impl MapDataset for Table {
    fn len(&self) -> usize {
        self.rows.len()
    }

    fn get(&self, index: usize) -> anyhow::Result<Sample> {
        let (x, y) = &self.rows[index];
        Ok(Sample {
            input: x.clone(),
            shape: vec![x.len()],
            target: Target::Values {
                values: vec![*y],
                shape: vec![1],
            },
        })
    }
}

trainyard::register_dataset!("own_model.data.CsvTable", csv_table);
