//! BatchNorm2d (+ReLU) over blocked activations `(N, CB, H, W, L)`, one Candle op with its own backward, so
//! a ResNet keeps the blocked layout from its stem to its head. The statistics, the running averages and
//! SyncBatchNorm's reductions are those of `candle::batchnorm` (same `ChannelStats`, same formulas); only
//! the indexing differs: a channel is a lane of every pixel of its block, so the sums run over pixels with
//! one accumulator per lane (vectorised over the block), image by image in a fixed order.

use crate::backend::candle::kernels::batchnorm::{global_grad_sums, ChannelStats, Then};
use crate::backend::candle::kernels::cpu::{f32_slice as slice, with_f32};
use crate::backend::candle::kernels::tape;
use crate::comm::collective::{Collective, ReduceOp};
use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::sync::Arc;
use trainyard_conv::bf16::pack::round_f32;
use trainyard_conv::buffer::{assume_init, uninit};

/// `input_grad`'s arguments: (x, dy), (blocks, pixels per plane), per-channel coefficients, the ReLU's
/// per-lane scale and shift.
type GradArgs<'a> = (
    (&'a [f32], &'a [f32]),
    (usize, usize),
    &'a [[f32; 3]],
    Option<(&'a [f32], &'a [f32])>,
);

/// (images, channel blocks, pixels per plane, lanes).
type Dims = (usize, usize, usize, usize);

fn dims(t: &Tensor) -> Result<Dims> {
    let (n, cb, h, w, l) = t.dims5()?;
    Ok((n, cb, h * w, l))
}

/// Σ over images and pixels of `f(value, lane)` per lane of block `b` (f32 per image, f64 across images).
fn lane_sums<const L: usize>(
    data: &[f32],
    (n, cb, hw, _): Dims,
    b: usize,
    f: impl Fn(f32, usize) -> f32,
) -> [f64; L] {
    let mut total = [0f64; L];
    for img in 0..n {
        let plane = &data[(img * cb + b) * hw * L..][..hw * L];
        let mut acc = [0f32; L];
        for px in plane.chunks_exact(L) {
            for (lane, (a, v)) in acc.iter_mut().zip(px).enumerate() {
                *a += f(*v, lane);
            }
        }
        for (t, a) in total.iter_mut().zip(acc) {
            *t += f64::from(a);
        }
    }
    total
}

/// Per-channel sums (length CB·L) of `f(value, channel)`.
fn channel_sums(data: &[f32], d: Dims, f: impl Fn(f32, usize) -> f32 + Sync) -> Result<Vec<f64>> {
    let per_block = |b: usize| -> Result<Vec<f64>> {
        Ok(match d.3 {
            16 => lane_sums::<16>(data, d, b, |v, lane| f(v, b * 16 + lane)).to_vec(),
            8 => lane_sums::<8>(data, d, b, |v, lane| f(v, b * 8 + lane)).to_vec(),
            l => candle_core::bail!("blocked batch norm: blocks of {l} lanes (8 or 16 expected)"),
        })
    };
    let blocks: Result<Vec<Vec<f64>>> = (0..d.1).into_par_iter().map(per_block).collect();
    Ok(blocks?.concat())
}

/// Batch statistics of the first `c` channels; with `sync`, over every rank's batch (SyncBatchNorm).
fn stats(data: &[f32], d: Dims, c: usize, sync: Option<&dyn Collective>) -> Result<ChannelStats> {
    if sync.is_none() {
        return local_stats(data, d, c);
    }
    let reduce = |v: &mut [f64]| match sync {
        Some(group) => group
            .all_reduce_f64(v, ReduceOp::Sum)
            .map_err(|e| candle_core::Error::Msg(format!("SyncBatchNorm: {e:#}"))),
        None => Ok(()),
    };
    let mut sums = channel_sums(data, d, |v, _| v)?;
    sums.truncate(c);
    sums.push((d.0 * d.2) as f64);
    reduce(&mut sums)?;
    let count = sums[c];
    let mut mean: Vec<f32> = sums[..c].iter().map(|s| (s / count) as f32).collect();
    mean.resize(d.1 * d.3, 0.0);
    let mut squares = channel_sums(data, d, |v, ch| (v - mean[ch]) * (v - mean[ch]))?;
    squares.truncate(c);
    reduce(&mut squares)?;
    mean.truncate(c);
    Ok(ChannelStats {
        mean,
        var: squares.iter().map(|s| (s / count) as f32).collect(),
        count: count as usize,
    })
}

