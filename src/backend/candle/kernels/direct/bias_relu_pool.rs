//! `max_pool2(relu(x + bias))` over blocked activations `(N, CB, H, W, L)` as one op: the small CNN's
//! block after each convolution. As two ops the forward pass writes the ReLU's output and reads it back to
//! pool it, and the backward pass writes the pooling's gradient (mostly zeros) only to read it again with
//! the ReLU's output for the bias. Here the forward pass pools `relu(x + b)` as it computes it, and the
//! backward pass recomputes it from `x` and writes the convolution's gradient and the bias's partial sums
//! in one pass: the same values, in the same order, as the two ops (`elementwise`) give. Its per-plane
//! kernel is compiled for AVX-512 and AVX2 as well and picked at run time: the crate is built for the
//! target's baseline (SSE2), where the 16-lane selects ran four lanes at a time or one (5x slower).

use super::elementwise::{bias_lanes, input_and_bias_grads, window_max_of};
use crate::backend::candle::kernels::cpu::{f32_slice as slice, with_f32};
use crate::backend::candle::kernels::tape;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::mem::MaybeUninit;
use trainyard_conv::bf16::pack::{round_f32, round_in_place};
use trainyard_conv::buffer::{assume_init, uninit};

/// `max_pool2(relu(x + bias[channel]))` (2x2 windows, stride 2, floor mode) over a blocked `x` of at least
/// 2x2 pixels; `bias` has the real channel count (lanes past it stay 0).
pub fn bias_relu_pool2(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    tape::op2(
        &x.contiguous()?,
        &bias.contiguous()?,
        BiasReluPool2 { bf16: false },
    )
}

/// `bias_relu_pool2` under bf16 autocast, over a convolution's unrounded f32 sums
/// (`conv::conv2d_bf16_sums`): `max_pool2(relu(bf16(x + bf16(bias))))`, the bias inside autocast's one
/// rounding of a convolution with a bias, as `Autocast::conv2d_bias_relu` places it. The results are
/// bf16s; the gradients are `bias_relu_pool2`'s through the rounded activations' mask, the bias's rounded
/// to bf16 as autocast's cast of the bias passes it back.
pub fn bias_relu_pool2_bf16(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    tape::op2(
        &x.contiguous()?,
        &bias.contiguous()?,
        BiasReluPool2 { bf16: true },
    )
}

struct BiasReluPool2 {
    /// Round the bias and `x + bias` to bf16 (`bias_relu_pool2_bf16`).
    bf16: bool,
}

/// `relu(v + b)` per lane, as `elementwise::bias_relu` computes it; `relu(bf16(v + b))` under `R` (`b`
/// rounded already).
#[inline(always)]
fn activated<const L: usize, const R: bool>(v: &[f32], b: &[f32; L]) -> [f32; L] {
    std::array::from_fn(|lane| {
        let s = v[lane] + b[lane];
        if R { round_f32(s) } else { s }.max(0.0)
    })
}

/// Per lane, the maximum of `relu(x + b)` over window (oy, ox): the first maximum, as `pick` keeps it.
#[inline(always)]
fn window_max<const L: usize, const R: bool>(
    x: &[f32],
    w: usize,
    b: &[f32; L],
    at: (usize, usize),
) -> [f32; L] {
    window_max_of::<L>(x, w, at, |cell| activated::<L, R>(cell, b))
}

fn forward<const L: usize, const R: bool>(
    x: &[f32],
    lanes: &[f32],
    (cb, h, w): (usize, usize, usize),
) -> Vec<f32> {
    let (oh, ow) = (h / 2, w / 2);
    let planes = x.len() / (h * w * L);
    let mut y = uninit(planes * oh * ow * L);
    y.par_chunks_mut(oh * ow * L)
        .enumerate()
        .for_each(|(p, out)| {
            let src = &x[p * h * w * L..][..h * w * L];
            let b: &[f32; L] = lanes[(p % cb) * L..][..L].try_into().expect("L lanes");
            for oy in 0..oh {
                for ox in 0..ow {
                    let best = window_max::<L, R>(src, w, b, (oy, ox));
                    for (o, v) in out[(oy * ow + ox) * L..][..L].iter_mut().zip(best) {
                        o.write(v);
                    }
                }
            }
        });
    // SAFETY: every window of every plane was written.
    unsafe { assume_init(y) }
}

