//! A batch's trip from the loader's host memory to the engine's device. To a GPU the batch goes through
//! page-locked ("pinned") memory and is copied without waiting, as Lightning does with a DataLoader's
//! `pin_memory=True` and `.to(device, non_blocking=True)`: a copy from pageable memory blocks the host
//! until the GPU has finished the previous step's queued work, so the GPU would then idle while the host
//! queues the next forward pass. The copy into pinned memory is made by the loader's workers
//! (`PinBatches`, a `StageBatch`), off the step's path; a batch that was not staged is pinned here, in
//! the step (one copy: a fresh tensor first and then pinned cost two copies and the fresh one's page
//! faults, 4 ms a step at batch 1024 on an H200). libtorch's pinned-memory cache keeps a block until
//! the copy from it has run.

use crate::data::loader::{BackendBatch, Batch, StageBatch};
use std::sync::{Arc, Mutex};
use tch::{Device, Kind, Tensor};

/// A batch in pinned host memory: images `[n, c, h, w]` f32 and labels `[n]` i64.
struct PinnedBatch {
    // A Mutex because a tch Tensor is Send but not Sync; only the step reads it.
    tensors: Mutex<(Tensor, Tensor)>,
}

/// The loader-side staging of a GPU engine: each batch copied into pinned memory by the worker that
/// made it (page-locked host memory, which every GPU of the machine can copy from).
pub struct PinBatches;

impl StageBatch for PinBatches {
    fn stage(&self, batch: &Batch) -> anyhow::Result<BackendBatch> {
        let copy = || -> anyhow::Result<(Tensor, Tensor)> {
            let images = pinned(&batch.images, &image_shape(batch))?;
            let labels = labels_i64(batch);
            Ok((images, pinned(&labels, &[labels.len() as i64])?))
        };
        let (images, labels) = copy().map_err(|e| {
            anyhow::anyhow!(
                "copying a batch into page-locked memory (data.pin_memory=true): {e:#}; set \
                 data.pin_memory=false to copy batches from pageable memory"
            )
        })?;
        Ok(BackendBatch(Arc::new(PinnedBatch {
            tensors: Mutex::new((images, labels)),
        })))
    }
}

/// The batch's images and labels on `device`: from the loader's pinned copy when it made one for this
/// engine, otherwise copied here (through pinned memory to a GPU when `pin_memory`, as a DataParallel
/// replica's share of a batch is).
pub fn to_device(
    batch: &Batch,
    device: Device,
    pin_memory: bool,
) -> anyhow::Result<(Tensor, Tensor)> {
    let staged = batch
        .staged
        .as_ref()
        .and_then(|s| s.0.downcast_ref::<PinnedBatch>());
    if let (Some(staged), true) = (staged, device.is_cuda()) {
        let guard = staged.tensors.lock().unwrap_or_else(|e| e.into_inner());
        let (images, labels) = &*guard;
        return Ok((upload(images, device)?, upload(labels, device)?));
    }
    let labels = labels_i64(batch);
    let shape = image_shape(batch);
    if !device.is_cuda() {
        // A tensor of its own: the engine keeps its input for the backward pass.
        return Ok((
            Tensor::f_from_slice(&batch.images)?.f_reshape(shape)?,
            Tensor::f_from_slice(&labels)?,
        ));
    }
    if !pin_memory {
        return Ok((
            pageable(&batch.images, &shape, device)?,
            pageable(&labels, &[labels.len() as i64], device)?,
        ));
    }
    let images = pinned(&batch.images, &shape)?;
    let labels = pinned(&labels, &[labels.len() as i64])?;
    Ok((upload(&images, device)?, upload(&labels, device)?))
}

fn image_shape(batch: &Batch) -> [i64; 4] {
    [
        batch.len() as i64,
        batch.channels as i64,
        batch.height as i64,
        batch.width as i64,
    ]
}

fn labels_i64(batch: &Batch) -> Vec<i64> {
    batch.labels.iter().map(|&l| i64::from(l)).collect()
}

