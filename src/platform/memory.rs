//! Heap accounting: a global-allocator wrapper that keeps the bytes currently allocated and their peak, so the
//! batch-size finder can measure what a training step needs on the CPU (the counterpart of CUDA's
//! `max_memory_allocated`). The `train` binary installs it around mimalloc; elsewhere the counters stay zero.
//! `Meter` picks what a measurement reads: this heap (Candle's tensors are Rust allocations), the process's
//! resident memory (libtorch's CPU tensors come from its own allocator, which this heap never sees), or on
//! a CUDA run the caching allocator's own peak.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// Wraps an allocator and counts live bytes.
pub struct Counting<A>(pub A);

fn grew(by: usize) {
    let now = CURRENT.fetch_add(by, Relaxed) + by;
    // Read first: the shared peak is written only when it moves, so threads do not fight over it.
    if now > PEAK.load(Relaxed) {
        PEAK.fetch_max(now, Relaxed);
    }
}

// SAFETY: every call is forwarded to the wrapped allocator unchanged; only counters are updated.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { self.0.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                CURRENT.fetch_sub(layout.size() - new_size, Relaxed);
            }
        }
        p
    }
}

/// Bytes allocated now.
pub fn current() -> usize {
    CURRENT.load(Relaxed)
}

/// The most bytes allocated at once since the last `reset_peak`.
pub fn peak() -> usize {
    PEAK.load(Relaxed)
}

/// Start a new peak measurement from the current level; returns that level.
pub fn reset_peak() -> usize {
    let now = current();
    PEAK.store(now, Relaxed);
    now
}

/// Whether the counting allocator is installed in this process (the counters move).
pub fn is_counting() -> bool {
    let probe = vec![0u8; 64];
    let counting = current() >= probe.len();
    drop(probe);
    counting
}

/// Measures the peak memory of a stretch of work above what was in use when it started: the heap's on the
/// CPU, CUDA's caching allocator's (`max_memory_allocated`) when the run's tensors live on a GPU, where the
/// heap holds only host-side bookkeeping.
pub enum Meter {
    Heap {
        before: usize,
    },
    /// Resident memory (`VmHWM` since a reset, above `VmRSS` at the start): libtorch on the CPU.
    Resident {
        before: u64,
    },
    /// Per CUDA device: what was allocated at the start. DataParallel spreads one process over several
    /// devices and each must fit, so the reading is the largest device's.
    #[cfg(feature = "torch")]
    Cuda {
        before: Vec<u64>,
    },
}

impl Meter {
    /// Start measuring for a run of `exp`: CUDA's allocator for tch on a GPU, resident memory for tch on
    /// the CPU, the heap for Candle.
    pub fn start(exp: &crate::schema::Experiment) -> anyhow::Result<Meter> {
        #[cfg(feature = "torch")]
        if uses_cuda(exp) {
            let mut before = Vec::new();
            for index in 0..crate::platform::cuda::device_count() {
                crate::platform::cuda::reset_peak(index)?;
                before.push(crate::platform::cuda::memory_stats(index)?.allocated);
            }
            return Ok(Meter::Cuda { before });
        }
        if exp.backend == crate::schema::Backend::Tch {
            // Freed heap memory glibc still holds would count as in use at the start and hide as much
            // of the trial's peak: hand it back first.
            // SAFETY: malloc_trim only releases free memory; no pointer is touched.
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            unsafe {
                libc::malloc_trim(0);
            }
            reset_peak_rss();
            let before = rss_bytes().ok_or_else(|| {
                anyhow::anyhow!(
                    "the batch size finder on backend=tch measures the process's resident memory, which                      this system does not report (/proc/self/status); set callbacks.batch_size_finder.max_val"
                )
            })?;
            return Ok(Meter::Resident { before });
        }
        Ok(Meter::Heap {
            before: reset_peak(),
        })
    }

