//! The small CNN's other ops over blocked activations `(N, CB, H, W, L)`, each one Candle op with its own
//! backward: `relu(x + bias)` per channel, and 2x2 max-pooling (stride 2, floor, as `nn.MaxPool2d(2)`).

use crate::backend::candle::kernels::cpu::{f32_slice as slice, with_f32};
use crate::backend::candle::kernels::fused::{is_max, pick};
use crate::backend::candle::kernels::tape;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use trainyard_conv::bf16::pack::{round_f32, round_in_place};
use trainyard_conv::buffer::{assume_init, uninit};

/// `relu(x + bias[channel])` over a blocked `x`; `bias` has the real channel count (lanes past it stay 0).
pub fn bias_relu(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    tape::op2(
        &x.contiguous()?,
        &bias.contiguous()?,
        BiasRelu { bf16: false },
    )
}

/// `bias_relu` under bf16 autocast, over a convolution's unrounded f32 sums (`conv::conv2d_bf16_sums`):
/// `relu(bf16(x + bf16(bias)))`, autocast's one rounding of a convolution with a bias.
pub fn bias_relu_bf16(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    tape::op2(
        &x.contiguous()?,
        &bias.contiguous()?,
        BiasRelu { bf16: true },
    )
}

/// 2x2 max-pooling with stride 2 over a blocked `x`.
pub fn max_pool2(x: &Tensor) -> Result<Tensor> {
    tape::op1(&x.contiguous()?, MaxPool2)
}

struct BiasRelu {
    /// Round the bias and `x + bias` to bf16 (`bias_relu_bf16`).
    bf16: bool,
}

impl CustomOp2 for BiasRelu {
    fn name(&self) -> &'static str {
        "trainyard-blocked-bias-relu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, cb, h, w, l) = l1.shape().dims5()?;
        let (x, mut lanes) = (slice(s1, l1)?, bias_lanes(slice(s2, l2)?, cb, l)?);
        let y = if self.bf16 {
            round_in_place(&mut lanes);
            bias_relu_forward::<true>(x, &lanes, (cb, h * w * l, l))
        } else {
            bias_relu_forward::<false>(x, &lanes, (cb, h * w * l, l))
        };
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        bias: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (_, _, h, w, l) = x.dims5()?;
        let (plane, c) = (h * w * l, bias.dim(0)?);
        let (dx, sums) = with_f32(res, |y| {
            with_f32(grad, |g| match l {
                16 => Ok(bias_relu_backward::<16>(y, g, plane)),
                8 => Ok(bias_relu_backward::<8>(y, g, plane)),
                _ => candle_core::bail!("bias_relu: blocks of {l} lanes (8 or 16 expected)"),
            })
        })?;
        input_and_bias_grads(x, dx, &sums, (c, self.bf16))
    }
}

/// `relu(x + b)` per lane of each plane (`plane` values of `l` lanes, `cb` blocks an image), with the sum
/// rounded to bf16 under `R` (`lanes` rounded already): the round is chosen at compile time, so the f32
/// op's loop is the one it was.
fn bias_relu_forward<const R: bool>(
    x: &[f32],
    lanes: &[f32],
    (cb, plane, l): (usize, usize, usize),
) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    y.par_chunks_mut(plane)
        .zip(x.par_chunks(plane))
        .enumerate()
        .for_each(|(p, (out, src))| {
            let b = &lanes[(p % cb) * l..][..l];
            for (o, v) in out.chunks_exact_mut(l).zip(src.chunks_exact(l)) {
                for lane in 0..l {
                    let s = v[lane] + b[lane];
                    o[lane] = if R { round_f32(s) } else { s }.max(0.0);
                }
            }
        });
    y
}