/// All ones where `c` holds.
#[inline(always)]
fn mask(c: bool) -> u32 {
    (c as u32).wrapping_neg()
}

/// One plane's backward pass (see `backward`); `windows` holds a row of windows' maxima and which lanes
/// an earlier cell already took. Branch-free per lane, so it compiles to whole-vector selects.
#[inline(always)]
fn plane_backward<const L: usize, const R: bool>(
    (src, gp, b): (&[f32], &[f32], &[f32; L]),
    (h, w): (usize, usize),
    windows: &mut [([f32; L], [u32; L])],
    out: &mut [MaybeUninit<f32>],
) -> [f32; L] {
    let (oh, ow) = (h / 2, w / 2);
    let mut acc = [0f32; L];
    for y in 0..h {
        let row = &mut out[y * w * L..][..w * L];
        let oy = y / 2;
        if oy >= oh {
            // The odd last row is in no window: zeros, which leave the sums as they are.
            for o in row.iter_mut() {
                o.write(0.0);
            }
            continue;
        }
        if y % 2 == 0 {
            for (ox, (m, taken)) in windows.iter_mut().enumerate() {
                *m = window_max::<L, R>(src, w, b, (oy, ox));
                *taken = [0; L];
            }
        }
        let (pairs, rest) = row.split_at_mut(2 * ow * L);
        let cells = &src[y * w * L..][..2 * ow * L];
        let grads = &gp[oy * ow * L..][..ow * L];
        for (ox, ((m, taken), gv)) in windows.iter_mut().zip(grads.chunks_exact(L)).enumerate() {
            for at in [2 * ox * L, (2 * ox + 1) * L] {
                let v = activated::<L, R>(&cells[at..], b);
                let o = &mut pairs[at..at + L];
                for lane in 0..L {
                    // ReLU's outputs are never NaN, so `==` is `fused::is_max` here.
                    let hit = mask(v[lane] == m[lane]) & !taken[lane];
                    taken[lane] |= hit;
                    let d = f32::from_bits(gv[lane].to_bits() & hit & mask(v[lane] > 0.0));
                    o[lane].write(d);
                    acc[lane] += d;
                }
            }
        }
        for o in rest {
            o.write(0.0);
        }
    }
    acc
}

type PlaneBackward<const L: usize> = unsafe fn(
    (&[f32], &[f32], &[f32; L]),
    (usize, usize),
    &mut [([f32; L], [u32; L])],
    &mut [MaybeUninit<f32>],
) -> [f32; L];

/// `plane_backward` compiled for AVX-512 (16 lanes: one register per pixel).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn plane_backward_avx512<const R: bool>(
    data: (&[f32], &[f32], &[f32; 16]),
    hw: (usize, usize),
    windows: &mut [([f32; 16], [u32; 16])],
    out: &mut [MaybeUninit<f32>],
) -> [f32; 16] {
    plane_backward::<16, R>(data, hw, windows, out)
}

/// `plane_backward` compiled for AVX2 (8 lanes).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn plane_backward_avx2<const R: bool>(
    data: (&[f32], &[f32], &[f32; 8]),
    hw: (usize, usize),
    windows: &mut [([f32; 8], [u32; 8])],
    out: &mut [MaybeUninit<f32>],
) -> [f32; 8] {
    plane_backward::<8, R>(data, hw, windows, out)
}

/// `plane_backward` without an instruction set beyond the build's.
fn plane_backward_portable<const L: usize, const R: bool>(
    data: (&[f32], &[f32], &[f32; L]),
    hw: (usize, usize),
    windows: &mut [([f32; L], [u32; L])],
    out: &mut [MaybeUninit<f32>],
) -> [f32; L] {
    plane_backward::<L, R>(data, hw, windows, out)
}

/// The fastest compilation of `plane_backward::<16, R>` this CPU runs.
fn kernel_16<const R: bool>() -> PlaneBackward<16> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        return plane_backward_avx512::<R>;
    }
    plane_backward_portable::<16, R>
}