/// One rank's batch statistics in one pass over memory: each (image, block) plane's mean and squared
/// deviations (the second pass over a plane reads it from cache), merged across images in f64 as Chan et
/// al. merge partial variances.
fn local_stats(data: &[f32], (n, cb, hw, l): Dims, c: usize) -> Result<ChannelStats> {
    let per_block = |b: usize| -> Result<(Vec<f64>, Vec<f64>)> {
        Ok(match l {
            16 => plane_moments::<16>(data, (n, cb, hw, l), b),
            8 => plane_moments::<8>(data, (n, cb, hw, l), b),
            l => candle_core::bail!("blocked batch norm: blocks of {l} lanes (8 or 16 expected)"),
        })
    };
    let blocks: Result<Vec<(Vec<f64>, Vec<f64>)>> =
        (0..cb).into_par_iter().map(per_block).collect();
    let (means, squares): (Vec<Vec<f64>>, Vec<Vec<f64>>) = blocks?.into_iter().unzip();
    let count = n * hw;
    Ok(ChannelStats {
        mean: means.concat()[..c].iter().map(|m| *m as f32).collect(),
        var: squares.concat()[..c]
            .iter()
            .map(|s| (s / count as f64) as f32)
            .collect(),
        count,
    })
}

/// Per lane of block `b`: the mean over images and pixels, and the sum of squared deviations from it.
fn plane_moments<const L: usize>(
    data: &[f32],
    (n, cb, hw, _): Dims,
    b: usize,
) -> (Vec<f64>, Vec<f64>) {
    let (mut mean, mut m2, mut count) = ([0f64; L], [0f64; L], 0f64);
    for img in 0..n {
        let plane = &data[(img * cb + b) * hw * L..][..hw * L];
        let mut sum = [0f32; L];
        for px in plane.chunks_exact(L) {
            for (a, v) in sum.iter_mut().zip(px) {
                *a += v;
            }
        }
        let mu: [f32; L] = std::array::from_fn(|lane| sum[lane] / hw as f32);
        let mut sq = [0f32; L];
        for px in plane.chunks_exact(L) {
            for lane in 0..L {
                let dev = px[lane] - mu[lane];
                sq[lane] += dev * dev;
            }
        }
        let merged = count + hw as f64;
        for lane in 0..L {
            let delta = f64::from(mu[lane]) - mean[lane];
            mean[lane] += delta * hw as f64 / merged;
            m2[lane] += f64::from(sq[lane]) + delta * delta * count * hw as f64 / merged;
        }
        count = merged;
    }
    (mean.to_vec(), m2.to_vec())
}

/// Training-mode BatchNorm over a blocked batch: the output and the batch statistics (for the running
/// averages), with the gradient through the statistics in the backward pass. With `round` (bf16
/// autocast, the input a bf16 convolution's output) the output and the input gradient are rounded to
/// bf16 as they are stored, as PyTorch's BatchNorm of a bf16 tensor returns both in bf16 (its arithmetic
/// in f32).
pub fn train(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f64,
    (then, round): (Then, bool),
    sync: Option<&Arc<dyn Collective>>,
) -> Result<(Tensor, ChannelStats)> {
    let x = x.contiguous()?;
    let c = gamma.dim(0)?;
    let d = dims(&x)?;
    let st = with_f32(&x, |data| stats(data, d, c, sync.map(|g| g.as_ref())))?;
    let op = BlockedBatchNorm {
        mean: padded(&st.mean, d),
        invstd: padded(&invstd(&st.var, eps), d),
        batch_stats: true,
        sync: sync.map(|group| (group.clone(), st.count)),
        relu: then == Then::Relu,
        round,
    };
    Ok((tape::op3(&x, gamma, beta, op)?, st))
}

