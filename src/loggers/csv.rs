//! `metrics.csv`: one row per logging event with a fixed header, empty cells where a metric was not
//! measured at that step (the shape Lightning's CSVLogger writes). Rows reach the disk every
//! `logger.csv.flush_every_n_steps` steps (Lightning's `flush_logs_every_n_steps`), at every epoch's row,
//! and when the logger is dropped.

use crate::schema::RunMetrics;
use anyhow::Context;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The columns of a classification run (`RunMetrics::classification`); a registered loss's metrics take
/// the place of the accuracies.
pub const COLUMNS: &[&str] = &[
    "epoch",
    "step",
    "lr",
    "train/loss",
    "train/acc1",
    "val/loss",
    "val/acc1",
    "val/acc5",
    "epoch_time_s",
    "samples_per_s",
];

/// The header for a run that records `metrics`, then `extra` columns.
pub fn columns(metrics: &RunMetrics, extra: &[&str]) -> Vec<String> {
    ["epoch", "step", "lr"]
        .into_iter()
        .map(String::from)
        .chain(metrics.row_names())
        .chain(["epoch_time_s", "samples_per_s"].map(String::from))
        .chain(extra.iter().map(|c| c.to_string()))
        .collect()
}

pub struct CsvLogger {
    /// Buffered: rows reach the file at `flush()`.
    file: csv::Writer<std::fs::File>,
    /// Named by every error, as a full disk's or a failing one's.
    path: PathBuf,
    columns: Vec<String>,
    flush_every_n_steps: u64,
    /// The step of the last row flushed (0 before any).
    flushed_at: f64,
}

