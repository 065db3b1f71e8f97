//! Mixed precision on libtorch, as PyTorch does it: `torch.autocast` regions (through the C++ shim, since
//! tch's own `autocast` is CUDA-float16 only) and `torch.amp.GradScaler`'s dynamic loss scaling, built on
//! the same ATen kernels GradScaler uses (`_amp_foreach_non_finite_check_and_unscale_`,
//! `_amp_update_scale_`), so the scale follows PyTorch's schedule exactly.

use crate::schema::{GradScalerConfig, Precision};
use std::os::raw::c_int;
use tch::{Device, Kind, Tensor};

extern "C" {
    fn trainyard_autocast_enter(
        device: c_int,
        dtype: c_int,
        prev_enabled: *mut c_int,
        prev_dtype: *mut c_int,
    ) -> c_int;
    fn trainyard_autocast_exit(device: c_int, prev_enabled: c_int, prev_dtype: c_int) -> c_int;
    fn trainyard_amp_unscale_foreach(
        grads: *const *mut std::ffi::c_void,
        n: i64,
        found_inf: *mut std::ffi::c_void,
        inv_scale: *const std::ffi::c_void,
    ) -> c_int;
}

/// How a precision setting maps onto libtorch: the dtype autocast runs eligible ops in (mixed), or the
/// dtype parameters and activations are stored in (true).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Full,
    Autocast(Kind),
    True(Kind),
}

impl Mode {
    pub fn of(precision: Precision) -> Mode {
        match precision {
            Precision::Full => Mode::Full,
            Precision::Mixed16 => Mode::Autocast(Kind::Half),
            Precision::MixedBf16 => Mode::Autocast(Kind::BFloat16),
            Precision::TrueBf16 => Mode::True(Kind::BFloat16),
            Precision::True16 => Mode::True(Kind::Half),
        }
    }

    /// The dtype parameters are kept in.
    pub fn storage(self) -> Kind {
        match self {
            Mode::True(kind) => kind,
            _ => Kind::Float,
        }
    }
}

/// An autocast region for one device; left when dropped (also on early return through `?`).
pub struct AutocastGuard {
    device: c_int,
    prev_enabled: c_int,
    prev_dtype: c_int,
}

/// Enter `torch.autocast(device, dtype)` when `mode` asks for it; `None` otherwise.
pub fn autocast(mode: Mode, device: Device) -> anyhow::Result<Option<AutocastGuard>> {
    let Mode::Autocast(kind) = mode else {
        return Ok(None);
    };
    let device = c_int::from(device.is_cuda());
    let dtype = c_int::from(kind == Kind::BFloat16);
    let (mut prev_enabled, mut prev_dtype) = (0, 0);
    // SAFETY: plain C ABI; the shim catches every C++ exception and reports it as a status.
    let status =
        unsafe { trainyard_autocast_enter(device, dtype, &mut prev_enabled, &mut prev_dtype) };
    anyhow::ensure!(
        status == 0,
        "libtorch refused to enter an autocast region ({kind:?} on {})",
        if device == 1 { "cuda" } else { "cpu" }
    );
    Ok(Some(AutocastGuard {
        device,
        prev_enabled,
        prev_dtype,
    }))
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        // SAFETY: as above; restores the state saved on entry.
        let status =
            unsafe { trainyard_autocast_exit(self.device, self.prev_enabled, self.prev_dtype) };
        if status != 0 {
            tracing::error!("libtorch failed to leave an autocast region");
        }
    }
}

/// `torch.amp.GradScaler`: the scale and the count of clean steps since it last changed live in tensors
/// on the training device, updated by ATen's own kernels.
pub struct GradScaler {
    config: GradScalerConfig,
    scale: Tensor,
    growth_tracker: Tensor,
    /// Steps skipped because their gradients overflowed.
    pub skipped: u64,
}

impl GradScaler {
    pub fn new(config: GradScalerConfig, device: Device) -> anyhow::Result<Self> {
        Ok(GradScaler {
            config,
            scale: Tensor::f_full([1], config.init_scale, (Kind::Float, device))?,
            growth_tracker: Tensor::f_zeros([1], (Kind::Int, device))?,
            skipped: 0,
        })
    }

    pub fn scale(&self) -> anyhow::Result<f64> {
        Ok(self.scale.f_double_value(&[0])?)
    }

    /// `loss × scale` on the device (GradScaler.scale): no read of the scale back to the host.
    pub fn scale_loss(&self, loss: &Tensor) -> anyhow::Result<Tensor> {
        Ok(loss.f_mul(&self.scale.f_view([] as [i64; 0])?)?)
    }

    /// Unscale the gradients in place (×1/scale) and report whether any of them holds inf or NaN: one
    /// multi-tensor launch for all of them, then the one read back the step needs.
    pub fn unscale(&self, grads: &mut [Tensor]) -> anyhow::Result<bool> {
        let mut found_inf = Tensor::f_zeros([1], (Kind::Float, self.scale.device()))?;
        let inv_scale = self.scale.f_reciprocal()?.f_to_kind(Kind::Float)?;
        if !grads.is_empty() {
            let handles: Vec<*mut std::ffi::c_void> =
                grads.iter_mut().map(|g| g.as_mut_ptr().cast()).collect();
            // SAFETY: live tch handles (`torch::Tensor*`): the gradients, `found_inf` and `inv_scale`;
            // the shim catches C++ exceptions.
            let status = unsafe {
                trainyard_amp_unscale_foreach(
                    handles.as_ptr(),
                    handles.len() as i64,
                    found_inf.as_mut_ptr().cast(),
                    inv_scale.as_ptr().cast(),
                )
            };
            anyhow::ensure!(status == 0, "libtorch could not unscale the gradients");
        }
        Ok(found_inf.f_double_value(&[0])? != 0.0)
    }

    /// After a step: back off on overflow, grow after `growth_interval` clean steps (`_amp_update_scale_`).
    pub fn update(&mut self, found_inf: bool) -> anyhow::Result<()> {
        let found = Tensor::f_full(
            [1],
            if found_inf { 1.0 } else { 0.0 },
            (Kind::Float, self.scale.device()),
        )?;
        // Updates `scale` and `growth_tracker` in place; the returned handle is `scale` again.
        let _ = self.scale.f_internal_amp_update_scale_(
            &self.growth_tracker,
            &found,
            self.config.growth_factor,
            self.config.backoff_factor,
            self.config.growth_interval as i64,
        )?;
        self.skipped += u64::from(found_inf);
        Ok(())
    }

    /// `(scale, growth_tracker)` for checkpoints.
    pub fn state(&self) -> anyhow::Result<(f64, f64)> {
        Ok((self.scale()?, self.growth_tracker.f_double_value(&[0])?))
    }

    pub fn restore(&mut self, scale: f64, growth_tracker: f64) -> anyhow::Result<()> {
        let device = self.scale.device();
        self.scale = Tensor::f_full([1], scale, (Kind::Float, device))?;
        self.growth_tracker = Tensor::f_full([1], growth_tracker, (Kind::Int, device))?;
        Ok(())
    }
}

/// The engine's loss scaler as sharded strategies drive it (`backend::LossScaler`).
impl crate::backend::LossScaler for GradScaler {
    fn scale(&self) -> anyhow::Result<f64> {
        GradScaler::scale(self)
    }

    fn update(&mut self, found_inf: bool) -> anyhow::Result<()> {
        GradScaler::update(self, found_inf)
    }
}