    /// The most bytes in use at once since `start`, above what was in use then.
    pub fn peak_above_start(&self) -> anyhow::Result<u64> {
        match self {
            Meter::Heap { before } => Ok(peak().saturating_sub(*before) as u64),
            Meter::Resident { before } => peak_rss_bytes()
                .map(|peak| peak.saturating_sub(*before))
                .ok_or_else(|| anyhow::anyhow!("/proc/self/status no longer reports VmHWM")),
            #[cfg(feature = "torch")]
            Meter::Cuda { before } => {
                let mut most = 0;
                for (index, before) in before.iter().enumerate() {
                    let peak = crate::platform::cuda::memory_stats(index)?.peak_allocated;
                    most = most.max(peak.saturating_sub(*before));
                }
                Ok(most)
            }
        }
    }
}

/// A `VmRSS`/`VmHWM`-style line of `/proc/self/status`, in bytes (Linux).
fn proc_status_bytes(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The process's resident memory now (Linux `VmRSS`).
pub fn rss_bytes() -> Option<u64> {
    proc_status_bytes("VmRSS:")
}

/// The process's peak resident memory (Linux `VmHWM`).
pub fn peak_rss_bytes() -> Option<u64> {
    proc_status_bytes("VmHWM:")
}

/// Start a new peak for `peak_rss_bytes` (Linux: writing 5 to `/proc/self/clear_refs` resets `VmHWM`), so
/// each job of an in-process sweep reports its own peak, not the largest of every job before it.
pub fn reset_peak_rss() {
    if let Err(e) = std::fs::write("/proc/self/clear_refs", "5") {
        tracing::debug!("could not reset the peak RSS (/proc/self/clear_refs): {e}");
    }
}

/// Whether `exp`'s tensors live on a CUDA device: tch on `gpu`/`cuda`, or on `auto` where CUDA is usable
/// (the rule `TchEngine::placed` follows).
#[cfg(feature = "torch")]
fn uses_cuda(exp: &crate::schema::Experiment) -> bool {
    use crate::schema::{Accelerator, Backend};
    exp.backend == Backend::Tch
        && match exp.trainer.accelerator {
            Accelerator::Gpu | Accelerator::Cuda => true,
            Accelerator::Auto => crate::platform::cuda::is_available(),
            Accelerator::Cpu => false,
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{Accelerator, Backend};

    fn experiment(backend: Backend, accelerator: Accelerator) -> crate::schema::Experiment {
        let mut exp = crate::testing::experiment(
            "{name: mlp, num_classes: 4, hidden: [8]}",
            "{name: sgd, lr: 0.1}",
            "{strategy: single, devices: 1}",
            4,
        );
        exp.backend = backend;
        exp.trainer.accelerator = accelerator;
        exp
    }

    /// A CPU run reads the heap: what it allocates after `start` is its peak, what was there before is
    /// not (in unit tests the counting allocator is not installed, so both are zero).
    #[test]
    fn a_cpu_run_is_measured_on_the_heap() {
        let meter = Meter::start(&experiment(Backend::Candle, Accelerator::Cpu)).unwrap();
        assert!(matches!(meter, Meter::Heap { .. }));
        let held = vec![1u8; 1 << 20];
        let peak = meter.peak_above_start().unwrap();
        drop(held);
        if is_counting() {
            assert!(peak >= 1 << 20, "{peak}");
        } else {
            assert_eq!(peak, 0);
        }
    }

    // libtorch on the CPU, measured on resident memory: `tests/resident_memory.rs` (a process of its own).

    /// Only tch on a GPU is measured on CUDA's allocator; Candle always runs on the CPU.
    #[cfg(feature = "torch")]
    #[rstest::rstest]
    #[case(Backend::Tch, Accelerator::Gpu, true)]
    #[case(Backend::Tch, Accelerator::Cuda, true)]
    #[case(Backend::Tch, Accelerator::Cpu, false)]
    #[case(Backend::Candle, Accelerator::Gpu, false)]
    fn cuda_is_measured_where_the_tensors_live(
        #[case] backend: Backend,
        #[case] accelerator: Accelerator,
        #[case] cuda: bool,
    ) {
        assert_eq!(uses_cuda(&experiment(backend, accelerator)), cuda);
    }
}
