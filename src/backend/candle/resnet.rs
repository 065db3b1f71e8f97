//! ResNet-18/34/50/101/152 on Candle (the architecture: `model::resnet`), over torchvision's parameter names
//! so torchvision weights load and our checkpoints load in PyTorch. BatchNorm (train-mode statistics and
//! PyTorch's running averages) is a fused kernel on the CPU, blocked or planar, and basic ops elsewhere;
//! the ImageNet stem's 3x3/2 max-pool is a fused kernel on the CPU and the maximum of nine strided views
//! elsewhere.
//! `cifar_stem`: a 3x3 stride-1 first conv and no max-pool, for 32x32 images.

use super::autocast::Autocast;
use super::kernels::batchnorm::{self, Then};
use super::kernels::direct;
use super::kernels::direct::conv::Rounded;
use super::models::{param, Buffers, CandleForward, Params, Pass};
use crate::comm::collective::Collective;
use crate::model::resnet::ResNet;
use candle_core::{Result, Tensor, D};
use std::sync::Arc;

/// BatchNorm2d's `eps` and `momentum`.
#[derive(Clone, Copy)]
pub(super) struct BnConst {
    pub eps: f64,
    pub momentum: f64,
}

/// PyTorch's defaults, which torchvision's ResNets keep.
const BN: BnConst = BnConst {
    eps: 1e-5,
    momentum: 0.1,
};

/// A convolution: the blocked direct kernels when `x` is blocked (rank 5), otherwise im2col (or Candle's
/// own off the CPU).
pub(super) fn conv(
    pa: (&Params, Autocast),
    name: &str,
    x: &Tensor,
    stride: usize,
    padding: usize,
) -> Result<Tensor> {
    conv_of(pa, (name, x), (stride, padding), Rounded::NONE)
}

/// `conv` whose bf16 operands `rounded` names arrive rounded already (see `direct::conv::Rounded`).
fn conv_of(
    (p, autocast): (&Params, Autocast),
    (name, x): (&str, &Tensor),
    (stride, padding): (usize, usize),
    rounded: Rounded,
) -> Result<Tensor> {
    let w = param(p, &format!("{name}.weight"))?;
    match (blocked_path(x), autocast.bf16, autocast.tier) {
        (Some(isa), false, _) => direct::conv::conv2d(isa, x, w, stride, padding),
        (Some(isa), true, Some(tier)) => {
            direct::conv::conv2d_bf16((isa, tier), x, w, (stride, padding), rounded)
        }
        (Some(_), true, None) => candle_core::bail!("blocked activations under emulated bf16"),
        (None, ..) => autocast.conv2d(x, w, stride, padding),
    }
}

/// A residual block's end, `relu(out + identity)`; under bf16 autocast both are bf16 and so is the sum, as
/// PyTorch's add of two bf16 tensors returns it (its gradient too: `fused::add_relu_rounded`).
fn block_end(out: &Tensor, identity: &Tensor, bf16: bool) -> Result<Tensor> {
    use super::kernels::fused;
    if !bf16 {
        return fused::add_relu(out, identity);
    }
    match fused::add_relu_rounded(out, identity)? {
        Some(y) => Ok(y),
        None => Autocast::EMULATED.round(&fused::add_relu(out, identity)?),
    }
}

/// The direct-convolution path `x` is on: blocked activations are rank 5 (N, C/L, H, W, L).
fn blocked_path(x: &Tensor) -> Option<direct::Isa> {
    if x.rank() == 5 {
        direct::active()
    } else {
        None
    }
}

/// BatchNorm2d: batch statistics in train mode (running stats updated with the unbiased variance, as
/// PyTorch does), running statistics in eval mode; `then` is fused into the same op on the CPU. With
/// `bf16` (autocast, `x` a bf16 convolution's output) the output and its input gradient are bf16, as
/// PyTorch's BatchNorm returns them for a bf16 input (`BnOf::Bf16`).
fn batch_norm(
    p: &Params,
    b: &mut Buffers,
    (name, x): (&str, &Tensor),
    mode: (bool, Option<&Arc<dyn Collective>>),
    (then, bf16): (Then, bool),
) -> Result<Tensor> {
    let of = if bf16 { BnOf::Bf16 } else { BnOf::F32 };
    batch_norm_with(p, b, (name, x), mode, (then, of), BN)
}

