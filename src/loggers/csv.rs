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
}

impl CsvLogger {
    /// Create (or, when resuming, append to) `metrics.csv` in `dir`.
    pub fn open(dir: &Path, append: bool) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("metrics.csv");
        let exists = append && path.is_file();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(exists)
            .write(true)
            .truncate(!exists)
            .open(&path)?;
        let mut logger = CsvLogger {
            file: std::io::BufWriter::new(file),
        };
        if !exists {
            writeln!(logger.file, "{}", COLUMNS.join(","))?;
        }
        Ok(logger)
    }

    pub fn log(&mut self, values: &BTreeMap<&str, f64>) -> std::io::Result<()> {
        let row: Vec<String> = COLUMNS
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
