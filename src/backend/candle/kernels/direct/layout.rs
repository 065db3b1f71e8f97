//! NCHW ↔ channel-blocked `(N, ⌈C/L⌉, H, W, L)` as Candle ops with their own backward (each one's gradient
//! is the other conversion). Channels past C in the last block are zeros, and stay zeros through the
//! blocked ops, so a model only converts at its edges.

use crate::backend::candle::kernels::cpu::{f32_slice as slice, with_f32};
use crate::backend::candle::kernels::tape;
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
use trainyard_conv::layout::{block, unblock};

/// `x` (N, C, H, W) in blocks of `lanes` channels.
pub fn to_blocked(x: &Tensor, lanes: usize) -> Result<Tensor> {
    let c = x.dim(1)?;
    tape::op1(&x.contiguous()?, ToBlocked { lanes, c })
}

/// A blocked `x` back to (N, `channels`, H, W).
pub fn from_blocked(x: &Tensor, channels: usize) -> Result<Tensor> {
    tape::op1(&x.contiguous()?, FromBlocked { c: channels })
}

struct ToBlocked {
    lanes: usize,
    c: usize,
}

impl CustomOp1 for ToBlocked {
    fn name(&self) -> &'static str {
        "trainyard-to-blocked"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, c, h, w) = l.shape().dims4()?;
        let out = block(slice(s, l)?, (n, c, h * w), self.lanes);
        let shape = Shape::from((n, c.div_ceil(self.lanes), h, w, self.lanes));
        Ok((CpuStorage::F32(out), shape))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        from_blocked(grad, self.c).map(Some)
    }
}

struct FromBlocked {
    c: usize,
}

impl CustomOp1 for FromBlocked {
    fn name(&self) -> &'static str {
        "trainyard-from-blocked"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, cb, h, w, lanes) = l.shape().dims5()?;
        if self.c > cb * lanes {
            candle_core::bail!(
                "from_blocked: {} channels in {cb} blocks of {lanes}",
                self.c
            );
        }
        let out = unblock(slice(s, l)?, (n, self.c, h * w), lanes);
        Ok((CpuStorage::F32(out), Shape::from((n, self.c, h, w))))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let lanes = arg.dim(4)?;
        to_blocked(grad, lanes).map(Some)
    }
}

/// Runs `f` on a blocked tensor's data and dims.
pub(super) fn with_blocked<T>(
    t: &Tensor,
    f: impl FnOnce(&[f32], (usize, usize, usize, usize, usize)) -> Result<T>,
) -> Result<T> {
    let dims = t.dims5()?;
    with_f32(t, |d| f(d, dims))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn blocking_round_trips_with_zero_lanes_past_the_channels() {
        let x = crate::backend::candle::kernels::cpu::seeded(&[2, 5, 3, 2], 1, -1.0, 1.0);
        let b = to_blocked(&x, 4).unwrap();
        assert_eq!(b.dims(), &[2, 2, 3, 2, 4]);
        // channel 1 of image 1 at pixel (2, 1) is block 0 lane 1
        let want = x
            .get(1)
            .unwrap()
            .get(1)
            .unwrap()
            .get(2)
            .unwrap()
            .get(1)
            .unwrap();
        let got = b
            .get(1)
            .unwrap()
            .get(0)
            .unwrap()
            .get(2)
            .unwrap()
            .get(1)
            .unwrap()
            .get(1)
            .unwrap();
        assert_eq!(
            want.to_scalar::<f32>().unwrap(),
            got.to_scalar::<f32>().unwrap()
        );
        let pad_lanes = b.narrow(1, 1, 1).unwrap().narrow(4, 1, 3).unwrap();
        assert_eq!(
            pad_lanes
                .abs()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap(),
            0.0
        );
        let back = from_blocked(&b, 5).unwrap();
        assert_eq!(
            back.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            x.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
    }

    #[test]
    fn gradients_pass_through_both_conversions() {
        let x = Var::from_tensor(&crate::backend::candle::kernels::cpu::seeded(
            &[1, 3, 2, 2],
            2,
            -1.0,
            1.0,
        ))
        .unwrap();
        let probe = crate::backend::candle::kernels::cpu::seeded(&[1, 3, 2, 2], 3, -1.0, 1.0);
        let y = from_blocked(&to_blocked(&x, 8).unwrap(), 3).unwrap();
        let grads = (y * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let g = grads.get(&x).unwrap();
        assert_eq!(
            g.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            probe.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
        let _ = Device::Cpu;
    }
}