/// A blocked bias op's gradients: `dx` for `x` (when it needs one), and the bias's from the per-plane
/// sums of the gradient (`c` real channels).
/// Under bf16 autocast (`bf16`) the bias's gradient is rounded to bf16, as the backward of autocast's
/// cast of the bias returns it (the bf16 convolution's bias gradient, cast back to f32).
pub(super) fn input_and_bias_grads(
    x: &Tensor,
    dx: Vec<f32>,
    sums: &[f32],
    (c, bf16): (usize, bool),
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let (n, cb, _, _, l) = x.dims5()?;
    let mut db = bias_grad(sums, (n, cb, l), c);
    if bf16 {
        round_in_place(&mut db);
    }
    let dev = x.device();
    Ok((
        x.track_op()
            .then(|| Tensor::from_vec(dx, x.shape(), dev))
            .transpose()?,
        Some(Tensor::from_vec(db, c, dev)?),
    ))
}

/// The bias per lane of every block, zero past the real channels.
pub(super) fn bias_lanes(bias: &[f32], cb: usize, l: usize) -> Result<Vec<f32>> {
    if bias.len() > cb * l {
        candle_core::bail!("bias_relu: {} biases for {cb} blocks of {l}", bias.len());
    }
    let mut lanes = bias.to_vec();
    lanes.resize(cb * l, 0.0);
    Ok(lanes)
}

/// The bias's gradient from per-plane lane sums (`n` images of `cb` blocks of `l` lanes): each channel's
/// planes added image by image in order, in f64, the first `c` channels.
pub(super) fn bias_grad(sums: &[f32], (n, cb, l): (usize, usize, usize), c: usize) -> Vec<f32> {
    (0..c)
        .map(|k| {
            let (b, lane) = (k / l, k % l);
            (0..n).fold(0f64, |t, img| {
                t + f64::from(sums[(img * cb + b) * l + lane])
            }) as f32
        })
        .collect()
}

/// A bias + ReLU's input gradient (`g` where the output `y` is positive, else 0) and, per plane of
/// `plane` values, the per-lane sums of it in pixel order, from one pass over `y` and `g`.
fn bias_relu_backward<const L: usize>(y: &[f32], g: &[f32], plane: usize) -> (Vec<f32>, Vec<f32>) {
    let mut dx = uninit(y.len());
    let mut sums = vec![0f32; y.len() / plane * L];
    dx.par_chunks_mut(plane)
        .zip(y.par_chunks(plane).zip(g.par_chunks(plane)))
        .zip(sums.par_chunks_mut(L))
        .for_each(|((out, (y, g)), total)| {
            let mut acc = [0f32; L];
            for ((o, y), g) in out
                .chunks_exact_mut(L)
                .zip(y.chunks_exact(L))
                .zip(g.chunks_exact(L))
            {
                for lane in 0..L {
                    let d = if y[lane] > 0.0 { g[lane] } else { 0.0 };
                    o[lane].write(d);
                    acc[lane] += d;
                }
            }
            total.copy_from_slice(&acc);
        });
    // SAFETY: every plane's every value was written.
    (unsafe { assume_init(dx) }, sums)
}

struct MaxPool2;

/// (images × blocks, input height and width, lanes) of a blocked shape.
fn pool_dims(s: &Shape) -> Result<(usize, usize, usize, usize)> {
    let (n, cb, h, w, l) = s.dims5()?;
    if h < 2 || w < 2 {
        candle_core::bail!("max_pool2: a {h}x{w} plane has no 2x2 window");
    }
    Ok((n * cb, h, w, l))
}

/// Per lane, the maximum of window (oy, ox): the first maximum, a NaN winning (PyTorch's rule, `fused`'s).
#[inline(always)]
fn window_max<const L: usize>(x: &[f32], w: usize, at: (usize, usize)) -> [f32; L] {
    window_max_of::<L>(x, w, at, |cell| cell[..L].try_into().expect("L lanes"))
}

/// `window_max` of `value(cell)` for each of the window's cells (`value` sees the cell's L lanes onward).
#[inline(always)]
pub(super) fn window_max_of<const L: usize>(
    x: &[f32],
    w: usize,
    (oy, ox): (usize, usize),
    value: impl Fn(&[f32]) -> [f32; L],
) -> [f32; L] {
    let at = |dy: usize, dx: usize| value(&x[((2 * oy + dy) * w + 2 * ox + dx) * L..]);
    let mut best = at(0, 0);
    for (dy, dx) in [(0, 1), (1, 0), (1, 1)] {
        let v = at(dy, dx);
        for lane in 0..L {
            best[lane] = pick(best[lane], v[lane]);
        }
    }
    best
}

