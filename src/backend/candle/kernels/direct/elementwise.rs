//! The small CNN's other ops over blocked activations `(N, CB, H, W, L)`, each one Candle op with its own
//! backward: `relu(x + bias)` per channel, and 2x2 max-pooling (stride 2, floor, as `nn.MaxPool2d(2)`).

use crate::backend::candle::kernels::cpu::{f32_slice as slice, with_f32};
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// `relu(x + bias[channel])` over a blocked `x`; `bias` has the real channel count (lanes past it stay 0).
pub fn bias_relu(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op2(&bias.contiguous()?, BiasRelu)
}

/// 2x2 max-pooling with stride 2 over a blocked `x`.
pub fn max_pool2(x: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op1(MaxPool2)
}

struct BiasRelu;

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
        let (x, bias) = (slice(s1, l1)?, slice(s2, l2)?);
        if bias.len() > cb * l {
            candle_core::bail!("bias_relu: {} biases for {cb} blocks of {l}", bias.len());
        }
        let mut lanes = bias.to_vec();
        lanes.resize(cb * l, 0.0);
        let plane = h * w * l;
        let mut y = vec![0f32; x.len()];
        y.par_chunks_mut(plane)
            .zip(x.par_chunks(plane))
            .enumerate()
            .for_each(|(p, (out, src))| {
                let b = &lanes[(p % cb) * l..][..l];
                for (o, v) in out.chunks_exact_mut(l).zip(src.chunks_exact(l)) {
                    for lane in 0..l {
                        o[lane] = (v[lane] + b[lane]).max(0.0);
                    }
                }
            });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        bias: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (n, cb, h, w, l) = x.dims5()?;
        let (plane, c) = (h * w * l, bias.dim(0)?);
        let (dx, db) = with_f32(res, |y| {
            with_f32(grad, |g| {
                // The masked gradient is the input's; its per-channel sums (image by image, in order)
                // the bias's.
                let dx = crate::backend::candle::kernels::fused::relu_grad(y, g);
                let sums: Vec<Vec<f64>> = (0..cb)
                    .into_par_iter()
                    .map(|b| {
                        let mut total = vec![0f64; l];
                        for img in 0..n {
                            let mut acc = vec![0f32; l];
                            for px in dx[(img * cb + b) * plane..][..plane].chunks_exact(l) {
                                for (a, v) in acc.iter_mut().zip(px) {
                                    *a += v;
                                }
                            }
                            for (t, a) in total.iter_mut().zip(acc) {
                                *t += f64::from(a);
                            }
                        }
                        total
                    })
                    .collect();
                let db: Vec<f32> = sums.concat().iter().take(c).map(|&v| v as f32).collect();
                Ok((dx, db))
            })
        })?;
        let dev = x.device();
        Ok((
            x.track_op()
                .then(|| Tensor::from_vec(dx, x.shape(), dev))
                .transpose()?,
            Some(Tensor::from_vec(db, c, dev)?),
        ))
    }
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

/// Per lane, the input pixel (0..4, row-major in the window) of the first maximum of window (oy, ox) and
/// its value, as PyTorch picks it (a NaN wins).
#[inline(always)]
fn window_max<const L: usize>(
    x: &[f32],
    w: usize,
    (oy, ox): (usize, usize),
) -> ([f32; L], [u8; L]) {
    let at = |dy: usize, dx: usize| -> &[f32] { &x[((2 * oy + dy) * w + 2 * ox + dx) * L..][..L] };
    let mut best: [f32; L] = at(0, 0).try_into().expect("L lanes");
    let mut arg = [0u8; L];
    for (k, (dy, dx)) in [(0, 1), (1, 0), (1, 1)].into_iter().enumerate() {
        let v = at(dy, dx);
        for lane in 0..L {
            if v[lane] > best[lane] || v[lane].is_nan() {
                best[lane] = v[lane];
                arg[lane] = k as u8 + 1;
            }
        }
    }
    (best, arg)
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
                    let (best, _) = window_max::<L>(src, w, (oy, ox));
                    out[(oy * ow + ox) * L..][..L].copy_from_slice(&best);
                }
            }
        });
    y
}

fn pool_backward<const L: usize>(x: &[f32], g: &[f32], (h, w): (usize, usize)) -> Vec<f32> {
    let (oh, ow) = (h / 2, w / 2);
    let mut dx = vec![0f32; x.len()];
    dx.par_chunks_mut(h * w * L)
        .enumerate()
        .for_each(|(p, out)| {
            let src = &x[p * h * w * L..][..h * w * L];
            let gp = &g[p * oh * ow * L..][..oh * ow * L];
            for oy in 0..oh {
                for ox in 0..ow {
                    let (_, arg) = window_max::<L>(src, w, (oy, ox));
                    let gv = &gp[(oy * ow + ox) * L..][..L];
                    for k in 0..4u8 {
                        let (dy, dxx) = ((k / 2) as usize, (k % 2) as usize);
                        let o = &mut out[((2 * oy + dy) * w + 2 * ox + dxx) * L..][..L];
                        for lane in 0..L {
                            if arg[lane] == k {
                                o[lane] = gv[lane];
                            }
                        }
                    }
                }
            }
        });
    dx
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
