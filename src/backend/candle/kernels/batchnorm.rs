//! BatchNorm2d for training on the CPU as one fused Candle custom op with its own backward. Built from
//! Candle's basic ops it needs ~10 full passes (reductions over non-last dimensions are slow strided loops
//! in Candle 0.11) and dominated ResNet training time; fused it is two passes forward and two backward.
//!
//! Per-channel sums run in a fixed order (one task per channel, f64 accumulators), so results are
//! bit-identical across runs and thread counts.

use crate::backend::candle::kernels::tape;
use crate::comm::collective::Collective;
use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::sync::Arc;

/// Per-channel statistics of an (N, C, H, W) batch: mean and biased variance.
#[derive(Debug, Clone)]
pub struct ChannelStats {
    pub mean: Vec<f32>,
    pub var: Vec<f32>,
    /// Elements per channel (N * H * W), for the unbiased running variance.
    pub count: usize,
}

/// What follows the normalisation inside the same op. A fused ReLU saves its own forward pass, its
/// backward pass and a graph edge (an activation-sized gradient); the backward masks the gradient with
/// the op's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    Nothing,
    Relu,
}

/// Training-mode BatchNorm: normalise with the batch's statistics, returned for the running averages;
/// with a `sync` group (SyncBatchNorm), the statistics of every rank's batch, reduced over it in the
/// forward pass and again in the backward pass. Falls back to `None` off the CPU / for non-f32 tensors,
/// where the caller uses basic ops.
pub fn train(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f64,
    then: Then,
    sync: Option<&Arc<dyn Collective>>,
) -> Result<Option<(Tensor, ChannelStats)>> {
    if !fast(x) {
        return Ok(None);
    }
    let x = x.contiguous()?;
    let (n, c, h, w) = x.dims4()?;
    let stats = with_f32(&x, |data| match &sync {
        Some(group) => global_channel_stats(group.as_ref(), data, n, c, h * w),
        None => Ok(channel_stats(data, n, c, h * w)),
    })?;
    let invstd = stats
        .var
        .iter()
        .map(|v| 1.0 / (*v as f64 + eps).sqrt() as f32)
        .collect();
    let op = BatchNorm {
        mean: Arc::new(stats.mean.clone()),
        invstd: Arc::new(invstd),
        batch_stats: true,
        sync: sync.map(|group| (group.clone(), stats.count)),
        relu: then == Then::Relu,
    };
    Ok(Some((tape::op3(&x, gamma, beta, op)?, stats)))
}

/// Eval-mode BatchNorm with fixed (running) statistics.
pub fn eval(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    (mean, var): (&Tensor, &Tensor),
    eps: f64,
    then: Then,
) -> Result<Option<Tensor>> {
    if !fast(x) {
        return Ok(None);
    }
    let mean = mean.flatten_all()?.to_vec1::<f32>()?;
    let invstd = var
        .flatten_all()?
        .to_vec1::<f32>()?
        .iter()
        .map(|v| 1.0 / (*v as f64 + eps).sqrt() as f32)
        .collect();
    let op = BatchNorm {
        mean: Arc::new(mean),
        invstd: Arc::new(invstd),
        batch_stats: false,
        sync: None,
        relu: then == Then::Relu,
    };
    Ok(Some(tape::op3(&x.contiguous()?, gamma, beta, op)?))
}

fn fast(x: &Tensor) -> bool {
    super::cpu::is_cpu_f32(x) && x.rank() == 4
}

use super::cpu::{f32_slice as slice, with_f32};

/// Accumulator lanes per plane: wide enough for the compiler to vectorise the sums.
const LANES: usize = 8;

