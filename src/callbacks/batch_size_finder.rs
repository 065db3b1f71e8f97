//! BatchSizeFinder (Lightning's semantics): try batch sizes for `steps_per_trial` training steps each and
//! keep the largest that trains without running out of memory. The search is separate from how a trial
//! runs, so it is tested against a model of memory and used with real trials.
//!
//! As Lightning's `_run_power_scaling` / `_run_binary_scaling`:
//! - `power` doubles from `init_val` until a size does not fit and keeps the last that did. While nothing
//!   has fitted yet it halves instead (an `init_val` too large searches downward). `max_trials` counts every
//!   trial.
//! - `binsearch` doubles the same way, then bisects between the largest size that fits and the smallest
//!   that does not, and keeps `margin` (a fraction) in reserve. `max_trials` counts successful trials only
//!   and, as in Lightning, the search stops when they exceed it.
//! - `max_val` caps every size tried; the training set's length caps it too (Lightning stops once a size
//!   reaches the dataset's length; we also never try more than it).
//! - Skipped under `trainer.fast_dev_run` (decided by the trainer, as Lightning warns and skips).
//!
//! Where Lightning returns a size it never tried, we return the largest size that fitted instead: when
//! `max_trials` runs out mid-doubling (Lightning returns the next, untried double), when a halving search
//! finds a fit (Lightning tries the double again, which is known not to fit), and when nothing fits
//! (Lightning returns the halved, untried size, down to 0; we try down to 1 and then say so). Before
//! anything fits, binsearch's lower bound is 0, not Lightning's assumed 1, for the same reason.
//!
//! Trials run training steps only. Lightning's trials are short fits that validate only if the training
//! epoch ends within `steps_per_trial` steps; an evaluation step at the same batch size keeps no
//! gradients or optimizer state, so it cannot make a size that trains fail.

use crate::schema::{BatchScaleMode, BatchSizeFinder};
use serde::{Deserialize, Serialize};

/// What one trial measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    pub batch_size: usize,
    /// Peak memory of the trial above what was in use before it (heap bytes on CPU).
    pub peak_bytes: u64,
    pub fits: bool,
}

/// The finder's outcome, recorded in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
fn is_out_of_memory(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        let text = c.to_string().to_ascii_lowercase();
        text.contains("out of memory") || text.contains("outofmemoryerror")
    })
}

/// The trials run so far and how to run another.
struct Trials<F> {
    trial: F,
    max_memory: Option<u64>,
    done: Vec<Trial>,
}

impl<F: FnMut(usize) -> anyhow::Result<u64>> Trials<F> {
    /// Run a trial at `b`: whether it fits. Out of memory means "no"; other errors end the search.
    fn fits(&mut self, b: usize) -> anyhow::Result<bool> {
        let (peak, fits) = match (self.trial)(b) {
            Ok(peak) => (peak, self.max_memory.is_none_or(|m| peak <= m)),
            Err(e) if is_out_of_memory(&e) => {
                tracing::info!("batch size finder: batch {b}: {e:#}");
                (0, false)
            }
            Err(e) => return Err(e),
        };
        tracing::info!(
            "batch size finder: batch {b}: peak {:.1} MiB{}",
            peak as f64 / (1u64 << 20) as f64,
            if fits { "" } else { " — does not fit" }
        );
        self.done.push(Trial {
            batch_size: b,
            peak_bytes: peak,
            fits,
        });
        Ok(fits)
    }

    fn known(&self, b: usize) -> Option<bool> {
        self.done.iter().find(|t| t.batch_size == b).map(|t| t.fits)
    }

    fn largest_fitting(&self) -> Option<usize> {
        self.done
            .iter()
            .filter(|t| t.fits)
            .map(|t| t.batch_size)
            .max()
    }
}

