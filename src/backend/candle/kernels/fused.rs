//! Small fused CPU ops with their own backward, where Candle's composition costs several full passes and
//! allocations per step: ReLU (Candle's backward builds a zeros tensor, a comparison and a product),
//! per-channel bias add (its backward is a slow strided reduction over N, H, W) and max-pooling (Candle's
//! backward only works when kernel == stride). Off the CPU or for other dtypes the Candle ops are used.

use crate::backend::candle::kernels::tape;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use trainyard_conv::bf16::pack::round_f32;
use trainyard_conv::buffer::{assume_init, uninit};

use super::cpu::{f32_slice as slice, is_cpu_f32 as fast, with_f32 as with_data};

const CHUNK: usize = 1 << 14;

pub fn relu(x: &Tensor) -> Result<Tensor> {
    if !fast(x) {
        return x.relu();
    }
    tape::op1(&x.contiguous()?, Relu)
}

struct Relu;

impl CustomOp1 for Relu {
    fn name(&self) -> &'static str {
        "trainyard-relu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = slice(s, l)?;
        let mut y = uninit(x.len());
        y.par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK))
            .for_each(|(o, i)| {
                for (o, v) in o.iter_mut().zip(i) {
                    o.write(v.max(0.0));
                }
            });
        // SAFETY: every element was written.
        Ok((
            CpuStorage::F32(unsafe { assume_init(y) }),
            l.shape().clone(),
        ))
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let out = with_data(res, |y| with_data(grad, |g| Ok(relu_grad(y, g))))?;
        Ok(Some(Tensor::from_vec(out, res.shape(), res.device())?))
    }
}

/// A ReLU's input gradient from its output `y` and output gradient `g`: `g` where `y > 0`, else 0.
pub(crate) fn relu_grad(y: &[f32], g: &[f32]) -> Vec<f32> {
    relu_grad_by::<false>(y, g)
}

/// `relu_grad`, with the passed values rounded to bf16 when `ROUND` (`add_relu_rounded`).
fn relu_grad_by<const ROUND: bool>(y: &[f32], g: &[f32]) -> Vec<f32> {
    let mut dx = uninit(y.len());
    dx.par_chunks_mut(CHUNK)
        .zip(y.par_chunks(CHUNK).zip(g.par_chunks(CHUNK)))
        .for_each(|(o, (y, g))| {
            for ((o, y), g) in o.iter_mut().zip(y).zip(g) {
                let g = if ROUND { round_f32(*g) } else { *g };
                o.write(if *y > 0.0 { g } else { 0.0 });
            }
        });
    // SAFETY: every element was written.
    unsafe { assume_init(dx) }
}

/// `relu(a + b)` for two tensors of one shape (a residual block's end) in one pass, with one gradient
/// for both inputs: the output's zeros mask it, as the separate add and ReLU would.
pub fn add_relu(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if !fast(a) || !fast(b) || a.shape() != b.shape() {
        return (a + b)?.relu();
    }
    tape::op2(&a.contiguous()?, &b.contiguous()?, AddRelu { round: false })
}

/// `add_relu` of two bf16 tensors under autocast (a residual block's BatchNorm output and its input):
/// the sum rounded to bf16 as it is stored, as PyTorch's add of two bf16 tensors returns it, and the
/// incoming gradient rounded as it is passed on (autograd sums the gradients of a tensor read twice, the
/// block's output, in its dtype: bf16). `None` off the CPU fast path (the caller rounds with its own ops).
pub fn add_relu_rounded(a: &Tensor, b: &Tensor) -> Result<Option<Tensor>> {
    if !fast(a) || !fast(b) || a.shape() != b.shape() {
        return Ok(None);
    }
    let op = AddRelu { round: true };
    tape::op2(&a.contiguous()?, &b.contiguous()?, op).map(Some)
}

/// `o = relu(a + b)`, rounded to bf16 when `ROUND`.
fn add_relu_into<const ROUND: bool>(o: &mut [std::mem::MaybeUninit<f32>], a: &[f32], b: &[f32]) {
    for ((o, a), b) in o.iter_mut().zip(a).zip(b) {
        let y = (a + b).max(0.0);
        o.write(if ROUND { round_f32(y) } else { y });
    }
}

struct AddRelu {
    /// bf16 autocast: the output and the gradient rounded (`add_relu_rounded`).
    round: bool,
}

