//! BatchSizeFinder (Lightning's semantics): try batch sizes for a few steps each and keep the largest that
//! trains without running out of memory. `power` doubles from `init_val` until a trial fails; `binsearch`
//! then bisects between the last success and the first failure and keeps `margin` in reserve. The search is
//! separate from how a trial runs, so it is tested against a model of memory and used with real trials.

use crate::schema::{BatchScaleMode, BatchSizeFinder};
use serde::Serialize;

/// What one trial measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Trial {
    pub batch_size: usize,
    /// Peak memory of the trial above what was in use before it (heap bytes on CPU).
    pub peak_bytes: u64,
    pub fits: bool,
}

/// The finder's outcome, recorded in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub mode: BatchScaleMode,
    /// The batch size the run uses (after `margin` in binsearch mode).
    pub found: usize,
    /// The largest batch size that fitted, before `margin`.
    pub largest_fitting: usize,
    pub max_memory: Option<u64>,
    pub trials: Vec<Trial>,
    /// Why the search stopped.
    pub stopped_because: String,
}

/// Whether an error is the device running out of memory (CUDA's "out of memory", libtorch's
/// `OutOfMemoryError`): the finder treats it as "does not fit" and carries on, as Lightning does.
pub fn is_out_of_memory(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        let text = c.to_string().to_ascii_lowercase();
        text.contains("out of memory") || text.contains("outofmemoryerror")
    })
}