/// `data` seen as a host tensor of `shape`, without a copy, handed to `copy`, whose result must not
/// refer to it: the borrowed view is dropped before this returns.
fn from_borrowed<T: tch::kind::Element>(
    data: &[T],
    shape: &[i64],
    copy: impl FnOnce(&Tensor) -> Result<Tensor, tch::TchError>,
) -> anyhow::Result<Tensor> {
    anyhow::ensure!(
        shape.iter().product::<i64>() == data.len() as i64,
        "a host batch of {} values does not have the shape {shape:?}",
        data.len()
    );
    let strides = contiguous_strides(shape);
    // SAFETY: `data` outlives `borrowed`, which only the synchronous copy in `copy` reads and which
    // is dropped before this returns; shape and strides describe exactly `data.len()` values of T.
    let borrowed = unsafe {
        Tensor::f_from_blob(data.as_ptr().cast(), shape, &strides, T::KIND, Device::Cpu)?
    };
    let copied = copy(&borrowed)?;
    drop(borrowed);
    Ok(copied)
}

/// A pinned-memory tensor of `shape` holding `data` (one host copy, into libtorch's pinned cache).
fn pinned<T: tch::kind::Element>(data: &[T], shape: &[i64]) -> anyhow::Result<Tensor> {
    from_borrowed(data, shape, pin_memory)
}

extern "C" {
    fn trainyard_pin_memory(
        x: *const std::ffi::c_void,
        out: *mut *mut std::ffi::c_void,
    ) -> std::os::raw::c_int;
}

/// `x.pin_memory()` as PyTorch calls it, without the device argument that tch's binding always passes
/// (deprecated in PyTorch 2.11, which then warns on every call).
fn pin_memory(x: &Tensor) -> Result<Tensor, tch::TchError> {
    let mut out: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: `x` is a live tch handle; the shim writes a new `torch::Tensor*` into `out` on success
    // (owned by the Tensor made from it) and catches C++ exceptions.
    let status = unsafe { trainyard_pin_memory(x.as_ptr().cast(), &mut out) };
    if status != 0 || out.is_null() {
        return Err(tch::TchError::Torch(
            "libtorch could not pin host memory".into(),
        ));
    }
    // SAFETY: `out` is a heap-allocated `torch::Tensor` the shim made for us, i.e. a tch C_tensor.
    Ok(unsafe { Tensor::from_ptr(out.cast()) })
}

/// `data` onto the GPU straight from the loader's pageable buffer (`data.pin_memory=false`): one
/// blocking copy, which libtorch finishes before returning (so borrowing is sound). Going through a
/// fresh host tensor first (zero-filled on libtorch's threads, then copied into) made a quick-start step
/// 8-11 ms instead of 2.4-2.8 on an H200 while loader workers ran (`bench/RESULTS.md`).
fn pageable<T: tch::kind::Element>(
    data: &[T],
    shape: &[i64],
    device: Device,
) -> anyhow::Result<Tensor> {
    from_borrowed(data, shape, |t| {
        t.f_to_device_(device, T::KIND, false, true)
    })
}

/// A pinned host tensor onto the GPU, without waiting for the copy.
fn upload(t: &Tensor, device: Device) -> anyhow::Result<Tensor> {
    let kind: Kind = t.kind();
    Ok(t.f_to_device_(device, kind, true, false)?)
}

/// Row-major strides (in elements) of a contiguous tensor of `shape`.
fn contiguous_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_strides_are_row_major() {
        assert_eq!(contiguous_strides(&[4, 3, 5, 7]), vec![105, 35, 7, 1]);
        assert_eq!(contiguous_strides(&[9]), vec![1]);
        assert_eq!(contiguous_strides(&[]), Vec::<i64>::new());
    }

    #[test]
    fn a_batch_reaches_the_cpu_with_its_shape_and_labels() {
        let batch = crate::testing::batch(3);
        let (x, y) = to_device(&batch, Device::Cpu, true).unwrap();
        assert_eq!(x.size(), image_shape(&batch).to_vec());
        assert_eq!(
            Vec::<f32>::try_from(&x.flatten(0, -1)).unwrap(),
            batch.images
        );
        let labels: Vec<i64> = Vec::try_from(&y).unwrap();
        assert_eq!(labels, labels_i64(&batch));
    }
}