impl CustomOp2 for AddRelu {
    fn name(&self) -> &'static str {
        "trainyard-add-relu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (a, b) = (slice(s1, l1)?, slice(s2, l2)?);
        if a.len() != b.len() {
            candle_core::bail!("add_relu: {} and {} elements", a.len(), b.len());
        }
        let mut y = uninit(a.len());
        y.par_chunks_mut(CHUNK)
            .zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK)))
            .for_each(|(o, (a, b))| {
                if self.round {
                    add_relu_into::<true>(o, a, b);
                } else {
                    add_relu_into::<false>(o, a, b);
                }
            });
        // SAFETY: every element was written.
        Ok((
            CpuStorage::F32(unsafe { assume_init(y) }),
            l1.shape().clone(),
        ))
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        if !a.track_op() && !b.track_op() {
            return Ok((None, None));
        }
        let masked = if self.round {
            let out = with_data(res, |y| with_data(grad, |g| Ok(relu_grad_by::<true>(y, g))))?;
            Some(Tensor::from_vec(out, res.shape(), res.device())?)
        } else {
            Relu.bwd(a, res, grad)?
        };
        Ok((
            masked.clone().filter(|_| a.track_op()),
            masked.filter(|_| b.track_op()),
        ))
    }
}

/// `x` (N, C, H, W) plus `bias` (C) broadcast over N, H, W.
pub fn add_channel_bias(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    if !fast(x) || x.rank() != 4 {
        let c = bias.dim(0)?;
        return x.broadcast_add(&bias.reshape((1, c, 1, 1))?);
    }
    tape::op2(&x.contiguous()?, &bias.contiguous()?, ChannelBias)
}

struct ChannelBias;

impl CustomOp2 for ChannelBias {
    fn name(&self) -> &'static str {
        "trainyard-channel-bias"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, c, h, w) = l1.shape().dims4()?;
        let (x, b) = (slice(s1, l1)?, slice(s2, l2)?);
        if b.len() != c {
            candle_core::bail!("bias has {} values for {c} channels", b.len());
        }
        let hw = h * w;
        let mut y = vec![0f32; x.len()];
        y.par_chunks_mut(hw).enumerate().for_each(|(plane, o)| {
            let v = b[plane % c];
            for (o, x) in o.iter_mut().zip(&x[plane * hw..(plane + 1) * hw]) {
                *o = x + v;
            }
        });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (n, c, h, w) = x.dims4()?;
        let hw = h * w;
        let sums = with_data(grad, |g| {
            Ok((0..c)
                .into_par_iter()
                .map(|ch| {
                    (0..n)
                        .map(|i| {
                            g[(i * c + ch) * hw..][..hw]
                                .iter()
                                .map(|v| *v as f64)
                                .sum::<f64>()
                        })
                        .sum::<f64>() as f32
                })
                .collect::<Vec<f32>>())
        })?;
        let gx = if x.track_op() {
            Some(grad.clone())
        } else {
            None
        };
        Ok((gx, Some(Tensor::from_vec(sums, c, x.device())?)))
    }
}

/// `nn.MaxPool2d(kernel, stride, padding)` (padding counts as -inf), with a backward that routes each
/// gradient to the first maximum of its window, as PyTorch does.
pub fn max_pool2d(x: &Tensor, kernel: usize, stride: usize, padding: usize) -> Result<Tensor> {
    tape::op1(
        &x.contiguous()?,
        MaxPool {
            kernel,
            stride,
            padding,
        },
    )
}

#[derive(Clone, Copy)]
struct MaxPool {
    kernel: usize,
    stride: usize,
    padding: usize,
}

impl MaxPool {
    /// 2x2 windows, stride 2, no padding: the rows-at-a-time kernels.
    fn is_2x2(&self) -> bool {
        self.kernel == 2 && self.stride == 2 && self.padding == 0
    }

    fn out(&self, size: usize) -> usize {
        (size + 2 * self.padding - self.kernel) / self.stride + 1
    }