/// The fastest compilation of `plane_backward::<8, R>` this CPU runs.
fn kernel_8<const R: bool>() -> PlaneBackward<8> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        return plane_backward_avx2::<R>;
    }
    plane_backward_portable::<8, R>
}

/// The gradient at the convolution's output (the pooled gradient at each window's first maximum where
/// that maximum is positive, else 0) and, per plane, its per-lane sums in pixel order: what
/// `elementwise`'s pooling and bias + ReLU backward passes give one after the other. The upper row of
/// each row of windows finds their maxima; the cells are then visited in pixel order, so the sums add
/// in the same order as the two ops'.
fn backward<const L: usize>(
    (x, lanes, g): (&[f32], &[f32], &[f32]),
    (cb, h, w): (usize, usize, usize),
    kernel: PlaneBackward<L>,
) -> (Vec<f32>, Vec<f32>) {
    let (oh, ow) = (h / 2, w / 2);
    let mut dx = uninit(x.len());
    let mut sums = vec![0f32; x.len() / (h * w)];
    dx.par_chunks_mut(h * w * L)
        .zip(sums.par_chunks_mut(L))
        .enumerate()
        .for_each_init(
            || vec![([0f32; L], [0u32; L]); ow],
            |windows, (p, (out, total))| {
                let src = &x[p * h * w * L..][..h * w * L];
                let gp = &g[p * oh * ow * L..][..oh * ow * L];
                let b: &[f32; L] = lanes[(p % cb) * L..][..L].try_into().expect("L lanes");
                // SAFETY: `kernel_16`/`kernel_8` picked a compilation this CPU supports.
                let acc = unsafe { kernel((src, gp, b), (h, w), windows, out) };
                total.copy_from_slice(&acc);
            },
        );
    // SAFETY: every pixel of every plane was written.
    (unsafe { assume_init(dx) }, sums)
}

impl BiasReluPool2 {
    /// The bias lanes as this op adds them: rounded to bf16 under autocast.
    fn lanes(&self, mut lanes: Vec<f32>) -> Vec<f32> {
        if self.bf16 {
            round_in_place(&mut lanes);
        }
        lanes
    }
}

impl CustomOp2 for BiasReluPool2 {
    fn name(&self) -> &'static str {
        "trainyard-blocked-bias-relu-pool2"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, cb, h, w, l) = l1.shape().dims5()?;
        if h < 2 || w < 2 {
            candle_core::bail!("bias_relu_pool2: a {h}x{w} plane has no 2x2 window");
        }
        let x = slice(s1, l1)?;
        let lanes = self.lanes(bias_lanes(slice(s2, l2)?, cb, l)?);
        let y = match (l, self.bf16) {
            (16, false) => forward::<16, false>(x, &lanes, (cb, h, w)),
            (16, true) => forward::<16, true>(x, &lanes, (cb, h, w)),
            (8, false) => forward::<8, false>(x, &lanes, (cb, h, w)),
            (8, true) => forward::<8, true>(x, &lanes, (cb, h, w)),
            _ => candle_core::bail!("bias_relu_pool2: blocks of {l} lanes (8 or 16 expected)"),
        };
        Ok((CpuStorage::F32(y), Shape::from((n, cb, h / 2, w / 2, l))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        bias: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (_, cb, h, w, l) = x.dims5()?;
        let c = bias.dim(0)?;
        let lanes = self.lanes(with_f32(bias, |b| bias_lanes(b, cb, l))?);
        let (dx, sums) = with_f32(x, |xs| {
            with_f32(grad, |g| {
                let data = (xs, &lanes[..], g);
                match (l, self.bf16) {
                    (16, false) => Ok(backward(data, (cb, h, w), kernel_16::<false>())),
                    (16, true) => Ok(backward(data, (cb, h, w), kernel_16::<true>())),
                    (8, false) => Ok(backward(data, (cb, h, w), kernel_8::<false>())),
                    (8, true) => Ok(backward(data, (cb, h, w), kernel_8::<true>())),
                    _ => candle_core::bail!("bias_relu_pool2: blocks of {l} lanes"),
                }
            })
        })?;
        input_and_bias_grads(x, dx, &sums, (c, self.bf16))
    }
}
