//! Declared models (`model::declared`) on Candle: the layer list interpreted in order, with the same fast
//! paths the built-in ResNet takes, so a declared ResNet loses nothing to the zoo's: activations stay
//! channel-blocked between convolutions on the CPU's direct kernels, `BatchNorm2d` then `ReLU` is one fused
//! op, a `Residual` then `ReLU` one fused add-and-ReLU, `Conv2d(bias)` then `ReLU` one op, and on blocked
//! activations `Conv2d(bias)`, `ReLU`, `MaxPool2d(2)` one bias-ReLU-pool op after the convolution (the
//! built-in CNN's). A layer that has no blocked kernel gets its input back in NCHW first.

use super::autocast::Autocast;
use super::kernels::batchnorm::Then;
use super::kernels::{direct, fused};
use super::models::{
    blocked_bias_relu, blocked_conv_sums, dropout, param, Buffers, CandleForward, Params, Pass,
};
use super::resnet::{batch_norm_with, conv, BnConst, BnOf};
use super::vit::{gelu_erf, layer_norm_eps};
use crate::model::declared::{Declared, Layer, Op};
use candle_core::{Result, Tensor, D};

impl CandleForward for Declared {
    fn forward_stage(
        &self,
        k: usize,
        p: &Params,
        b: &mut Buffers,
        x: &Tensor,
        pass: &mut Pass,
    ) -> Result<Tensor> {
        run(self.stage(k), p, b, x, pass)
    }
}

/// `x` in NCHW: converted back from the blocked layout (rank 5) when it is in it.
fn planar(x: &Tensor, channels: usize) -> Result<Tensor> {
    if x.rank() == 5 {
        direct::layout::from_blocked(x, channels)
    } else {
        Ok(x.clone())
    }
}

/// Whether a `Conv2d` with this input starts (or keeps) the blocked layout: on the CPU's direct path in
/// f32, except a wide kernel over a few input channels (an ImageNet stem's 7x7 over RGB), which would
/// convolve mostly padding: that one stays im2col, as the built-in ResNet's does.
fn conv_blocked(x: &Tensor, c_in: usize, kernel: usize, autocast: Autocast) -> Option<direct::Isa> {
    if x.rank() == 5 {
        return direct::active();
    }
    autocast
        .blocks_activations(x)
        .filter(|isa| c_in >= isa.lanes() || kernel <= 3)
}

/// Run `layers` in order on `x`.
fn run(
    layers: &[Layer],
    p: &Params,
    b: &mut Buffers,
    x: &Tensor,
    pass: &mut Pass,
) -> Result<Tensor> {
    let mut h = x.clone();
    let mut i = 0;
    while i < layers.len() {
        let layer = &layers[i];
        let then_relu = matches!(layers.get(i + 1).map(|l| &l.op), Some(Op::Relu));
        let then_pool = then_relu
            && matches!(
                layers.get(i + 2).map(|l| &l.op),
                Some(Op::MaxPool2d {
                    kernel: 2,
                    stride: 2,
                    padding: 0
                })
            );
        let (out, consumed) = step(layer, (then_relu, then_pool), p, b, &h, pass)?;
        h = out;
        i += consumed;
    }
    Ok(h)
}