    /// Index (within the plane) of the first maximum of output cell (oy, ox).
    fn argmax(&self, plane: &[f32], w: usize, h: usize, oy: usize, ox: usize) -> usize {
        let (mut best, mut at) = (f32::NEG_INFINITY, usize::MAX);
        for ky in 0..self.kernel {
            let iy = (oy * self.stride + ky) as isize - self.padding as isize;
            if iy < 0 || iy >= h as isize {
                continue;
            }
            for kx in 0..self.kernel {
                let ix = (ox * self.stride + kx) as isize - self.padding as isize;
                if ix < 0 || ix >= w as isize {
                    continue;
                }
                let i = iy as usize * w + ix as usize;
                let v = plane[i];
                if v > best || at == usize::MAX || v.is_nan() {
                    best = v;
                    at = i;
                    if v.is_nan() {
                        return at;
                    }
                }
            }
        }
        at
    }
}

/// All ones when `keep`, else zero.
#[inline(always)]
fn mask(keep: bool) -> u32 {
    (keep as u32).wrapping_neg()
}

/// The running maximum `m` after seeing `v`: `v` replaces it only when strictly greater, or when `v` is
/// the first NaN (PyTorch's rule: the first maximum, NaN beats everything). Bit selects rather than `if`:
/// the compiler turns an `if` into a branch, and with random data that mispredicts half the time.
#[inline(always)]
pub(crate) fn pick(m: f32, v: f32) -> f32 {
    let take = mask((v > m) | (v.is_nan() & !m.is_nan()));
    f32::from_bits((v.to_bits() & take) | (m.to_bits() & !take))
}

/// All ones when `v` is the window's maximum `m` (equal, or both NaN). The first such cell is the argmax:
/// an earlier cell equal to the maximum would have been kept by `pick`.
#[inline(always)]
pub(crate) fn is_max(v: f32, m: f32) -> u32 {
    mask((v == m) | (v.is_nan() & m.is_nan()))
}

/// 2x2 stride-2 pooling of one plane (the CNN's pool): whole rows at a time, no bounds checks per window.
fn pool_2x2_plane(x: &[f32], w: usize, out: &mut [f32], ow: usize) {
    for (o, rows) in out.chunks_exact_mut(ow).zip(x.chunks_exact(2 * w)) {
        let (r0, r1) = rows.split_at(w);
        for (((o, a), b), _) in o
            .iter_mut()
            .zip(r0.chunks_exact(2))
            .zip(r1.chunks_exact(2))
            .zip(0..ow)
        {
            *o = pick(pick(pick(a[0], a[1]), b[0]), b[1]);
        }
    }
}

/// The adjoint of `pool_2x2_plane`: each window's gradient goes to its first maximum, and every other
/// value of `dx` (the window's other cells, an odd last row or column) is written zero. Windows go eight
/// at a time through fixed-size lanes, which the compiler turns into SIMD (one window at a time is ~35
/// cycles of scalar selects).
#[allow(clippy::needless_range_loop)] // one lane index into several arrays and slices
#[inline(always)]
fn pool_2x2_plane_grad(
    x: &[f32],
    g: &[f32],
    w: usize,
    dx: &mut [std::mem::MaybeUninit<f32>],
    ow: usize,
) {
    const L: usize = 8;
    let covered = 2 * w * (x.len() / w / 2);
    for v in &mut dx[covered..] {
        v.write(0.0);
    }
    for ((g, rows), d) in g
        .chunks_exact(ow)
        .zip(x.chunks_exact(2 * w))
        .zip(dx.chunks_exact_mut(2 * w))
    {
        let (r0, r1) = rows.split_at(w);
        let (d0, d1) = d.split_at_mut(w);
        for v in d0[2 * ow..].iter_mut().chain(&mut d1[2 * ow..]) {
            v.write(0.0);
        }
        let mut start = 0;
        while start < ow {
            let n = L.min(ow - start);
            let mut cell = [[0f32; L]; 4];
            let mut gl = [0f32; L];
            for k in 0..n {
                let i = 2 * (start + k);
                cell[0][k] = r0[i];
                cell[1][k] = r0[i + 1];
                cell[2][k] = r1[i];
                cell[3][k] = r1[i + 1];
                gl[k] = g[start + k];
            }
            let mut out = [[0f32; L]; 4];
            for k in 0..L {
                let c = [cell[0][k], cell[1][k], cell[2][k], cell[3][k]];
                let m = pick(pick(pick(c[0], c[1]), c[2]), c[3]);
                let e0 = is_max(c[0], m);
                let e1 = !e0 & is_max(c[1], m);
                let e2 = !(e0 | e1) & is_max(c[2], m);
                let e3 = !(e0 | e1 | e2);
                let gb = gl[k].to_bits();
                out[0][k] = f32::from_bits(gb & e0);
                out[1][k] = f32::from_bits(gb & e1);
                out[2][k] = f32::from_bits(gb & e2);
                out[3][k] = f32::from_bits(gb & e3);
            }
            for k in 0..n {
                let i = 2 * (start + k);
                d0[i].write(out[0][k]);
                d0[i + 1].write(out[1][k]);
                d1[i].write(out[2][k]);
                d1[i + 1].write(out[3][k]);
            }
            start += n;
        }
    }
}

