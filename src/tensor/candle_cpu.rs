//! A CPU f32 Candle tensor's values read in place: shared by the Candle backend's kernels and the
//! optimizer rules' one-pass SGD, which sits below the backends.

use candle_core::{CpuStorage, DType, Device, Layout, Result, Storage, Tensor};

/// A CPU f32 tensor: the kernels' domain.
pub fn is_cpu_f32(t: &Tensor) -> bool {
    matches!(t.device(), Device::Cpu) && t.dtype() == DType::F32
}

/// The f32 values of a contiguous storage, as a custom op's `cpu_fwd` receives it.
pub fn f32_slice<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    let data = s.as_slice::<f32>()?;
    match l.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => candle_core::bail!("expected a contiguous tensor"),
    }
}

/// Run `f` on a CPU tensor's f32 values without copying them out (made contiguous first if needed).
pub fn with_f32<T>(t: &Tensor, f: impl FnOnce(&[f32]) -> Result<T>) -> Result<T> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(s) => f(f32_slice(s, layout)?),
        _ => candle_core::bail!("expected a CPU tensor"),
    }
}
