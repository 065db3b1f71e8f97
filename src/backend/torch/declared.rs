//! Declared models (`model::declared`) on libtorch: the layer list run in order with libtorch's ops, the
//! parameters under `nn.Sequential`'s names. ReLU after a layer that made a fresh tensor (Conv2d,
//! BatchNorm2d, Linear, a Residual's sum) runs in place, as torchvision's `ReLU(inplace=True)` does.

use super::ops::{add_, batch_norm_with, drop, get, relu_, Named, Norm};
use crate::model::declared::{Declared, Layer, Op};
use crate::platform::rng::Rng;
use tch::{Kind, Tensor};

/// Stage `k` of a declared model (the same cut as on Candle).
pub(super) fn stage(
    net: &Declared,
    k: usize,
    p: &Named,
    b: &mut Named,
    x: &Tensor,
    mode: (Norm, bool),
    rng: &mut Rng,
) -> anyhow::Result<Tensor> {
    run(net.stage(k), p, b, x, mode, rng)
}

fn run(
    layers: &[Layer],
    p: &Named,
    b: &mut Named,
    x: &Tensor,
    mode: (Norm, bool),
    rng: &mut Rng,
) -> anyhow::Result<Tensor> {
    let mut h = x.shallow_clone();
    let mut fresh = false;
    for layer in layers {
        let (out, made) = step(layer, fresh, p, b, &h, mode, rng)?;
        h = out;
        fresh = made;
    }
    Ok(h)
}

/// One layer on `h` (`fresh`: `h` is a tensor nothing else holds, which ReLU may overwrite). Returns its
/// output and whether that one is fresh.
fn step(
    layer: &Layer,
    fresh: bool,
    p: &Named,
    b: &mut Named,
    h: &Tensor,
    (norm, train): (Norm, bool),
    rng: &mut Rng,
) -> anyhow::Result<(Tensor, bool)> {
    let name = layer.name.as_str();
    let weight = || get(p, &format!("{name}.weight"));
    let bias = |on: bool| -> anyhow::Result<Option<&Tensor>> {
        Ok(if on {
            Some(get(p, &format!("{name}.bias"))?)
        } else {
            None
        })
    };
    let mean_last = |t: &Tensor| t.f_mean_dim(Some([-1i64].as_slice()), true, None::<Kind>);
    Ok(match &layer.op {
        Op::Conv2d {
            stride,
            padding,
            bias: with_bias,
            ..
        } => {
            let (s, pad) = (*stride as i64, *padding as i64);
            (
                h.f_conv2d(weight()?, bias(*with_bias)?, [s, s], [pad, pad], [1, 1], 1)?,
                true,
            )
        }
        Op::BatchNorm2d { eps, momentum, .. } => (
            batch_norm_with(p, b, (name, h), norm, (*eps, *momentum))?,
            true,
        ),
        Op::Relu if fresh => (relu_(h.shallow_clone())?, true),
        Op::Relu => (h.f_relu()?, true),
        Op::Identity => (h.shallow_clone(), fresh),
        Op::Sequential(inner) => (run(inner, p, b, h, (norm, train), rng)?, false),
        Op::Residual { body, shortcut } => {
            let out = run(body, p, b, h, (norm, train), rng)?;
            let identity = match shortcut {
                Some(s) => run(s, p, b, h, (norm, train), rng)?,
                None => h.shallow_clone(),
            };
            // Summing into the body's output in place is torchvision's `out += identity`, when that
            // output came from an op whose backward does not read it (a BatchNorm, Conv2d or Linear).
            let last = body.last().map(|l| &l.op);
            let overwritable = matches!(
                last,
                Some(Op::BatchNorm2d { .. } | Op::Conv2d { .. } | Op::Linear { .. })
            );
            if overwritable {
                (add_(out, &identity)?, true)
            } else {
                (out.f_add(&identity)?, true)
            }
        }
        Op::MaxPool2d {
            kernel,
            stride,
            padding,
        } => {
            let (k, s, pad) = (*kernel as i64, *stride as i64, *padding as i64);
            (
                h.f_max_pool2d([k, k], [s, s], [pad, pad], [1, 1], false)?,
                true,
            )
        }
        Op::AvgPool2d { kernel, stride } => {
            let (k, s) = (*kernel as i64, *stride as i64);
            (
                h.f_avg_pool2d([k, k], [s, s], [0, 0], false, true, None)?,
                true,
            )
        }
        Op::GlobalAvgPool => {
            // Over W, then H: the order the built-in models' heads take the mean in.
            let w = mean_last(h)?;
            (
                w.f_mean_dim(Some([-2i64].as_slice()), true, None::<Kind>)?,
                true,
            )
        }
        Op::Flatten => {
            let mut dims = vec![h.size()[0]];
            dims.extend(layer.output.iter().map(|&d| d as i64));
            (h.f_reshape(dims)?, false)
        }
        Op::Linear {
            bias: with_bias, ..
        } => (h.f_linear(weight()?, bias(*with_bias)?)?, true),
        Op::Dropout { p: prob } => (drop(h, *prob, train, rng)?, false),
        Op::LayerNorm { features, eps } => (
            h.f_layer_norm(
                [*features as i64],
                Some(weight()?),
                Some(get(p, &format!("{name}.bias"))?),
                *eps,
                false,
            )?,
            true,
        ),
        Op::Gelu { tanh } => (h.f_gelu(if *tanh { "tanh" } else { "none" })?, false),
        Op::Silu => (h.f_silu()?, false),
    })
}