/// Eval-mode BatchNorm with the running statistics (`round` as in `train`).
pub fn eval(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    (mean, var): (&Tensor, &Tensor),
    eps: f64,
    (then, round): (Then, bool),
) -> Result<Tensor> {
    let x = x.contiguous()?;
    let d = dims(&x)?;
    let var = var.flatten_all()?.to_vec1::<f32>()?;
    let op = BlockedBatchNorm {
        mean: padded(&mean.flatten_all()?.to_vec1::<f32>()?, d),
        invstd: padded(&invstd(&var, eps), d),
        batch_stats: false,
        sync: None,
        relu: then == Then::Relu,
        round,
    };
    tape::op3(&x, gamma, beta, op)
}

fn invstd(var: &[f32], eps: f64) -> Vec<f32> {
    var.iter()
        .map(|v| 1.0 / (f64::from(*v) + eps).sqrt() as f32)
        .collect()
}

/// Per-channel values extended with zeros to every lane of every block.
fn padded(v: &[f32], d: Dims) -> Vec<f32> {
    let mut out = v.to_vec();
    out.resize(d.1 * d.3, 0.0);
    out
}

struct BlockedBatchNorm {
    /// Per lane of every block (zeros past the real channels).
    mean: Vec<f32>,
    invstd: Vec<f32>,
    batch_stats: bool,
    sync: Option<(Arc<dyn Collective>, usize)>,
    relu: bool,
    /// bf16 autocast: the output and the input gradient rounded to bf16 as they are stored.
    round: bool,
}

impl BlockedBatchNorm {
    /// Per-lane values of the real channels, zeros past them.
    fn lanes(&self, v: &[f32]) -> Vec<f32> {
        let mut out = v.to_vec();
        out.resize(self.mean.len(), 0.0);
        out
    }

    /// The forward's per-lane `scale` and `shift` (y = x·scale + shift, then the ReLU's floor).
    fn affine(&self, gamma: &[f32], beta: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let (gamma, beta) = (self.lanes(gamma), self.lanes(beta));
        let scale: Vec<f32> = gamma.iter().zip(&self.invstd).map(|(g, i)| g * i).collect();
        let shift = (0..scale.len())
            .map(|ch| beta[ch] - self.mean[ch] * scale[ch])
            .collect();
        (scale, shift)
    }
}

/// The largest output the forward stored as 0 after its ReLU: 0, or with bf16 rounding the positive
/// subnormals that round to 0 (bits up to 0x8000), so the backward's mask is the stored output's.
fn zero_below(round: bool) -> f32 {
    if round {
        f32::from_bits(0x8000)
    } else {
        0.0
    }
}

/// The output gradient `dy` where a fused ReLU (`RELU`) passed the value on, else 0: the forward's
/// output is recomputed from `x` with its own arithmetic (`scale`, `shift` of this lane), bit for bit,
/// instead of being read back, so both passes of the backward read one stream less.
#[inline(always)]
fn masked<const RELU: bool>(dy: f32, x: f32, (scale, shift): (f32, f32), zero: f32) -> f32 {
    if RELU && (x * scale + shift).max(0.0) <= zero {
        0.0
    } else {
        dy
    }
}