/// The dtype of a BatchNorm's input under autocast.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum BnOf {
    /// f32 (autocast off, or an input autocast leaves in f32): an f32 output. Declared (YAML) models
    /// keep this under autocast too: their graph is the user's, so what reads a BatchNorm's output, and
    /// whether its input was bf16, is not known there.
    F32,
    /// bf16 (a bf16 convolution's output): its arithmetic in f32, the output and the input gradient
    /// rounded to bf16, fused into the blocked kernel's stores.
    Bf16,
}

/// `batch_norm` with a layer's own `eps` and `momentum`.
pub(super) fn batch_norm_with(
    p: &Params,
    b: &mut Buffers,
    (name, x): (&str, &Tensor),
    (train, sync): (bool, Option<&Arc<dyn Collective>>),
    (then, of): (Then, BnOf),
    bn: BnConst,
) -> Result<Tensor> {
    let y = batch_norm_kernel(p, b, (name, x), (train, sync), (then, of), bn)?;
    match of {
        // The blocked kernel rounded as it stored; elsewhere a rounding op (its backward rounds the
        // output's gradient; the input gradient is rounded where the convolution's output was). It
        // rounds after the fused ReLU, so an output in (0, 2^-134] stored as 0 still passes its gradient
        // here, where the blocked kernel and PyTorch do not: subnormals only.
        BnOf::Bf16 if x.rank() != 5 => Autocast::EMULATED.round(&y),
        _ => Ok(y),
    }
}

/// `batch_norm_with`'s kernel: the blocked one (which rounds as it stores under `BnOf::Bf16`), the
/// planar one, or basic ops.
fn batch_norm_kernel(
    p: &Params,
    b: &mut Buffers,
    (name, x): (&str, &Tensor),
    (train, sync): (bool, Option<&Arc<dyn Collective>>),
    (then, of): (Then, BnOf),
    bn: BnConst,
) -> Result<Tensor> {
    let gamma = param(p, &format!("{name}.weight"))?;
    let beta = param(p, &format!("{name}.bias"))?;
    let (rm, rv) = (
        format!("{name}.running_mean"),
        format!("{name}.running_var"),
    );
    if x.rank() == 5 {
        let then = (then, of == BnOf::Bf16);
        if !train {
            return direct::batchnorm::eval(x, gamma, beta, (&b[&rm], &b[&rv]), bn.eps, then);
        }
        let (y, stats) = direct::batchnorm::train(x, gamma, beta, bn.eps, then, sync)?;
        running_from_stats(b, name, &stats, x.device(), bn.momentum)?;
        return Ok(y);
    }
    if !train {
        if let Some(y) = batchnorm::eval(x, gamma, beta, (&b[&rm], &b[&rv]), bn.eps, then)? {
            return Ok(y);
        }
    } else if let Some((y, stats)) = batchnorm::train(x, gamma, beta, bn.eps, then, sync)? {
        running_from_stats(b, name, &stats, x.device(), bn.momentum)?;
        return Ok(y);
    }
    let y = batch_norm_basic_ops(gamma, beta, b, (name, x), train, bn)?;
    match then {
        Then::Relu => super::kernels::fused::relu(&y),
        Then::Nothing => Ok(y),
    }
}

/// The running averages after a batch with statistics `stats` (unbiased variance, as PyTorch keeps it).
fn running_from_stats(
    b: &mut Buffers,
    name: &str,
    stats: &batchnorm::ChannelStats,
    dev: &candle_core::Device,
    momentum: f64,
) -> Result<()> {
    let (n, c) = (stats.count as f64, stats.mean.len());
    let mean = Tensor::from_vec(stats.mean.clone(), c, dev)?;
    let unbiased =
        Tensor::from_vec(stats.var.clone(), c, dev)?.affine(n / (n - 1.0).max(1.0), 0.0)?;
    update_running(b, name, &mean, &unbiased, momentum)
}

/// Running averages as PyTorch keeps them (`momentum`, unbiased variance, a batch counter).
fn update_running(
    b: &mut Buffers,
    name: &str,
    mean: &Tensor,
    unbiased_var: &Tensor,
    momentum: f64,
) -> Result<()> {
    let (rm, rv) = (
        format!("{name}.running_mean"),
        format!("{name}.running_var"),
    );
    let new_mean = (b[&rm].affine(1.0 - momentum, 0.0)? + mean.affine(momentum, 0.0)?)?;
    let new_var = (b[&rv].affine(1.0 - momentum, 0.0)? + unbiased_var.affine(momentum, 0.0)?)?;
    let tracked = format!("{name}.num_batches_tracked");
    let count = b[&tracked].affine(1.0, 1.0)?;
    b.insert(rm, new_mean);
    b.insert(rv, new_var);
    b.insert(tracked, count);
    Ok(())
}