type PlaneGrad = unsafe fn(&[f32], &[f32], usize, &mut [std::mem::MaybeUninit<f32>], usize);

/// `pool_2x2_plane_grad` compiled for AVX2 (its eight lanes are one register).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn pool_2x2_plane_grad_avx2(
    x: &[f32],
    g: &[f32],
    w: usize,
    dx: &mut [std::mem::MaybeUninit<f32>],
    ow: usize,
) {
    pool_2x2_plane_grad(x, g, w, dx, ow)
}

/// `pool_2x2_plane_grad` without an instruction set beyond the build's.
fn pool_2x2_plane_grad_portable(
    x: &[f32],
    g: &[f32],
    w: usize,
    dx: &mut [std::mem::MaybeUninit<f32>],
    ow: usize,
) {
    pool_2x2_plane_grad(x, g, w, dx, ow)
}

/// The fastest compilation of `pool_2x2_plane_grad` this CPU runs (the same operations: the same bits).
fn pool_2x2_plane_grad_kernel() -> PlaneGrad {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        return pool_2x2_plane_grad_avx2;
    }
    pool_2x2_plane_grad_portable
}

/// `each(input plane, its output gradient, its plane of dx)` for every plane (`plane` and `out_plane`
/// values each), in parallel.
fn plane_grads<T: Send>(
    dx: &mut [T],
    x: &[f32],
    g: &[f32],
    (plane, out_plane): (usize, usize),
    each: impl Fn(&[f32], &[f32], &mut [T]) + Sync + Send,
) {
    dx.par_chunks_mut(plane)
        .zip(x.par_chunks(plane).zip(g.par_chunks(out_plane)))
        .with_min_len(planes_per_task(plane))
        .for_each(|(o, (x, g))| each(x, g, o));
}

/// Planes per rayon task: enough work per task that scheduling does not dominate small planes.
fn planes_per_task(plane_len: usize) -> usize {
    CHUNK.div_ceil(plane_len.max(1))
}