/// One layer; with `then_relu`, it may apply the ReLU that follows too, and with `then_pool` the 2x2
/// max-pool after that (returns how many layers it applied: 1, 2 or 3).
fn step(
    layer: &Layer,
    (then_relu, then_pool): (bool, bool),
    p: &Params,
    b: &mut Buffers,
    h: &Tensor,
    pass: &mut Pass,
) -> Result<(Tensor, usize)> {
    let name = layer.name.as_str();
    let channels = layer.input.first().copied().unwrap_or(0);
    let autocast = pass.autocast;
    Ok(match &layer.op {
        Op::Conv2d {
            c_in,
            c_out,
            kernel,
            stride,
            padding,
            bias,
        } => {
            let h = match conv_blocked(h, *c_in, *kernel, autocast) {
                Some(isa) if h.rank() == 4 => direct::layout::to_blocked(h, isa.lanes())?,
                _ => h.clone(),
            };
            if !bias {
                return Ok((conv((p, autocast), name, &h, *stride, *padding)?, 1));
            }
            let bias_t = param(p, &format!("{name}.bias"))?;
            if let (5, Some(isa)) = (h.rank(), direct::active()) {
                // Under bf16 autocast the convolution's sums stay f32 and the bias is added before
                // the one rounding, as autocast's convolution with a bias does.
                let w = param(p, &format!("{name}.weight"))?;
                let geometry = (*stride, *padding);
                let rounded = direct::Rounded::NONE;
                let y = blocked_conv_sums((isa, autocast), &h, w, geometry, rounded)?;
                if then_relu {
                    let (y, pooled) = blocked_bias_relu(autocast, &y, bias_t, then_pool)?;
                    (y, if pooled { 3 } else { 2 })
                } else {
                    let y = direct::layout::from_blocked(&y, *c_out)?;
                    let y = fused::add_channel_bias(&y, &autocast.round(bias_t)?)?;
                    (autocast.round(&y)?, 1)
                }
            } else if then_relu {
                let w = param(p, &format!("{name}.weight"))?;
                (
                    autocast.conv2d_bias_relu(&h, w, bias_t, *stride, *padding)?,
                    2,
                )
            } else if autocast.bf16 {
                let w = param(p, &format!("{name}.weight"))?;
                (autocast.conv2d_bias(&h, w, bias_t, *stride, *padding)?, 1)
            } else {
                let y = conv((p, autocast), name, &h, *stride, *padding)?;
                (fused::add_channel_bias(&y, bias_t)?, 1)
            }
        }
        Op::BatchNorm2d { eps, momentum, .. } => {
            let then = if then_relu { Then::Relu } else { Then::Nothing };
            let bn = BnConst {
                eps: *eps,
                momentum: *momentum,
            };
            let mode = (pass.train, pass.sync_batchnorm);
            // BatchNorm1d's [N, C] or [N, C, L]: the same statistics over an [N, C, L, 1] view.
            let y = match h.dims().to_vec() {
                dims if dims.len() == 2 || dims.len() == 3 => {
                    let (n, c, l) = (dims[0], dims[1], dims.get(2).copied().unwrap_or(1));
                    let view = h.reshape((n, c, l, 1))?;
                    batch_norm_with(p, b, (name, &view), mode, (then, BnOf::F32), bn)?
                        .reshape(dims)?
                }
                _ => batch_norm_with(p, b, (name, h), mode, (then, BnOf::F32), bn)?,
            };
            (y, if then_relu { 2 } else { 1 })
        }
        Op::Relu => (fused::relu(h)?, 1),
        Op::Identity => (h.clone(), 1),
        Op::Sequential(inner) => (run(inner, p, b, h, pass)?, 1),
        Op::Residual { body, shortcut } => {
            let out = run(body, p, b, h, pass)?;
            let identity = match shortcut {
                Some(s) => run(s, p, b, h, pass)?,
                None => h.clone(),
            };
            let (out, identity) = if out.rank() == identity.rank() {
                (out, identity)
            } else {
                let c = layer.output[0];
                (planar(&out, c)?, planar(&identity, c)?)
            };
            if then_relu {
                (fused::add_relu(&out, &identity)?, 2)
            } else {
                ((out + identity)?, 1)
            }
        }
        Op::MaxPool2d {
            kernel,
            stride,
            padding,
        } => {
            if h.rank() == 5 && (*kernel, *stride, *padding) == (2, 2, 0) {
                return Ok((direct::elementwise::max_pool2(h)?, 1));
            }
            let h = planar(h, channels)?;
            if super::kernels::cpu::is_cpu_f32(&h) {
                (fused::max_pool2d(&h, *kernel, *stride, *padding)?, 1)
            } else if *padding == 0 {
                (h.max_pool2d_with_stride(*kernel, *stride)?, 1)
            } else {
                candle_core::bail!("{name}: a padded MaxPool2d runs on the CPU in f32 only");
            }
        }
        Op::AvgPool2d { kernel, stride } => (
            planar(h, channels)?.avg_pool2d_with_stride(*kernel, *stride)?,
            1,
        ),
        Op::GlobalAvgPool => {
            // Over W, then H: the order the built-in models' heads take the mean in.
            let h = planar(h, channels)?;
            (h.mean_keepdim(D::Minus1)?.mean_keepdim(D::Minus2)?, 1)
        }
        Op::Flatten => {
            let h = planar(h, channels)?;
            let mut dims = vec![h.dim(0)?];
            dims.extend_from_slice(&layer.output);
            (h.reshape(dims)?, 1)
        }
        Op::Linear { bias, .. } => {
            let h = planar(h, channels)?;
            let w = param(p, &format!("{name}.weight"))?;
            if *bias {
                let bias_t = param(p, &format!("{name}.bias"))?;
                (autocast.linear(&h, w, bias_t)?, 1)
            } else {
                (autocast.matmul(&h, &w.t()?)?, 1)
            }
        }
        Op::Dropout { p: prob } => (dropout(&planar(h, channels)?, *prob, pass)?, 1),
        Op::LayerNorm { eps, .. } => (layer_norm_eps(p, name, &planar(h, channels)?, *eps)?, 1),
        Op::Gelu { tanh } => {
            let h = planar(h, channels)?;
            if *tanh {
                (h.gelu()?, 1)
            } else {
                (gelu_erf(&h)?, 1)
            }
        }
        Op::Silu => (planar(h, channels)?.silu()?, 1),
    })
}