/// `power`: double until a size does not fit; halve while nothing has fitted. Returns why it stopped.
fn power<F: FnMut(usize) -> anyhow::Result<u64>>(
    cfg: &BatchSizeFinder,
    cap: usize,
    t: &mut Trials<F>,
) -> anyhow::Result<String> {
    let mut b = cfg.init_val;
    for _ in 0..cfg.max_trials.max(1) {
        if t.fits(b)? {
            if b >= cap {
                return Ok(capped(b, cap));
            }
            let next = (b * 2).min(cap);
            if t.known(next) == Some(false) {
                return Ok(format!("{b} fits and {next} does not"));
            }
            b = next;
        } else if let Some(good) = t.largest_fitting() {
            return Ok(format!("{good} fits and {b} does not"));
        } else if b == 1 {
            return Ok("nothing fits, not even batch 1".into());
        } else {
            b /= 2;
        }
    }
    Ok(format!("max_trials={} trials run", cfg.max_trials.max(1)))
}

/// `binsearch`: double until a size does not fit, then bisect. Returns why it stopped.
fn binsearch<F: FnMut(usize) -> anyhow::Result<u64>>(
    cfg: &BatchSizeFinder,
    cap: usize,
    t: &mut Trials<F>,
) -> anyhow::Result<String> {
    let mut low = 0; // the largest size known to fit; 0 while none is
    let mut high: Option<usize> = None; // the smallest size known not to fit
    let mut successes = 0;
    let mut b = cfg.init_val;
    loop {
        if t.fits(b)? {
            successes += 1;
            if successes > cfg.max_trials.max(1) {
                return Ok(format!(
                    "max_trials={}: {successes} sizes fitted (failed trials do not count)",
                    cfg.max_trials.max(1)
                ));
            }
            low = b;
            match high {
                Some(h) if h - low <= 1 => return Ok(format!("{low} fits and {h} does not")),
                Some(h) => b = (low + h) / 2,
                None if b >= cap => return Ok(capped(b, cap)),
                None => b = (b * 2).min(cap),
            }
        } else {
            high = Some(b);
            if b - low <= 1 {
                return Ok(match low {
                    0 => "nothing fits, not even batch 1".into(),
                    _ => format!("{low} fits and {b} does not"),
                });
            }
            b = (low + b) / 2;
        }
    }
}

fn capped(b: usize, cap: usize) -> String {
    format!("{b} fits and is the cap ({cap}: max_val or the training set's size)")
}