/// BatchNorm from Candle's basic ops: used off the CPU, where the fused kernel does not run.
fn batch_norm_basic_ops(
    gamma: &Tensor,
    beta: &Tensor,
    b: &mut Buffers,
    (name, x): (&str, &Tensor),
    train: bool,
    bn: BnConst,
) -> Result<Tensor> {
    let c = x.dim(1)?;
    let shape = (1, c, 1, 1);
    let (mean, var) = if train {
        let mean = x.mean_keepdim(0)?.mean_keepdim(2)?.mean_keepdim(3)?;
        let centered = x.broadcast_sub(&mean)?;
        let var = centered
            .sqr()?
            .mean_keepdim(0)?
            .mean_keepdim(2)?
            .mean_keepdim(3)?;
        let n = (x.elem_count() / c) as f64;
        let unbiased = var
            .flatten_all()?
            .detach()
            .affine(n / (n - 1.0).max(1.0), 0.0)?;
        update_running(
            b,
            name,
            &mean.flatten_all()?.detach(),
            &unbiased,
            bn.momentum,
        )?;
        (mean, var)
    } else {
        (
            b[&format!("{name}.running_mean")].reshape(shape)?,
            b[&format!("{name}.running_var")].reshape(shape)?,
        )
    };
    let normed = x
        .broadcast_sub(&mean)?
        .broadcast_div(&var.affine(1.0, bn.eps)?.sqrt()?)?;
    normed
        .broadcast_mul(&gamma.reshape(shape)?)?
        .broadcast_add(&beta.reshape(shape)?)
}

/// Every second row/column starting at `offset` (a strided view built from reshape + narrow).
fn every_second(x: &Tensor, dim: usize, offset: usize, count: usize) -> Result<Tensor> {
    let view = x.narrow(dim, offset, 2 * count)?;
    let mut shape = view.dims().to_vec();
    shape[dim] = count;
    shape.insert(dim + 1, 2);
    view.reshape(shape)?.narrow(dim + 1, 0, 1)?.squeeze(dim + 1)
}

/// 3x3 stride-2 padding-1 max-pool on non-negative input (it follows a ReLU, so zero padding is exact).
pub(super) fn max_pool_3x3_s2(x: &Tensor) -> Result<Tensor> {
    if matches!(x.device(), candle_core::Device::Cpu) && x.dtype() == candle_core::DType::F32 {
        return super::kernels::fused::max_pool2d(x, 3, 2, 1);
    }
    max_pool_3x3_s2_views(x)
}

/// The same pool from strided views, for devices without the fused kernel.
fn max_pool_3x3_s2_views(x: &Tensor) -> Result<Tensor> {
    let (h, w) = (x.dim(2)?, x.dim(3)?);
    let (ho, wo) = ((h - 1) / 2 + 1, (w - 1) / 2 + 1);
    // Pad so every window fits: 1 before, enough after.
    let padded = x
        .pad_with_zeros(2, 1, 2 * ho + 1 - h)?
        .pad_with_zeros(3, 1, 2 * wo + 1 - w)?;
    let mut out: Option<Tensor> = None;
    for dy in 0..3 {
        let rows = every_second(&padded, 2, dy, ho)?;
        for dx in 0..3 {
            let view = every_second(&rows, 3, dx, wo)?;
            out = Some(match out {
                None => view,
                Some(m) => m.maximum(&view)?,
            });
        }
    }
    out.ok_or_else(|| candle_core::Error::Msg("empty pool".into()))
}

