//! What the hand-written CPU kernels share: reading a tensor's f32 data in place, and the check that a
//! tensor is one they handle (everything else goes to Candle's own ops). The helpers live in
//! `tensor::candle_cpu`, below the optimizer rules that use them too.

pub use crate::tensor::candle_cpu::{f32_slice, is_cpu_f32, with_f32};

/// Runs `f` on a worker thread of rayon's pool, so the kernels' parallel loops inside it start from a
/// worker (work is split among the pool's threads in place) rather than from outside the pool (each loop
/// queued to the pool while the calling thread sleeps, then woken: two context switches per kernel, and
/// an idle core between them). Only the process's main thread (`train`'s single-device and per-process
/// DDP/FSDP steps) hands its step over; any other runs `f` itself: DataParallel's replicas run in threads
/// of their own and wait for each other inside a step (SyncBatchNorm), so queued onto a pool with fewer
/// threads than replicas they would wait forever. The caller's `tracing` subscriber goes with `f`: the
/// run's logging is scoped to the main thread, so what the step logs on the worker was lost.
pub fn on_compute_pool<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    if rayon::current_thread_index().is_some() || std::thread::current().name() != Some("main") {
        return f();
    }
    let logging = tracing::dispatcher::get_default(|d| d.clone());
    // A scope's body runs on a pool thread, and the caller waits for it once.
    rayon::scope(|_| tracing::dispatcher::with_default(&logging, f))
}
#[cfg(test)]
use candle_core::{Device, Tensor};

/// A deterministic test tensor with values uniform in [lo, hi).
#[cfg(test)]
pub fn seeded(shape: &[usize], seed: u64, lo: f32, hi: f32) -> Tensor {
    let mut rng = crate::platform::rng::Rng::new(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| lo + rng.next_f64() as f32 * (hi - lo))
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

/// The largest |a - b| over two test tensors of one shape.
#[cfg(test)]
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    let d = (a - b).unwrap().abs().unwrap().max_all().unwrap();
    d.to_scalar::<f32>().unwrap()
}

/// `max_abs_diff` relative to the largest |b| (the reference).
#[cfg(test)]
pub fn max_rel(a: &Tensor, b: &Tensor) -> f32 {
    let s = b.abs().unwrap().max_all().unwrap();
    max_abs_diff(a, b) / s.to_scalar::<f32>().unwrap().max(1e-6)
}