/// Run the search. `trial(batch_size)` trains `steps_per_trial` steps at that size and returns the peak
/// bytes; an out-of-memory error (see `is_out_of_memory`) counts as "does not fit", any other error stops
/// the search. `limit` caps the batch size (the training set's length: a batch cannot be larger than the
/// data).
pub fn search(
    cfg: &BatchSizeFinder,
    limit: usize,
    trial: impl FnMut(usize) -> anyhow::Result<u64>,
) -> anyhow::Result<Finding> {
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
    let mut t = Trials {
        trial,
        max_memory: cfg.max_memory,
        done: Vec::new(),
    };
    let stopped = match cfg.mode {
        BatchScaleMode::Power => power(cfg, cap, &mut t)?,
        BatchScaleMode::Binsearch => binsearch(cfg, cap, &mut t)?,
    };
    let Some(largest) = t.largest_fitting() else {
        let smallest = t.done.iter().min_by_key(|t| t.batch_size);
        anyhow::bail!(
            "batch size finder: nothing fits, down to batch {} (from callbacks.batch_size_finder.init_val={}): \
             peak {} bytes over max_memory={} bytes{}; raise max_memory, or make the model or images smaller",
            smallest.map(|t| t.batch_size).unwrap_or(cfg.init_val),
            cfg.init_val,
            smallest.map(|t| t.peak_bytes).unwrap_or(0),
            cfg.max_memory.unwrap_or(0),
            if smallest.is_some_and(|t| t.batch_size > 1) {
                " (max_trials ran out before batch 1)"
            } else {
                ""
            }
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
        max_memory: cfg.max_memory,
        trials: t.done,
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

    use BatchScaleMode::{Binsearch, Power};

    /// Trials and result against the memory model, as Lightning's search would run them (see the module
    /// doc for where we stop at a tried size instead of returning an untried one).
    #[rstest::rstest]
    // budget 7500 → 65 samples fit; power keeps 64, binsearch finds 65 then keeps 5% back (61).
    #[case(Power, 7500, 2, 25, 10_000, 64, vec![2, 4, 8, 16, 32, 64, 128])]
    #[case(Binsearch, 7500, 2, 25, 10_000, 61, vec![2, 4, 8, 16, 32, 64, 128, 96, 80, 72, 68, 66, 65])]
    // the training set caps the search
    #[case(Power, 1_000_000, 2, 25, 100, 100, vec![2, 4, 8, 16, 32, 64, 100])]
    #[case(Binsearch, 1_000_000, 2, 25, 100, 95, vec![2, 4, 8, 16, 32, 64, 100])]
    // init_val too large (budget 1500 → 5 fit): power halves until a size fits and stops there, since the
    // double is known not to fit; binsearch bisects below init_val.
    #[case(Power, 1500, 16, 25, 10_000, 4, vec![16, 8, 4])]
    #[case(Binsearch, 1500, 16, 25, 10_000, 4, vec![16, 8, 4, 6, 5])]
    // power's max_trials counts every trial; binsearch's only those that fit, stopping when they exceed it
    #[case(Power, 7500, 2, 5, 10_000, 32, vec![2, 4, 8, 16, 32])]
    #[case(Binsearch, 7500, 2, 5, 10_000, 60, vec![2, 4, 8, 16, 32, 64])]
    #[case(Power, 1500, 16, 2, 10_000, 0, vec![16, 8])]
    #[case(Binsearch, 7500, 2, 7, 10_000, 61, vec![2, 4, 8, 16, 32, 64, 128, 96, 80, 72, 68, 66, 65])]
    fn searches(
        #[case] mode: BatchScaleMode,
        #[case] budget: u64,
        #[case] init_val: usize,
        #[case] max_trials: u64,
        #[case] limit: usize,
        #[case] found: usize,
        #[case] tried: Vec<usize>,
    ) {
        let mut c = cfg(mode, budget);
        c.init_val = init_val;
        c.max_trials = max_trials;
        let result = search(&c, limit, model);
        let f = match (result, found) {
            (Err(e), 0) => {
                // Nothing fitted within max_trials: an error naming the smallest size tried.
                let e = e.to_string();
                assert!(
                    e.contains("down to batch 8") && e.contains("max_trials"),
                    "{e}"
                );
                return;
            }
            (r, _) => r.unwrap(),
        };
        assert_eq!(f.found, found, "{f:?}");
        let sizes: Vec<usize> = f.trials.iter().map(|t| t.batch_size).collect();
        assert_eq!(sizes, tried);
        for t in &f.trials {
            assert_eq!(t.fits, t.peak_bytes <= budget);
        }
        assert!(f
            .trials
            .iter()
            .any(|t| t.fits && t.batch_size == f.largest_fitting));
    }

    #[test]
    fn max_trials_and_failure_at_the_start() {
        let mut c = cfg(Power, 1 << 40);
        c.max_trials = 3;
        let f = search(&c, 10_000, model).unwrap();
        assert_eq!((f.found, f.trials.len()), (8, 3));
        assert!(f.stopped_because.contains("max_trials"));
        // Not even batch 1 fits: tried down to 1, then an error saying what to change.
        for mode in [Power, Binsearch] {
            let f = search(&cfg(mode, 500), 10_000, model);
            let err = f.unwrap_err().to_string();
            assert!(
                err.contains("down to batch 1")
                    && err.contains("init_val=2")
                    && err.contains("max_memory=500"),
                "{err}"
            );
        }
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