impl CandleForward for ResNet {
    fn forward_stage(
        &self,
        k: usize,
        p: &Params,
        b: &mut Buffers,
        x: &Tensor,
        pass: &mut Pass,
    ) -> Result<Tensor> {
        let mode = (pass.train, pass.sync_batchnorm);
        let pa = (p, pass.autocast);
        let bf16 = pass.autocast.bf16;
        let layout = self.layout();
        if k == 0 {
            let blocked = pass.autocast.blocks_activations(x);
            if let (true, Some(isa)) = (self.cifar_stem(), blocked) {
                // The CIFAR stem runs blocked too: its 3 channels padded to a block cost a few more
                // products than im2col but save the planar BatchNorm and a conversion of its output.
                let h = direct::layout::to_blocked(x, isa.lanes())?;
                // The images are f32; the gradient reaches the convolution through bn1, rounded.
                let rounded = Rounded {
                    input: false,
                    grad: bf16,
                };
                let h = conv_of(pa, ("conv1", &h), (1, 1), rounded)?;
                return batch_norm(p, b, ("bn1", &h), mode, (Then::Relu, bf16));
            }
            let h = if self.cifar_stem() {
                conv(pa, "conv1", x, 1, 1)?
            } else {
                conv(pa, "conv1", x, 2, 3)?
            };
            let h = batch_norm(p, b, ("bn1", &h), mode, (Then::Relu, bf16))?;
            let h = if self.cifar_stem() {
                h
            } else {
                max_pool_3x3_s2(&h)?
            };
            // The blocks keep the stem's output blocked up to the head.
            return match blocked {
                Some(isa) => direct::layout::to_blocked(&h, isa.lanes()),
                None => Ok(h),
            };
        }
        let Some((name, c_in, width, stride)) = layout.get(k - 1) else {
            let x = if x.rank() == 5 {
                direct::layout::from_blocked(x, param(p, "fc.weight")?.dim(1)?)?
            } else {
                x.clone()
            };
            let pooled = x.mean(D::Minus1)?.mean(D::Minus1)?;
            let w = param(p, "fc.weight")?;
            return pass.autocast.linear(&pooled, w, param(p, "fc.bias")?);
        };
        let (h, stride) = (x, *stride);
        let c_out = width * self.expansion();
        // Under bf16 autocast every tensor a block's convolutions read is bf16 already: the block's input
        // (the stem's BatchNorm or the last block's residual add rounded it), the BatchNorms' outputs,
        // and each convolution's output gradient (its only reader, a BatchNorm, rounds its input gradient).
        let rounded = Rounded {
            input: bf16,
            grad: bf16,
        };
        let block_conv =
            |name: &str, x: &Tensor, geometry| conv_of(pa, (name, x), geometry, rounded);
        let mut norm =
            |name: &str, x: &Tensor, then| batch_norm(p, b, (name, x), mode, (then, bf16));
        let identity = if stride != 1 || *c_in != c_out {
            let d = block_conv(&format!("{name}.downsample.0"), h, (stride, 0))?;
            norm(&format!("{name}.downsample.1"), &d, Then::Nothing)?
        } else {
            h.clone()
        };
        let out = if self.bottleneck() {
            let o = block_conv(&format!("{name}.conv1"), h, (1, 0))?;
            let o = norm(&format!("{name}.bn1"), &o, Then::Relu)?;
            let o = block_conv(&format!("{name}.conv2"), &o, (stride, 1))?;
            let o = norm(&format!("{name}.bn2"), &o, Then::Relu)?;
            let o = block_conv(&format!("{name}.conv3"), &o, (1, 0))?;
            norm(&format!("{name}.bn3"), &o, Then::Nothing)?
        } else {
            let o = block_conv(&format!("{name}.conv1"), h, (stride, 1))?;
            let o = norm(&format!("{name}.bn1"), &o, Then::Relu)?;
            let o = block_conv(&format!("{name}.conv2"), &o, (1, 1))?;
            norm(&format!("{name}.bn2"), &o, Then::Nothing)?
        };
        block_end(&out, &identity, bf16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::rng::Rng;
    use candle_core::Device;

    #[test]
    fn max_pool_matches_a_direct_loop() {
        let mut rng = Rng::new(1);
        let (h, w) = (7, 6);
        let data: Vec<f32> = (0..h * w).map(|_| rng.next_f32()).collect();
        let x = Tensor::from_slice(&data, (1, 1, h, w), &Device::Cpu).unwrap();
        let y = max_pool_3x3_s2(&x).unwrap();
        let views = max_pool_3x3_s2_views(&x).unwrap();
        assert_eq!(
            y.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            views.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
        let (ho, wo) = (4, 3);
        assert_eq!(y.dims(), &[1, 1, ho, wo]);
        let got = y.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for oy in 0..ho {
            for ox in 0..wo {
                let mut m = 0.0f32;
                for ky in 0..3 {
                    for kx in 0..3 {
                        let (iy, ix) = ((oy * 2 + ky) as isize - 1, (ox * 2 + kx) as isize - 1);
                        if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < w {
                            m = m.max(data[iy as usize * w + ix as usize]);
                        }
                    }
                }
                assert_eq!(got[oy * wo + ox], m, "({oy},{ox})");
            }
        }
    }
}