impl CsvLogger {
    /// Create `metrics.csv` in `dir`, with `columns` (`columns()`: the run's metrics, then callbacks' such
    /// as device stats); or, resuming at a step in the same directory, append to it after dropping the
    /// rows logged past that step (a restarted or preempted run logs them again: each step once).
    pub fn open(
        dir: &Path,
        resumed_at: Option<u64>,
        columns: Vec<String>,
        flush_every_n_steps: u64,
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("metrics.csv");
        let exists = resumed_at.is_some() && path.is_file();
        if let (true, Some(step)) = (exists, resumed_at) {
            drop_rows_after(&path, step)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(exists)
            .write(true)
            .truncate(!exists)
            .open(&path)?;
        let mut logger = CsvLogger {
            file: csv::Writer::from_writer(file),
            path,
            columns,
            flush_every_n_steps,
            flushed_at: 0.0,
        };
        if !exists {
            logger
                .file
                .write_record(&logger.columns)
                .map_err(io_error)?;
            logger.file.flush()?;
        }
        Ok(logger)
    }

    /// Write one row: `values` by column (`epoch` and `step` among them).
    pub fn write_row(&mut self, values: &BTreeMap<&str, f64>) -> std::io::Result<()> {
        let row = self.columns.iter().map(|c| {
            values
                .get(c.as_str())
                .map(|v| {
                    if v.fract() == 0.0 && v.abs() < 1e15 {
                        format!("{v:.0}")
                    } else {
                        format!("{v}")
                    }
                })
                .unwrap_or_default()
        });
        self.file.write_record(row).map_err(io_error)?;
        let step = values.get("step").copied().unwrap_or(0.0);
        let due = step - self.flushed_at >= self.flush_every_n_steps as f64;
        if due || values.contains_key("epoch_time_s") {
            self.flushed_at = step;
            self.file.flush()?;
        }
        Ok(())
    }
}

/// The I/O error inside a CSV one (a full or failing disk), so callers see its kind and message.
fn io_error(error: csv::Error) -> std::io::Error {
    match error.into_kind() {
        csv::ErrorKind::Io(e) => e,
        other => std::io::Error::other(format!("{other:?}")),
    }
}

/// Rewrite `metrics.csv` (atomically) without the rows whose `step` is past `step`.
fn drop_rows_after(path: &Path, step: u64) -> std::io::Result<()> {
    let text = std::fs::read(path)?;
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(text.as_slice());
    let header = reader.byte_headers().map_err(io_error)?.clone();
    let Some(column) = header.iter().position(|c| c == b"step") else {
        return Ok(());
    };
    let mut out = csv::WriterBuilder::new()
        .flexible(true)
        .from_writer(Vec::with_capacity(text.len()));
    out.write_byte_record(&header).map_err(io_error)?;
    for record in reader.byte_records() {
        let record = record.map_err(io_error)?;
        let past = std::str::from_utf8(record.get(column).unwrap_or_default())
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .is_some_and(|v| v > step as f64);
        if !past {
            out.write_byte_record(&record).map_err(io_error)?;
        }
    }
    let out = out.into_inner().map_err(|e| e.into_error())?;
    if out != text {
        crate::storage::records::write_atomic(path, &out)?;
    }
    Ok(())
}

/// Every row, with its epoch and step.
impl super::MetricSink for CsvLogger {
    fn log(&mut self, row: &super::Row) -> anyhow::Result<()> {
        let mut values: BTreeMap<&str, f64> = row.values.iter().copied().collect();
        values.insert("epoch", row.epoch as f64);
        values.insert("step", row.step as f64);
        self.write_row(&values)
            .with_context(|| format!("could not write {}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn rows_on_disk(dir: &Path) -> usize {
        std::fs::read_to_string(dir.join("metrics.csv"))
            .unwrap()
            .lines()
            .count()
            - 1
    }

    /// Rows wait in memory until the step has moved `flush_every_n_steps` on, or an epoch ends; dropping
    /// the logger writes the rest.
    #[rstest]
    #[case::every_hundred(100, &[(50.0, false), (100.0, false), (150.0, false)], &[0, 2, 2])]
    #[case::every_row(0, &[(1.0, false), (2.0, false)], &[1, 2])]
    #[case::epoch_rows_at_once(100, &[(10.0, false), (20.0, true), (30.0, false)], &[0, 2, 2])]
    fn rows_reach_the_disk_every_n_steps_and_at_epoch_ends(
        #[case] every: u64,
        #[case] rows: &[(f64, bool)],
        #[case] on_disk: &[usize],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut csv = CsvLogger::open(
            dir.path(),
            None,
            columns(&RunMetrics::classification(), &[]),
            every,
        )
        .unwrap();
        assert_eq!(rows_on_disk(dir.path()), 0, "the header is written at once");
        for ((step, epoch_end), expected) in rows.iter().zip(on_disk) {
            let mut row = BTreeMap::from([("step", *step), ("train/loss", 1.5)]);
            if *epoch_end {
                row.insert("epoch_time_s", 2.0);
            }
            csv.write_row(&row).unwrap();
            assert_eq!(rows_on_disk(dir.path()), *expected, "after step {step}");
        }
        drop(csv);
        assert_eq!(rows_on_disk(dir.path()), rows.len());
    }

    /// Resuming at step 2 in the same directory: the rows logged past it are dropped, then appended again.
    #[test]
    fn resuming_drops_the_rows_past_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let columns = vec![
            "epoch".to_string(),
            "step".to_string(),
            "train/loss".to_string(),
        ];
        let row = |step: f64, loss: f64| -> BTreeMap<&'static str, f64> {
            [("epoch", 0.0), ("step", step), ("train/loss", loss)].into()
        };
        {
            let mut csv = CsvLogger::open(dir.path(), None, columns.clone(), 0).unwrap();
            for step in 1..=4 {
                csv.write_row(&row(step as f64, 1.0)).unwrap();
            }
        }
        {
            let mut csv = CsvLogger::open(dir.path(), Some(2), columns, 0).unwrap();
            csv.write_row(&row(3.0, 0.5)).unwrap();
        }
        let text = std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap();
        assert_eq!(text, "epoch,step,train/loss\n0,1,1\n0,2,1\n0,3,0.5\n");
    }

    /// A metric whose name holds a comma (a user's `"f1,macro"`) is quoted as CSV quotes it, and survives
    /// a resume's rewrite: without quoting, its column would split in two and every later cell shift.
    #[test]
    fn names_with_commas_are_quoted_and_survive_a_resume() {
        let dir = tempfile::tempdir().unwrap();
        let columns = vec![
            "epoch".to_string(),
            "step".to_string(),
            "f1,macro".to_string(),
        ];
        let row = |step: f64| -> BTreeMap<&'static str, f64> {
            [("epoch", 0.0), ("step", step), ("f1,macro", 0.5)].into()
        };
        {
            let mut csv = CsvLogger::open(dir.path(), None, columns.clone(), 0).unwrap();
            for step in 1..=3 {
                csv.write_row(&row(step as f64)).unwrap();
            }
        }
        CsvLogger::open(dir.path(), Some(2), columns, 0).unwrap();
        let text = std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap();
        assert_eq!(text, "epoch,step,\"f1,macro\"\n0,1,0.5\n0,2,0.5\n");
    }
}
