//! `metrics.csv`: one row per logging event with a fixed header, empty cells where a metric was not
//! measured at that step (the shape Lightning's CSVLogger writes).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

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

pub struct CsvLogger {
    file: std::io::BufWriter<std::fs::File>,
    columns: Vec<&'static str>,
}

impl CsvLogger {
    /// Create (or, when resuming, append to) `metrics.csv` in `dir`, with `extra` columns after the
    /// standard ones (callbacks' metrics, e.g. device stats).
    pub fn open(dir: &Path, append: bool, extra: &[&'static str]) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("metrics.csv");
        let exists = append && path.is_file();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(exists)
            .write(true)
            .truncate(!exists)
            .open(&path)?;
        let columns: Vec<&'static str> = COLUMNS.iter().chain(extra).copied().collect();
        let mut logger = CsvLogger {
            file: std::io::BufWriter::new(file),
            columns,
        };
        if !exists {
            writeln!(logger.file, "{}", logger.columns.join(","))?;
        }
        Ok(logger)
    }

    pub fn log(&mut self, values: &BTreeMap<&str, f64>) -> std::io::Result<()> {
        let row: Vec<String> = self
            .columns
            .iter()
            .map(|c| {
                values
                    .get(c)
                    .map(|v| {
                        if v.fract() == 0.0 && v.abs() < 1e15 {
                            format!("{v:.0}")
                        } else {
                            format!("{v}")
                        }
                    })
                    .unwrap_or_default()
            })
            .collect();
        writeln!(self.file, "{}", row.join(","))?;
        self.file.flush()
    }
}