/// Run the search. `trial(batch_size)` trains `steps_per_trial` steps at that size and returns the peak
/// bytes; an out-of-memory error (see `is_out_of_memory`) counts as "does not fit", any other error stops
/// the search. `limit` caps the batch size (the training set's length: a batch cannot be larger than the
/// data).
pub fn search(
    cfg: &BatchSizeFinder,
    limit: usize,
    mut trial: impl FnMut(usize) -> anyhow::Result<u64>,
) -> anyhow::Result<Finding> {
    let max_memory = cfg.max_memory;
    let cap = cfg.max_val.unwrap_or(usize::MAX).min(limit.max(1));
    anyhow::ensure!(
        cfg.init_val >= 1 && cfg.init_val <= cap,
        "callbacks.batch_size_finder.init_val={} must be between 1 and {cap} (max_val and the training set's size)",
        cfg.init_val
    );
    anyhow::ensure!(
        (0.0..1.0).contains(&cfg.margin),
        "callbacks.batch_size_finder.margin={} must be in [0, 1)",
        cfg.margin
    );
    let mut trials: Vec<Trial> = Vec::new();
    let mut run = |b: usize, trials: &mut Vec<Trial>| -> anyhow::Result<bool> {
        let (peak, fits) = match trial(b) {
            Ok(peak) => (peak, max_memory.is_none_or(|m| peak <= m)),
            Err(e) if is_out_of_memory(&e) => {
                tracing::info!("batch size finder: batch {b}: {e:#}");
                (0, false)
            }
            Err(e) => return Err(e),
        };
        tracing::info!(
            "batch size finder: batch {b}: peak {:.1} MiB{}",
            peak as f64 / (1u64 << 20) as f64,
            if fits {
                ""
            } else {
                " — over the memory budget"
            }
        );
        trials.push(Trial {
            batch_size: b,
            peak_bytes: peak,
            fits,
        });
        Ok(fits)
    };
    let max_trials = cfg.max_trials.max(1) as usize;
    let mut good: Option<usize> = None;
    let mut bad: Option<usize> = None;
    let mut b = cfg.init_val;
    let mut stopped = String::new();
    // Doubling phase (both modes).
    while trials.len() < max_trials {
        if run(b, &mut trials)? {
            good = Some(b);
            if b >= cap {
                stopped = format!("reached the cap of {cap} (max_val / training set size)");
                break;
            }
            b = (b * 2).min(cap);
        } else {
            bad = Some(b);
            stopped = format!("batch {b} ran out of memory");
            break;
        }
    }
    if stopped.is_empty() {
        stopped = format!("max_trials={} reached", cfg.max_trials);
    }
    // Bisection phase.
    if cfg.mode == BatchScaleMode::Binsearch {
        if let (Some(mut low), Some(mut high)) = (good, bad) {
            while high - low > 1 && trials.len() < max_trials {
                let mid = (low + high) / 2;
                if run(mid, &mut trials)? {
                    low = mid;
                } else {
                    high = mid;
                }
            }
            good = Some(low);
            stopped = if high - low > 1 {
                format!("max_trials={} reached while bisecting", cfg.max_trials)
            } else {
                format!("{low} fits and {high} does not")
            };
        }
    }
    let Some(largest) = good else {
        let t = trials.first();
        anyhow::bail!(
            "batch size finder: even callbacks.batch_size_finder.init_val={} does not fit: peak {} bytes over \
             max_memory={} bytes; lower init_val or raise max_memory",
            cfg.init_val,
            t.map(|t| t.peak_bytes).unwrap_or(0),
            max_memory.unwrap_or(0)
        );
    };
    let found = match cfg.mode {
        BatchScaleMode::Binsearch => {
            ((largest as f64 * (1.0 - cfg.margin)).floor() as usize).max(1)
        }
        BatchScaleMode::Power => largest,
    };
    Ok(Finding {
        mode: cfg.mode,
        found,
        largest_fitting: largest,
        max_memory,
        trials,
        stopped_because: stopped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(mode: BatchScaleMode, max_memory: u64) -> BatchSizeFinder {
        BatchSizeFinder {
            mode,
            init_val: 2,
            steps_per_trial: 1,
            max_trials: 25,
            max_val: None,
            margin: 0.05,
            max_memory: Some(max_memory),
            fit_after: true,
        }
    }

    /// Memory model: 1000 bytes fixed plus 100 per sample.
    fn model(b: usize) -> anyhow::Result<u64> {
        Ok(1000 + 100 * b as u64)
    }

    #[rstest::rstest]
    // budget 7500 → 65 samples fit; power keeps 64, binsearch finds 65 then keeps 5% back (61).
    #[case(BatchScaleMode::Power, 7500, 10_000, 64, vec![2, 4, 8, 16, 32, 64, 128])]
    #[case(BatchScaleMode::Binsearch, 7500, 10_000, 61, vec![2, 4, 8, 16, 32, 64, 128, 96, 80, 72, 68, 66, 65])]
    // the training set caps the search
    #[case(BatchScaleMode::Power, 1_000_000, 100, 100, vec![2, 4, 8, 16, 32, 64, 100])]
    fn searches(
        #[case] mode: BatchScaleMode,
        #[case] budget: u64,
        #[case] limit: usize,
        #[case] found: usize,
        #[case] tried: Vec<usize>,
    ) {
        let f = search(&cfg(mode, budget), limit, model).unwrap();
        assert_eq!(f.found, found);
        let sizes: Vec<usize> = f.trials.iter().map(|t| t.batch_size).collect();
        assert_eq!(sizes, tried);
        for t in &f.trials {
            assert_eq!(t.fits, t.peak_bytes <= budget);
        }
    }

    #[test]
    fn max_trials_and_failure_at_the_start() {
        let mut c = cfg(BatchScaleMode::Power, 1 << 40);
        c.max_trials = 3;
        let f = search(&c, 10_000, model).unwrap();
        assert_eq!((f.found, f.trials.len()), (8, 3));
        assert!(f.stopped_because.contains("max_trials"));
        let err = search(&cfg(BatchScaleMode::Power, 500), 10_000, model)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("init_val=2") && err.contains("max_memory=500"),
            "{err}"
        );
    }

    #[test]
    fn device_out_of_memory_errors_mean_does_not_fit() {
        let mut c = cfg(BatchScaleMode::Power, 1 << 40);
        c.max_memory = None;
        let f = search(&c, 10_000, |b| {
            if b > 16 {
                anyhow::bail!("CUDA out of memory. Tried to allocate 2.00 GiB")
            }
            model(b)
        })
        .unwrap();
        assert_eq!(f.found, 16);
        assert!(!f.trials.last().unwrap().fits);
    }

    #[test]
    fn trial_errors_other_than_memory_propagate() {
        let err = search(&cfg(BatchScaleMode::Power, 1 << 40), 100, |_| {
            anyhow::bail!("disk full")
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "disk full");
    }
}
