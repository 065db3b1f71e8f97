//! Samples left out of their batch because their image could not be decoded (`data.skip_corrupt`), as
//! WebDataset's `warn_and_continue` handler leaves them out: counted, the first few named (and warned
//! about when they happen), for the run's summary.

use super::DataError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Skipped samples named in the summary (and warned about), at most.
pub const NAMED: usize = 20;

#[derive(Debug, Default)]
pub struct Skipped {
    count: AtomicU64,
    named: Mutex<Vec<String>>,
}

impl Skipped {
    /// Counts the sample `error` left out; the first `NAMED` are warned about and kept.
    pub fn record(&self, error: &DataError) {
        let n = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        if n as usize <= NAMED {
            tracing::warn!("data.skip_corrupt: left out of its batch: {error}");
            self.named
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(error.to_string());
        }
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// The first samples skipped, as their errors named them.
    pub fn named(&self) -> Vec<String> {
        self.named.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
