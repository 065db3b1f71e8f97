//! The libtorch building blocks the zoo's forward passes (`models`) and declared networks (`declared`)
//! share: named parameters, dropout (drawn on the device on a GPU), BatchNorm with PyTorch's statistics
//! (and SyncBatchNorm), in-place ReLU and residual adds.

use crate::comm::c10d::ProcessGroup;
use crate::model::dropout::dropout_mask;
use crate::platform::rng::Rng;
use std::collections::BTreeMap;
use tch::Tensor;

pub(super) type Named = BTreeMap<String, Tensor>;
pub(super) fn get<'a>(p: &'a Named, name: &str) -> anyhow::Result<&'a Tensor> {
    p.get(name)
        .ok_or_else(|| anyhow::anyhow!("missing parameter {name}"))
}

/// Dropout with the mask drawn on `x`'s device by libtorch, from `seed` (the same seed, the same mask).
fn on_device_dropout(x: &Tensor, prob: f64, seed: u64) -> anyhow::Result<Tensor> {
    let mut out: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: `x` is a live tch handle; the shim writes a new `torch::Tensor*` into `out` on success
    // (owned by the Tensor made from it) and catches C++ exceptions.
    let status = unsafe { trainyard_dropout(x.as_ptr().cast(), prob, seed, &mut out) };
    anyhow::ensure!(
        status == 0 && !out.is_null(),
        "libtorch's dropout failed on {:?}",
        x.device()
    );
    // SAFETY: `out` is a heap-allocated `torch::Tensor` the shim made for us, i.e. a tch C_tensor.
    Ok(unsafe { Tensor::from_ptr(out.cast()) })
}

extern "C" {
    fn trainyard_dropout(
        x: *const std::ffi::c_void,
        p: f64,
        seed: u64,
        out: *mut *mut std::ffi::c_void,
    ) -> std::os::raw::c_int;
}

pub(super) fn drop(x: &Tensor, prob: f64, train: bool, rng: &mut Rng) -> anyhow::Result<Tensor> {
    if !train || prob <= 0.0 {
        return Ok(x.shallow_clone());
    }
    if x.device().is_cuda() {
        // A host mask would be drawn element by element and copied over on every step (20 MB a layer
        // for ViT-B at batch 128); the GPU draws it itself, seeded from the same keyed stream, so a
        // run is still reproducible (though not bit-equal to the CPU's masks).
        return on_device_dropout(x, prob, rng.next_u64());
    }
    let mask = dropout_mask(x.numel(), prob, rng);
    let mask = Tensor::f_from_slice(&mask)?
        .f_reshape(x.size())?
        .f_to_kind(x.kind())?
        .f_to(x.device())?;
    Ok(x.f_mul(&mask)?)
}

/// How a pass runs BatchNorm.
#[derive(Clone, Copy)]
pub(super) enum Norm<'a> {
    Eval,
    /// Batch statistics; with SyncBatchNorm, reduced over this group.
    Train(Option<&'a ProcessGroup>),
}

/// `batch_norm` with a layer's own `(eps, momentum)`.
pub(super) fn batch_norm_with(
    p: &Named,
    b: &mut Named,
    (name, x): (&str, &Tensor),
    norm: Norm,
    (eps, momentum): (f64, f64),
) -> anyhow::Result<Tensor> {
    let key = |s: &str| format!("{name}.{s}");
    let train = matches!(norm, Norm::Train(_));
    if let Norm::Train(Some(pg)) = norm {
        let y = pg.sync_batch_norm(
            x,
            get(p, &key("weight"))?,
            get(p, &key("bias"))?,
            get(b, &key("running_mean"))?,
            get(b, &key("running_var"))?,
            momentum,
            eps,
        )?;
        let tracked = key("num_batches_tracked");
        let count = get(b, &tracked)?.f_add_scalar(1.0)?;
        b.insert(tracked, count);
        return Ok(y);
    }
    let y = x.f_batch_norm(
        Some(get(p, &key("weight"))?),
        Some(get(p, &key("bias"))?),
        Some(get(b, &key("running_mean"))?),
        Some(get(b, &key("running_var"))?),
        train,
        momentum,
        eps,
        false,
    )?;
    if train {
        let tracked = key("num_batches_tracked");
        let count = get(b, &tracked)?.f_add_scalar(1.0)?;
        b.insert(tracked, count);
    }
    Ok(y)
}

/// ReLU in place, as torchvision's `nn.ReLU(inplace=True)`: on a fresh activation (a BatchNorm output,
/// whose backward does not read it) the same values and gradients without allocating another activation.
pub(super) fn relu_(mut x: Tensor) -> anyhow::Result<Tensor> {
    let _ = x.f_relu_()?;
    Ok(x)
}

/// `out += identity` (torchvision's BasicBlock/Bottleneck) when no type promotion is involved (mixed
/// precision may meet two dtypes: then out of place, promoting as before).
pub(super) fn add_(mut out: Tensor, identity: &Tensor) -> anyhow::Result<Tensor> {
    if out.kind() == identity.kind() {
        let _ = out.f_add_(identity)?;
        Ok(out)
    } else {
        Ok(out.f_add(identity)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(t: &Tensor) -> Vec<f32> {
        Vec::<f32>::try_from(&t.f_flatten(0, -1).unwrap()).unwrap()
    }

    /// The on-device path (run here on the CPU, where the shim works the same): the same seed gives the
    /// same mask, another seed another; each element is dropped or scaled by 1/(1-p); about p are dropped.
    #[test]
    fn on_device_dropout_is_seeded_and_scaled() {
        let x = Tensor::f_full([64, 100], 2.0, (tch::Kind::Float, tch::Device::Cpu)).unwrap();
        let a = values(&on_device_dropout(&x, 0.25, 11).unwrap());
        let b = values(&on_device_dropout(&x, 0.25, 11).unwrap());
        let c = values(&on_device_dropout(&x, 0.25, 12).unwrap());
        assert_eq!(a, b);
        assert_ne!(a, c);
        let kept = (2.0f32 * (1.0 / 0.75f64) as f32).to_bits();
        assert!(a.iter().all(|v| *v == 0.0 || v.to_bits() == kept), "{a:?}");
        let dropped = a.iter().filter(|v| **v == 0.0).count() as f64 / a.len() as f64;
        assert!((dropped - 0.25).abs() < 0.03, "dropped {dropped}");
    }
}