/// Σ f(v) over one plane: eight f32 lanes (a single f64 chain was bound by the adder's latency and cost
/// more than the rest of BatchNorm), then the lanes and the tail in f64, always in the same order.
fn plane_sum(a: &[f32], f: impl Fn(f32) -> f32) -> f64 {
    let mut acc = [0f32; LANES];
    let chunks = a.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, v) in acc.iter_mut().zip(chunk) {
            *lane += f(*v);
        }
    }
    let mut total: f64 = acc.iter().map(|&v| f64::from(v)).sum();
    for v in tail {
        total += f64::from(f(*v));
    }
    total
}

/// Σ f(v) over channel `ch` of an (n, c, hw) batch: planes in image order.
fn channel_sum(
    data: &[f32],
    (n, c, hw): (usize, usize, usize),
    ch: usize,
    f: impl Fn(f32) -> f32 + Copy,
) -> f64 {
    (0..n)
        .map(|img| plane_sum(&data[(img * c + ch) * hw..][..hw], f))
        .sum()
}

/// The gradient reaching the normalisation: `dy`, or zero where a fused ReLU's output `y` is zero.
#[inline(always)]
fn masked(dy: f32, y: f32, relu: bool) -> f32 {
    if relu && y <= 0.0 {
        0.0
    } else {
        dy
    }
}

/// Σ g and Σ g·(x − mean) over one plane, g the masked gradient, in lanes as `plane_sum`.
fn plane_grad_sums(dy: &[f32], x: &[f32], y: &[f32], mean: f32, relu: bool) -> (f64, f64) {
    let (mut sg, mut sgx) = ([0f32; LANES], [0f32; LANES]);
    let whole = dy.len() / LANES * LANES;
    for ((d, xv), yv) in dy[..whole]
        .chunks_exact(LANES)
        .zip(x[..whole].chunks_exact(LANES))
        .zip(y[..whole].chunks_exact(LANES))
    {
        for l in 0..LANES {
            let g = masked(d[l], yv[l], relu);
            sg[l] += g;
            sgx[l] += g * (xv[l] - mean);
        }
    }
    let mut a: f64 = sg.iter().map(|&v| f64::from(v)).sum();
    let mut b: f64 = sgx.iter().map(|&v| f64::from(v)).sum();
    for i in whole..dy.len() {
        let g = masked(dy[i], y[i], relu);
        a += f64::from(g);
        b += f64::from(g * (x[i] - mean));
    }
    (a, b)
}

fn channel_stats(data: &[f32], n: usize, c: usize, hw: usize) -> ChannelStats {
    let count = n * hw;
    let (mean, var): (Vec<f32>, Vec<f32>) = (0..c)
        .into_par_iter()
        .map(|ch| {
            let mean = (channel_sum(data, (n, c, hw), ch, |v| v) / count as f64) as f32;
            let var = channel_sum(data, (n, c, hw), ch, |v| (v - mean) * (v - mean)) / count as f64;
            (mean, var as f32)
        })
        .unzip();
    ChannelStats { mean, var, count }
}

/// SyncBatchNorm's statistics: the global count, sum and (two-pass) variance over every rank's batch.
fn global_channel_stats(
    group: &dyn crate::comm::collective::Collective,
    data: &[f32],
    n: usize,
    c: usize,
    hw: usize,
) -> Result<ChannelStats> {
    let reduce = |v: &mut [f64]| {
        group
            .all_reduce_f64(v, crate::comm::collective::ReduceOp::Sum)
            .map_err(|e| candle_core::Error::Msg(format!("SyncBatchNorm: {e:#}")))
    };
    let mut sums: Vec<f64> = (0..c)
        .into_par_iter()
        .map(|ch| channel_sum(data, (n, c, hw), ch, |v| v))
        .collect();
    sums.push((n * hw) as f64);
    reduce(&mut sums)?;
    let count = sums[c];
    let mean: Vec<f64> = sums[..c].iter().map(|s| s / count).collect();
    let mut squares: Vec<f64> = (0..c)
        .into_par_iter()
        .map(|ch| {
            let m = mean[ch] as f32;
            channel_sum(data, (n, c, hw), ch, |v| (v - m) * (v - m))
        })
        .collect();
    reduce(&mut squares)?;
    Ok(ChannelStats {
        mean: mean.iter().map(|&m| m as f32).collect(),
        var: squares.iter().map(|&s| (s / count) as f32).collect(),
        count: count as usize,
    })
}