fn pool_forward<const L: usize>(x: &[f32], (planes, h, w): (usize, usize, usize)) -> Vec<f32> {
    let (oh, ow) = (h / 2, w / 2);
    let mut y = vec![0f32; planes * oh * ow * L];
    y.par_chunks_mut(oh * ow * L)
        .enumerate()
        .for_each(|(p, out)| {
            let src = &x[p * h * w * L..][..h * w * L];
            for oy in 0..oh {
                for ox in 0..ow {
                    let best = window_max::<L>(src, w, (oy, ox));
                    out[(oy * ow + ox) * L..][..L].copy_from_slice(&best);
                }
            }
        });
    y
}

/// The gradient of the pooling: each window's output gradient goes to its first maximum (`fused`'s
/// rule, PyTorch's), the other three cells get zero. Lane-wise selects on whole `L`-lane vectors, no
/// per-lane branches: with ReLU's ties (many zeros) and random data a branch mispredicts half the time.
fn pool_backward<const L: usize>(x: &[f32], g: &[f32], (h, w): (usize, usize)) -> Vec<f32> {
    let (oh, ow) = (h / 2, w / 2);
    let mut dx = uninit(x.len());
    dx.par_chunks_mut(h * w * L)
        .enumerate()
        .for_each(|(p, out)| {
            let src = &x[p * h * w * L..][..h * w * L];
            let gp = &g[p * oh * ow * L..][..oh * ow * L];
            // Floor mode: an odd last row or column is in no window.
            for y in 0..h {
                let row = &mut out[y * w * L..][..w * L];
                let uncovered = if y >= 2 * oh { 0 } else { 2 * ow * L };
                for v in &mut row[uncovered..] {
                    v.write(0.0);
                }
            }
            for oy in 0..oh {
                for ox in 0..ow {
                    let at = |dy: usize, dx: usize| ((2 * oy + dy) * w + 2 * ox + dx) * L;
                    let cells = [at(0, 0), at(0, 1), at(1, 0), at(1, 1)];
                    let v: [&[f32; L]; 4] =
                        cells.map(|i| src[i..i + L].try_into().expect("L lanes"));
                    let gv: &[f32; L] = gp[(oy * ow + ox) * L..][..L].try_into().expect("L lanes");
                    let m = window_max::<L>(src, w, (oy, ox));
                    let mut taken = [0u32; L];
                    for (cell, &i) in v.iter().zip(&cells) {
                        let o = &mut out[i..i + L];
                        for lane in 0..L {
                            let hit = is_max(cell[lane], m[lane]) & !taken[lane];
                            taken[lane] |= hit;
                            o[lane].write(f32::from_bits(gv[lane].to_bits() & hit));
                        }
                    }
                }
            }
        });
    // SAFETY: every cell was written: those of a window above, the rest as zeros.
    unsafe { assume_init(dx) }
}

impl CustomOp1 for MaxPool2 {
    fn name(&self) -> &'static str {
        "trainyard-blocked-max-pool2"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (planes, h, w, lanes) = pool_dims(l.shape())?;
        let x = slice(s, l)?;
        let y = match lanes {
            16 => pool_forward::<16>(x, (planes, h, w)),
            8 => pool_forward::<8>(x, (planes, h, w)),
            _ => candle_core::bail!("max_pool2: blocks of {lanes} lanes (8 or 16 expected)"),
        };
        let (n, cb, ..) = l.shape().dims5()?;
        Ok((
            CpuStorage::F32(y),
            Shape::from((n, cb, h / 2, w / 2, lanes)),
        ))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let (_, h, w, lanes) = pool_dims(arg.shape())?;
        let dx = with_f32(arg, |x| {
            with_f32(grad, |g| match lanes {
                16 => Ok(pool_backward::<16>(x, g, (h, w))),
                8 => Ok(pool_backward::<8>(x, g, (h, w))),
                _ => candle_core::bail!("max_pool2: blocks of {lanes} lanes"),
            })
        })?;
        Ok(Some(Tensor::from_vec(dx, arg.shape(), arg.device())?))
    }
}
