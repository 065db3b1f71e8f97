//! The console's lines: one per epoch (training and validation metrics, time, throughput) and one per
//! mid-epoch validation. They go through `tracing`, so they also land in the run's `train.log` (and a
//! rank's own log); the progress bar during an epoch is the trainer's.

use super::{MetricSink, Row, RowKind};

pub struct ConsoleLines {
    pub max_epochs: u64,
    /// Training batches per epoch (where a mid-epoch validation stands).
    pub train_batches: usize,
}

impl ConsoleLines {
    /// `val/loss 0.6931  val/acc1 0.512  ...`: the loss first, then the other validation metrics.
    fn validation(row: &Row) -> Option<String> {
        row.get("val/loss")?;
        Some(Self::phase(row, "val/"))
    }

    /// The row's metrics of one phase (`train/`, `val/`), the loss first; accuracies to 3 places.
    fn phase(row: &Row, prefix: &str) -> String {
        let loss = format!("{prefix}loss");
        let mut keys: Vec<&str> = row
            .values
            .iter()
            .map(|(k, _)| *k)
            .filter(|k| k.starts_with(prefix) && *k != loss)
            .collect();
        keys.insert(0, &loss);
        keys.iter()
            .filter_map(|k| {
                let v = row.get(k)?;
                Some(match k.strip_prefix(prefix).unwrap_or(k) {
                    "acc" | "acc1" | "acc5" => format!("{k} {v:.3}"),
                    _ => format!("{k} {v:.4}"),
                })
            })
            .collect::<Vec<_>>()
            .join("  ")
    }
}

impl MetricSink for ConsoleLines {
    fn log(&mut self, row: &Row) -> anyhow::Result<()> {
        let epoch = row.epoch + 1;
        let max_epochs = self.max_epochs;
        match row.kind {
            RowKind::Step => {}
            RowKind::MidEpochValidation { batches_done } => tracing::info!(
                "epoch {epoch}/{max_epochs}  step {}  (batch {batches_done}/{})  {}",
                row.step,
                self.train_batches,
                Self::validation(row).unwrap_or_default()
            ),
            RowKind::Test => tracing::info!("test  {}", Self::phase(row, "test/")),
            RowKind::Epoch => tracing::info!(
                "epoch {epoch}/{max_epochs}  step {}  {}{}  {:.1}s  {:.0} img/s",
                row.step,
                Self::phase(row, "train/"),
                Self::validation(row)
                    .map(|v| format!("  {v}"))
                    .unwrap_or_default(),
                row.get("epoch_time_s").unwrap_or(0.0),
                row.get("samples_per_s").unwrap_or(0.0)
            ),
        }
        Ok(())
    }
}

/// The console logger's bar (batches, ETA, loss, throughput) when stdout is a terminal and the logger is
/// not in plain mode; otherwise none, and the per-epoch lines are the console output.
pub fn progress_bar(
    exp: &crate::schema::Experiment,
    batches: usize,
    epoch: u64,
    max_epochs: u64,
) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    let console = exp.logger.console.as_ref()?;
    if console.plain || !std::io::stdout().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(batches as u64);
    let style = indicatif::ProgressStyle::with_template(
        "epoch {prefix} [{bar:30}] {pos}/{len} ETA {eta} {msg}",
    )
    .ok()?
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(format!("{}/{max_epochs}", epoch + 1));
    Some(bar)
}