/// SyncBatchNorm's backward: Σ g and Σ g·x̂ per channel summed over every rank (one reduction for both).
pub(crate) fn global_grad_sums(
    group: &dyn Collective,
    sum_g: &[f32],
    sum_gxhat: &[f32],
) -> Result<(Vec<f32>, Vec<f32>)> {
    let c = sum_g.len();
    let mut both: Vec<f64> = sum_g
        .iter()
        .chain(sum_gxhat)
        .map(|&v| f64::from(v))
        .collect();
    group
        .all_reduce_f64(&mut both, crate::comm::collective::ReduceOp::Sum)
        .map_err(|e| candle_core::Error::Msg(format!("SyncBatchNorm: {e:#}")))?;
    Ok((
        both[..c].iter().map(|&v| v as f32).collect(),
        both[c..].iter().map(|&v| v as f32).collect(),
    ))
}

struct BatchNorm {
    mean: Arc<Vec<f32>>,
    invstd: Arc<Vec<f32>>,
    /// Whether `mean`/`invstd` came from this batch (their gradient then flows back into x).
    batch_stats: bool,
    /// SyncBatchNorm: the group the backward's sums are reduced over, and the global element count per
    /// channel.
    sync: Option<(Arc<dyn Collective>, usize)>,
    /// A ReLU applied to the output (its gradient is masked where the output is zero).
    relu: bool,
}