impl CustomOp3 for BlockedBatchNorm {
    fn name(&self) -> &'static str {
        "trainyard-blocked-batch-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, cb, h, w, l) = l1.shape().dims5()?;
        let (x, gamma, beta) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        if gamma.len() > cb * l || beta.len() != gamma.len() {
            candle_core::bail!(
                "blocked batch norm: {} weights for {cb} blocks of {l}",
                gamma.len()
            );
        }
        let (scale, shift) = self.affine(gamma, beta);
        let floor = if self.relu { 0.0 } else { f32::NEG_INFINITY };
        let y = match (l, self.round) {
            (16, false) => normalise::<16, false>(x, (cb, h * w), (&scale, &shift), floor),
            (16, true) => normalise::<16, true>(x, (cb, h * w), (&scale, &shift), floor),
            (8, false) => normalise::<8, false>(x, (cb, h * w), (&scale, &shift), floor),
            (8, true) => normalise::<8, true>(x, (cb, h * w), (&scale, &shift), floor),
            _ => candle_core::bail!("blocked batch norm: blocks of {l} lanes (8 or 16 expected)"),
        };
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let d = dims(x)?;
        let (n, cb, hw, l) = d;
        let c = gamma.dim(0)?;
        let gamma = gamma.flatten_all()?.to_vec1::<f32>()?;
        // With the ReLU the output's zeros mask the incoming gradient, recomputed from x.
        let affine = self.relu.then(|| -> Result<_> {
            Ok(self.affine(&gamma, &beta.flatten_all()?.to_vec1::<f32>()?))
        });
        let affine = affine.transpose()?;
        let relu = affine.as_ref().map(|(a, b)| (&a[..], &b[..]));
        let gamma = self.lanes(&gamma);
        let (mean, invstd) = (&self.mean, &self.invstd);
        let zero = zero_below(self.round);
        let (dx, dgamma, dbeta) = with_f32(x, |xs| {
            with_f32(grad, |dy| {
                let (sg, sgx) = match (l, relu.is_some()) {
                    (16, true) => grad_sums::<16, true>((xs, dy), d, mean, relu, zero),
                    (16, false) => grad_sums::<16, false>((xs, dy), d, mean, relu, zero),
                    (8, true) => grad_sums::<8, true>((xs, dy), d, mean, relu, zero),
                    (8, false) => grad_sums::<8, false>((xs, dy), d, mean, relu, zero),
                    _ => candle_core::bail!("blocked batch norm: blocks of {l} lanes"),
                };
                let dbeta: Vec<f32> = sg[..c].iter().map(|&v| v as f32).collect();
                let dgamma: Vec<f32> = (0..c)
                    .map(|ch| (sgx[ch] * f64::from(invstd[ch])) as f32)
                    .collect();
                let (mut sum_g, mut sum_gxhat, mut m) =
                    (dbeta.clone(), dgamma.clone(), (n * hw) as f32);
                if let Some((group, count)) = self.sync.as_ref().filter(|_| x.track_op()) {
                    (sum_g, sum_gxhat) = global_grad_sums(group.as_ref(), &dbeta, &dgamma)?;
                    m = *count as f32;
                }
                let dx = x.track_op().then(|| {
                    let k: Vec<f32> = gamma
                        .iter()
                        .zip(invstd.iter())
                        .map(|(g, i)| g * i)
                        .collect();
                    let (a, b) = (self.lanes(&sum_g), self.lanes(&sum_gxhat));
                    // dx = k * (g - a/m - xhat * b/m), xhat = (x - mean) * invstd, as one affine map of
                    // g and x per channel: dx = k*g + (-k*b/m*invstd)*x + k*(b/m*invstd*mean - a/m).
                    let coef: Vec<[f32; 3]> = (0..k.len())
                        .map(|ch| {
                            if self.batch_stats {
                                let bx = b[ch] / m * invstd[ch];
                                [k[ch], -k[ch] * bx, k[ch] * (bx * mean[ch] - a[ch] / m)]
                            } else {
                                [k[ch], 0.0, 0.0]
                            }
                        })
                        .collect();
                    let args = ((xs, dy), (cb, hw), &coef[..], relu);
                    match (l, relu.is_some(), self.round) {
                        (16, true, false) => input_grad::<16, true, false>(args),
                        (16, false, false) => input_grad::<16, false, false>(args),
                        (16, true, true) => input_grad::<16, true, true>(args),
                        (16, false, true) => input_grad::<16, false, true>(args),
                        (_, true, false) => input_grad::<8, true, false>(args),
                        (_, false, false) => input_grad::<8, false, false>(args),
                        (_, true, true) => input_grad::<8, true, true>(args),
                        (_, false, true) => input_grad::<8, false, true>(args),
                    }
                });
                Ok((dx, dgamma, dbeta))
            })
        })?;
        let dev = x.device();
        let dx = dx
            .map(|v| Tensor::from_vec(v, x.shape(), dev))
            .transpose()?;
        Ok((
            dx,
            Some(Tensor::from_vec(dgamma, c, dev)?),
            Some(Tensor::from_vec(dbeta, c, dev)?),
        ))
    }
}

/// `max(x * scale + shift, floor)` per lane of every block, rounded to bf16 with `ROUND`.
fn normalise<const L: usize, const ROUND: bool>(
    x: &[f32],
    (cb, hw): (usize, usize),
    (scale, shift): (&[f32], &[f32]),
    floor: f32,
) -> Vec<f32> {
    let mut y = uninit(x.len());
    y.par_chunks_mut(hw * L)
        .zip(x.par_chunks(hw * L))
        .enumerate()
        .for_each(|(p, (out, src))| {
            let b = p % cb;
            let sc: [f32; L] = scale[b * L..][..L].try_into().expect("L lanes");
            let sh: [f32; L] = shift[b * L..][..L].try_into().expect("L lanes");
            for (o, v) in out.chunks_exact_mut(L).zip(src.chunks_exact(L)) {
                for lane in 0..L {
                    let y = (v[lane] * sc[lane] + sh[lane]).max(floor);
                    o[lane] = MaybeUninit::new(if ROUND { round_f32(y) } else { y });
                }
            }
        });
    // SAFETY: every lane of every pixel of every plane was written.
    unsafe { assume_init(y) }
}