impl CustomOp1 for MaxPool {
    fn name(&self) -> &'static str {
        "trainyard-max-pool2d"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, c, h, w) = l.shape().dims4()?;
        if h + 2 * self.padding < self.kernel
            || w + 2 * self.padding < self.kernel
            || self.padding * 2 > self.kernel
        {
            candle_core::bail!(
                "max_pool2d: kernel {} / padding {} do not fit a {h}x{w} input",
                self.kernel,
                self.padding
            );
        }
        let x = slice(s, l)?;
        let (oh, ow) = (self.out(h), self.out(w));
        let mut y = vec![0f32; n * c * oh * ow];
        let per_task = planes_per_task(h * w);
        y.par_chunks_mut(oh * ow)
            .enumerate()
            .with_min_len(per_task)
            .for_each(|(p, o)| {
                let plane = &x[p * h * w..(p + 1) * h * w];
                if self.is_2x2() {
                    return pool_2x2_plane(plane, w, o, ow);
                }
                for oy in 0..oh {
                    for ox in 0..ow {
                        o[oy * ow + ox] = plane[self.argmax(plane, w, h, oy, ox)];
                    }
                }
            });
        Ok((CpuStorage::F32(y), Shape::from((n, c, oh, ow))))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let (n, c, h, w) = arg.dims4()?;
        let (oh, ow) = (self.out(h), self.out(w));
        let dx = with_data(arg, |x| {
            with_data(grad, |g| {
                let sizes = (h * w, oh * ow);
                if self.is_2x2() {
                    // Every value written (a window's, or a zero outside all), so none zeroed first.
                    let mut dx = uninit(n * c * h * w);
                    let kernel = pool_2x2_plane_grad_kernel();
                    plane_grads(&mut dx, x, g, sizes, |plane, gp, o| {
                        // SAFETY: the kernel's instruction set is this CPU's.
                        unsafe { kernel(plane, gp, w, o, ow) }
                    });
                    // SAFETY: pool_2x2_plane_grad writes every value of its plane.
                    return Ok(unsafe { assume_init(dx) });
                }
                let mut dx = vec![0f32; n * c * h * w];
                plane_grads(&mut dx, x, g, sizes, |plane, gp, o| {
                    for oy in 0..oh {
                        for ox in 0..ow {
                            o[self.argmax(plane, w, h, oy, ox)] += gp[oy * ow + ox];
                        }
                    }
                });
                Ok(dx)
            })
        })?;
        Ok(Some(Tensor::from_vec(dx, (n, c, h, w), arg.device())?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn seeded(shape: &[usize], seed: u64) -> Tensor {
        crate::backend::candle::kernels::cpu::seeded(shape, seed, -1.0, 1.0)
    }

    use crate::backend::candle::kernels::cpu::max_abs_diff as diff;

    fn grads_agree(ours: Tensor, theirs: Tensor, vars: &[&Var], probe: &Tensor) {
        assert!(diff(&ours, &theirs) < 1e-6, "forward differs");
        let g1 = (ours * probe)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let g2 = (theirs * probe)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        for v in vars {
            assert!(
                diff(g1.get(v).unwrap(), g2.get(v).unwrap()) < 1e-5,
                "gradient differs"
            );
        }
    }

    /// Under bf16 autocast the residual add returns bf16, and the gradient it passes to both inputs is
    /// bf16: bit for bit `add_relu`'s values rounded.
    #[test]
    fn add_relu_rounded_rounds_the_sum_and_the_gradient() {
        let a = Var::from_tensor(&seeded(&[2, 3, 4, 5], 21)).unwrap();
        let b = Var::from_tensor(&seeded(&[2, 3, 4, 5], 22)).unwrap();
        let probe = seeded(&[2, 3, 4, 5], 23);
        let bits = |t: &Tensor, round: bool| -> Vec<u32> {
            let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let r = |v: f32| if round { round_f32(v) } else { v };
            v.iter().map(|v| r(*v).to_bits()).collect()
        };
        let f32s = add_relu(&a, &b).unwrap();
        let bf16s = add_relu_rounded(&a, &b).unwrap().expect("the CPU op");
        assert_eq!(bits(&bf16s, false), bits(&f32s, true));
        assert_ne!(bits(&f32s, false), bits(&f32s, true), "f32 sums");
        let grads = |y: &Tensor| (y * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let (g32, g16) = (grads(&f32s), grads(&bf16s));
        for v in [&a, &b] {
            let (g32, g16) = (g32.get(v).unwrap(), g16.get(v).unwrap());
            assert_eq!(bits(g16, false), bits(g32, true));
            assert_ne!(bits(g32, false), bits(g32, true), "an f32 gradient");
        }
    }

    #[test]
    fn add_relu_matches_add_then_relu() {
        let a = Var::from_tensor(&seeded(&[2, 3, 4, 5], 21)).unwrap();
        let b = Var::from_tensor(&seeded(&[2, 3, 4, 5], 22)).unwrap();
        let probe = seeded(&[2, 3, 4, 5], 23);
        let ours = add_relu(&a, &b).unwrap();
        let theirs = (a.as_tensor() + b.as_tensor()).unwrap().relu().unwrap();
        assert_eq!(
            ours.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            theirs.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
        let g1 = (ours * &probe)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let g2 = (theirs * &probe)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        for v in [&a, &b] {
            assert_eq!(
                g1.get(v)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap(),
                g2.get(v)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            );
        }
    }

    #[test]
    fn relu_and_bias_match_candle() {
        let x = Var::from_tensor(&seeded(&[2, 3, 4, 5], 1)).unwrap();
        let b = Var::from_tensor(&seeded(&[3], 2)).unwrap();
        let probe = seeded(&[2, 3, 4, 5], 3);
        grads_agree(relu(&x).unwrap(), x.relu().unwrap(), &[&x], &probe);
        grads_agree(
            add_channel_bias(&x, &b).unwrap(),
            x.broadcast_add(&b.reshape((1, 3, 1, 1)).unwrap()).unwrap(),
            &[&x, &b],
            &probe,
        );
    }

    /// Forward as Candle's pool; gradient: each window's gradient lands on its maximum. (Candle 0.11's own
    /// max-pool backward scales it by 1/kernel², which is wrong, so it cannot be the reference.) Odd sizes
    /// drop the last row or column, as PyTorch does.
    #[rstest::rstest]
    #[case(6, 6)]
    #[case(5, 7)]
    fn max_pool_matches_candle_forward_and_routes_gradients(#[case] h: usize, #[case] w: usize) {
        let x = Var::from_tensor(&seeded(&[2, 3, h, w], 1)).unwrap();
        let (oh, ow) = (h / 2, w / 2);
        let probe = seeded(&[2, 3, oh, ow], 3);
        let y = max_pool2d(&x, 2, 2, 0).unwrap();
        assert!(diff(&y, &x.max_pool2d(2).unwrap()) < 1e-7);
        let g = (y * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let gx = g
            .get(&x)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let xv = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let pv = probe.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let mut want = vec![0f32; xv.len()];
        for p in 0..6 {
            for oy in 0..oh {
                for ox in 0..ow {
                    let cells = [(0, 0), (0, 1), (1, 0), (1, 1)]
                        .map(|(dy, dx)| p * h * w + (2 * oy + dy) * w + 2 * ox + dx);
                    let at = *cells
                        .iter()
                        .max_by(|a, b| xv[**a].total_cmp(&xv[**b]))
                        .unwrap();
                    want[at] += pv[(p * oh + oy) * ow + ox];
                }
            }
        }
        assert_eq!(gx, want);
    }

    /// A NaN in a 2x2 window is the window's maximum and takes its gradient, as in PyTorch.
    #[test]
    fn nan_wins_a_window() {
        let x = Var::from_tensor(
            &Tensor::new(&[[[[1f32, f32::NAN], [3.0, 2.0]]]], &Device::Cpu).unwrap(),
        )
        .unwrap();
        let y = max_pool2d(&x, 2, 2, 0).unwrap();
        assert!(y.flatten_all().unwrap().to_vec1::<f32>().unwrap()[0].is_nan());
        let g = y.sum_all().unwrap().backward().unwrap();
        let gx = g.get(&x).unwrap().flatten_all().unwrap().to_vec1::<f32>();
        assert_eq!(gx.unwrap(), vec![0.0, 1.0, 0.0, 0.0]);
    }

    /// 3x3 stride 2 padding 1 (ResNet's stem): each input gets the sum of the gradients of the windows
    /// where it is the first maximum.
    #[test]
    fn overlapping_windows_route_gradients_to_the_first_maximum() {
        let x = Var::from_tensor(
            &Tensor::new(
                &[[[[1f32, 5.0, 2.0], [0.0, 3.0, 4.0], [7.0, 6.0, 5.0]]]],
                &Device::Cpu,
            )
            .unwrap(),
        )
        .unwrap();
        let y = max_pool2d(&x, 3, 2, 1).unwrap();
        assert_eq!(
            y.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            vec![5.0, 5.0, 7.0, 6.0]
        );
        let g = y.sum_all().unwrap().backward().unwrap();
        let gx = g
            .get(&x)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(gx, vec![0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0]);
    }
}

#[cfg(test)]
mod timing {
    #[test]
    #[ignore]
    fn pool_grad_kernel() {
        let x = super::super::cpu::seeded(&[1024 * 1024], 1, -1.0, 1.0)
            .to_vec1::<f32>()
            .unwrap();
        let g = vec![1f32; 256 * 1024];
        let mut dx = vec![0f32; 1024 * 1024];
        let mut grad = vec![std::mem::MaybeUninit::<f32>::uninit(); 1024 * 1024];
        for _ in 0..3 {
            let t = std::time::Instant::now();
            for p in 0..1024 {
                super::pool_2x2_plane_grad(
                    std::hint::black_box(&x[p * 1024..(p + 1) * 1024]),
                    &g[p * 256..(p + 1) * 256],
                    32,
                    &mut grad[p * 1024..(p + 1) * 1024],
                    16,
                );
            }
            std::hint::black_box(&mut grad);
            let t1 = t.elapsed();
            let t = std::time::Instant::now();
            for p in 0..1024 {
                super::pool_2x2_plane(
                    &x[p * 1024..(p + 1) * 1024],
                    32,
                    &mut dx[p * 256..(p + 1) * 256],
                    16,
                );
            }
            std::hint::black_box(&mut dx);
            println!("grad {:?} fwd {:?}", t1, t.elapsed());
        }
    }
}