impl CustomOp3 for BatchNorm {
    fn name(&self) -> &'static str {
        "trainyard-batch-norm"
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
        let (_, c, h, w) = l1.shape().dims4()?;
        let (x, gamma, beta) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        if gamma.len() != c || beta.len() != c || self.mean.len() != c {
            candle_core::bail!("batch_norm: {c} channels but {} weights", gamma.len());
        }
        let hw = h * w;
        let mut y = vec![0f32; x.len()];
        y.par_chunks_mut(hw).enumerate().for_each(|(plane, out)| {
            let ch = plane % c;
            let scale = gamma[ch] * self.invstd[ch];
            let shift = beta[ch] - self.mean[ch] * scale;
            let floor = if self.relu { 0.0 } else { f32::NEG_INFINITY };
            for (o, v) in out.iter_mut().zip(&x[plane * hw..(plane + 1) * hw]) {
                *o = (v * scale + shift).max(floor);
            }
        });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        _beta: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (n, c, h, w) = x.dims4()?;
        let hw = h * w;
        let gamma_host = gamma.flatten_all()?.to_vec1::<f32>()?;
        let (mean, invstd) = (&self.mean, &self.invstd);
        // With the ReLU the output's zeros mask the incoming gradient; without it nothing is read.
        let out = if self.relu {
            Some(res.contiguous()?)
        } else {
            None
        };
        let (dgamma, dbeta, dx) = with_f32(x, |xs| {
            with_f32(grad, |raw_dy| {
                with_f32(out.as_ref().unwrap_or(grad), |ys| {
                    let relu = self.relu;
                    // dbeta = sum(g), dgamma = sum(g * xhat), per channel, in one pass.
                    let (dbeta, dgamma): (Vec<f32>, Vec<f32>) = (0..c)
                        .into_par_iter()
                        .map(|ch| {
                            let (mut sum_g, mut sum_gx) = (0.0f64, 0.0f64);
                            for img in 0..n {
                                let r = (img * c + ch) * hw..(img * c + ch + 1) * hw;
                                let (a, b) = plane_grad_sums(
                                    &raw_dy[r.clone()],
                                    &xs[r.clone()],
                                    &ys[r],
                                    mean[ch],
                                    relu,
                                );
                                sum_g += a;
                                sum_gx += b;
                            }
                            (sum_g as f32, (sum_gx * f64::from(invstd[ch])) as f32)
                        })
                        .unzip();
                    // SyncBatchNorm: the input gradient uses the sums over the global batch; the parameters'
                    // gradients stay this rank's (DDP averages them).
                    let (mut sum_dy, mut sum_dy_xhat, m) =
                        (dbeta.clone(), dgamma.clone(), (n * hw) as f32);
                    let m = match &self.sync {
                        Some((group, count)) if x.track_op() => {
                            (sum_dy, sum_dy_xhat) =
                                global_grad_sums(group.as_ref(), &dbeta, &dgamma)?;
                            *count as f32
                        }
                        _ => m,
                    };
                    // The input gradient only when something upstream needs it.
                    let dx = x.track_op().then(|| {
                        let mut dx = vec![0f32; xs.len()];
                        dx.par_chunks_mut(hw).enumerate().for_each(|(plane, out)| {
                            let ch = plane % c;
                            let k = gamma_host[ch] * invstd[ch];
                            let range = plane * hw..(plane + 1) * hw;
                            let planes = out
                                .iter_mut()
                                .zip(&raw_dy[range.clone()])
                                .zip(&ys[range.clone()])
                                .zip(&xs[range]);
                            if self.batch_stats {
                                // dx = gamma * invstd / M * (M * g - sum(g) - xhat * sum(g * xhat))
                                let (a, b) = (sum_dy[ch] / m, sum_dy_xhat[ch] / m);
                                let (mu, inv) = (mean[ch], invstd[ch]);
                                for (((o, d), y), xv) in planes {
                                    let xhat = (xv - mu) * inv;
                                    *o = k * (masked(*d, *y, relu) - a - xhat * b);
                                }
                            } else {
                                for (((o, d), y), _) in planes {
                                    *o = k * masked(*d, *y, relu);
                                }
                            }
                        });
                        dx
                    });
                    Ok((dgamma, dbeta, dx))
                })
            })
        })?;
        let dev = x.device();
        let dx = dx
            .map(|dx| Tensor::from_vec(dx, (n, c, h, w), dev))
            .transpose()?;
        Ok((
            dx,
            Some(Tensor::from_vec(dgamma, c, dev)?),
            Some(Tensor::from_vec(dbeta, c, dev)?),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var, D};

    fn seeded(shape: &[usize], seed: u64) -> Tensor {
        crate::backend::candle::kernels::cpu::seeded(shape, seed, -0.5, 1.5)
    }

    fn reference(x: &Tensor, gamma: &Tensor, beta: &Tensor) -> Tensor {
        let c = x.dim(1).unwrap();
        let mean = x
            .mean_keepdim(0)
            .unwrap()
            .mean_keepdim(2)
            .unwrap()
            .mean_keepdim(3)
            .unwrap();
        let centered = x.broadcast_sub(&mean).unwrap();
        let var = centered
            .sqr()
            .unwrap()
            .mean_keepdim(0)
            .unwrap()
            .mean_keepdim(2)
            .unwrap()
            .mean_keepdim(3)
            .unwrap();
        let normed = centered
            .broadcast_div(&(var + 1e-5).unwrap().sqrt().unwrap())
            .unwrap();
        normed
            .broadcast_mul(&gamma.reshape((1, c, 1, 1)).unwrap())
            .unwrap()
            .broadcast_add(&beta.reshape((1, c, 1, 1)).unwrap())
            .unwrap()
    }

    fn max_abs(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(D::Minus1)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    /// The gradients of `sum(a * probe)` and `sum(b * probe)` agree on every variable, within 1e-4.
    fn assert_same_gradients(a: &Tensor, b: &Tensor, probe: &Tensor, vars: [&Var; 3]) {
        let grads = |t: &Tensor| (t * probe).unwrap().sum_all().unwrap().backward().unwrap();
        let (g1, g2) = (grads(a), grads(b));
        for v in vars {
            let d = max_abs(g1.get(v).unwrap(), g2.get(v).unwrap());
            assert!(d < 1e-4, "gradient differs by {d}");
        }
    }

    #[test]
    fn forward_and_gradients_match_basic_ops() {
        let x = Var::from_tensor(&seeded(&[3, 4, 5, 6], 1)).unwrap();
        let gamma = Var::from_tensor(&seeded(&[4], 2)).unwrap();
        let beta = Var::from_tensor(&seeded(&[4], 3)).unwrap();
        let probe = seeded(&[3, 4, 5, 6], 4);
        let (ours, stats) = train(&x, &gamma, &beta, 1e-5, Then::Nothing, None)
            .unwrap()
            .unwrap();
        let theirs = reference(&x, &gamma, &beta);
        assert!(max_abs(&ours, &theirs) < 1e-5);
        assert_eq!(stats.count, 90);
        assert_same_gradients(&ours, &theirs, &probe, [&x, &gamma, &beta]);
    }

    #[test]
    fn fused_relu_matches_batch_norm_then_relu() {
        let x = Var::from_tensor(&seeded(&[3, 4, 5, 6], 11)).unwrap();
        let gamma = Var::from_tensor(&seeded(&[4], 12)).unwrap();
        let beta = Var::from_tensor(&seeded(&[4], 13)).unwrap();
        let probe = seeded(&[3, 4, 5, 6], 14);
        let (fused, _) = train(&x, &gamma, &beta, 1e-5, Then::Relu, None)
            .unwrap()
            .unwrap();
        let theirs = reference(&x, &gamma, &beta).relu().unwrap();
        assert!(max_abs(&fused, &theirs) < 1e-5);
        let zeros = fused
            .eq(0f32)
            .unwrap()
            .to_dtype(candle_core::DType::F32)
            .unwrap();
        let zero_count = zeros.sum_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(
            zero_count > 50.0 && zero_count < 300.0,
            "the ReLU must cut some values: {zero_count}"
        );
        assert_same_gradients(&fused, &theirs, &probe, [&x, &gamma, &beta]);
        let (mean, var) = (seeded(&[4], 15), seeded(&[4], 16).abs().unwrap());
        let fused = eval(&x, &gamma, &beta, (&mean, &var), 1e-5, Then::Relu)
            .unwrap()
            .unwrap();
        let plain = eval(&x, &gamma, &beta, (&mean, &var), 1e-5, Then::Nothing)
            .unwrap()
            .unwrap();
        assert!(max_abs(&fused, &plain.relu().unwrap()) == 0.0);
    }

    #[test]
    fn eval_mode_uses_the_given_statistics() {
        let x = seeded(&[2, 3, 2, 2], 1);
        let gamma = Tensor::new(&[1f32, 2.0, 0.5], &Device::Cpu).unwrap();
        let beta = Tensor::new(&[0f32, 1.0, -1.0], &Device::Cpu).unwrap();
        let mean = Tensor::new(&[0.1f32, 0.2, 0.3], &Device::Cpu).unwrap();
        let var = Tensor::new(&[1f32, 4.0, 0.25], &Device::Cpu).unwrap();
        let ours = eval(&x, &gamma, &beta, (&mean, &var), 0.0, Then::Nothing)
            .unwrap()
            .unwrap();
        let shape = (1, 3, 1, 1);
        let expected = x
            .broadcast_sub(&mean.reshape(shape).unwrap())
            .unwrap()
            .broadcast_div(&var.sqrt().unwrap().reshape(shape).unwrap())
            .unwrap()
            .broadcast_mul(&gamma.reshape(shape).unwrap())
            .unwrap()
            .broadcast_add(&beta.reshape(shape).unwrap())
            .unwrap();
        assert!(max_abs(&ours, &expected) < 1e-6);
    }
}