/// The ReLU mask's per-lane scale and shift of block `b` (zeros without a ReLU).
fn lane_affine<const L: usize>(relu: Option<(&[f32], &[f32])>, b: usize) -> ([f32; L], [f32; L]) {
    match relu {
        Some((sc, sh)) => (
            sc[b * L..][..L].try_into().expect("L lanes"),
            sh[b * L..][..L].try_into().expect("L lanes"),
        ),
        None => ([0.0; L], [0.0; L]),
    }
}

/// The input gradient `c0·g + c1·x + c2` per channel, g the (masked) output gradient; rounded to bf16
/// with `ROUND`.
fn input_grad<const L: usize, const RELU: bool, const ROUND: bool>(
    ((xs, dy), (cb, hw), coef, relu): GradArgs,
) -> Vec<f32> {
    let plane = hw * L;
    let zero = zero_below(ROUND);
    let mut dx = uninit(xs.len());
    dx.par_chunks_mut(plane).enumerate().for_each(|(p, o)| {
        let b = p % cb;
        let mut c = [[0f32; L]; 3];
        for lane in 0..L {
            for (j, cj) in c.iter_mut().enumerate() {
                cj[lane] = coef[b * L + lane][j];
            }
        }
        let mask = lane_affine::<L>(relu, b);
        let r = p * plane..(p + 1) * plane;
        for ((o, d), x) in o
            .chunks_exact_mut(L)
            .zip(dy[r.clone()].chunks_exact(L))
            .zip(xs[r].chunks_exact(L))
        {
            for lane in 0..L {
                let g = masked::<RELU>(d[lane], x[lane], (mask.0[lane], mask.1[lane]), zero);
                let v = c[0][lane] * g + c[1][lane] * x[lane] + c[2][lane];
                o[lane] = MaybeUninit::new(if ROUND { round_f32(v) } else { v });
            }
        }
    });
    // SAFETY: every lane of every pixel of every plane was written.
    unsafe { assume_init(dx) }
}

/// Σ g and Σ g·(x − mean) per channel (every lane), g the gradient masked by a fused ReLU's zeros.
fn grad_sums<const L: usize, const RELU: bool>(
    (xs, dy): (&[f32], &[f32]),
    (n, cb, hw, _): Dims,
    mean: &[f32],
    relu: Option<(&[f32], &[f32])>,
    zero: f32,
) -> (Vec<f64>, Vec<f64>) {
    let per_block: Vec<([f64; L], [f64; L])> = (0..cb)
        .into_par_iter()
        .map(|b| {
            let (mut sg, mut sgx) = ([0f64; L], [0f64; L]);
            let mu: [f32; L] = mean[b * L..][..L].try_into().expect("L lanes");
            let mask = lane_affine::<L>(relu, b);
            for img in 0..n {
                let r = (img * cb + b) * hw * L..(img * cb + b + 1) * hw * L;
                let (mut ag, mut agx) = ([0f32; L], [0f32; L]);
                for (d, x) in dy[r.clone()].chunks_exact(L).zip(xs[r].chunks_exact(L)) {
                    for lane in 0..L {
                        let g =
                            masked::<RELU>(d[lane], x[lane], (mask.0[lane], mask.1[lane]), zero);
                        ag[lane] += g;
                        agx[lane] += g * (x[lane] - mu[lane]);
                    }
                }
                for lane in 0..L {
                    sg[lane] += f64::from(ag[lane]);
                    sgx[lane] += f64::from(agx[lane]);
                }
            }
            (sg, sgx)
        })
        .collect();
    let sg = per_block.iter().flat_map(|(g, _)| *g).collect();
    let sgx = per_block.iter().flat_map(|(_, gx)| *gx).collect();
    (sg, sgx)
}
