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
    fn validation(row: &Row) -> Option<String> {
        Some(format!(
            "val/loss {:.4}  val/acc1 {:.3}  val/acc5 {:.3}",
            row.get("val/loss")?,
            row.get("val/acc1")?,
            row.get("val/acc5")?
        ))
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
            RowKind::Epoch => tracing::info!(
                "epoch {epoch}/{max_epochs}  step {}  train/loss {:.4}  train/acc1 {:.3}{}  {:.1}s  {:.0} img/s",
                row.step,
                row.get("train/loss").unwrap_or(f64::NAN),
                row.get("train/acc1").unwrap_or(f64::NAN),
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
