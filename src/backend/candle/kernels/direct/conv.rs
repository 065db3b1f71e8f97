//! The Candle op over `trainyard_conv`'s direct convolution: blocked input, (O, I, K, K) kernel, with its
//! own backward (input gradient only when something upstream needs it).

use super::layout::with_blocked;
use crate::backend::candle::kernels::cpu::{f32_slice as slice, with_f32};
use crate::backend::candle::kernels::tape;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use trainyard_conv::conv::{forward, input_grad, weight_grad, Geometry};
use trainyard_conv::Isa;

/// The Candle op: blocked `x` convolved with `w` (O, I, K, K), with its backward.
struct DirectConv {
    isa: Isa,
    stride: usize,
    padding: usize,
}

impl DirectConv {
    fn geometry(&self, x: &Shape, w: &Shape) -> Result<Geometry> {
        let (n, ib, h, wd, lanes) = x.dims5()?;
        let (c_out, c_in, k, k2) = w.dims4()?;
        if lanes != self.isa.lanes() || c_in.div_ceil(lanes) != ib || k != k2 {
            candle_core::bail!(
                "direct conv: input {x:?} (blocks of {}) does not fit kernel {w:?}",
                self.isa.lanes()
            );
        }
        if h + 2 * self.padding < k || wd + 2 * self.padding < k {
            candle_core::bail!(
                "direct conv: a {h}x{wd} input (padding {}) is smaller than the {k}x{k} kernel",
                self.padding
            );
        }
        Ok(Geometry {
            n,
            c_in,
            c_out,
            h,
            w: wd,
            k,
            stride: self.stride,
            padding: self.padding,
            lanes,
        })
    }
}

impl CustomOp2 for DirectConv {
    fn name(&self) -> &'static str {
        "trainyard-direct-conv"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = self.geometry(l1.shape(), l2.shape())?;
        let y = forward(self.isa, slice(s1, l1)?, slice(s2, l2)?, &g);
        let shape = Shape::from((g.n, g.ob(), g.oh(), g.ow(), g.lanes));
        Ok((CpuStorage::F32(y), shape))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let g = self.geometry(x.shape(), w.shape())?;
        let dev = x.device();
        let (dx, dw) = with_f32(grad, |dy| {
            let dx = if x.track_op() {
                let d = with_f32(w, |wd| Ok(input_grad(self.isa, dy, wd, &g)))?;
                Some(Tensor::from_vec(d, x.shape(), dev)?)
            } else {
                None
            };
            let dw = if w.track_op() {
                let d = with_blocked(x, |xd, _| Ok(weight_grad(self.isa, xd, dy, &g)))?;
                Some(Tensor::from_vec(d, w.shape(), dev)?)
            } else {
                None
            };
            Ok((dx, dw))
        })?;
        Ok((dx, dw))
    }
}

/// Blocked `x` (N, ⌈C/L⌉, H, W, L) convolved with `w` (O, C, K, K) on `isa`: blocked (N, ⌈O/L⌉, OH, OW, L).
pub fn conv2d(isa: Isa, x: &Tensor, w: &Tensor, stride: usize, padding: usize) -> Result<Tensor> {
    if !isa.supported() {
        candle_core::bail!("direct conv: this CPU has no {} path", isa.name());
    }
    tape::op2(
        &x.contiguous()?,
        &w.contiguous()?,
        DirectConv {
            isa,
            stride,
            padding,
        },
    )
}
