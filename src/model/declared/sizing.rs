//! Sizing a declared layer list for its input: each layer's output shape from its input's, the sizes left
//! out (`in_channels`, `in_features`, `num_features`) taken from the input, and every mismatch refused with
//! the layer's key, its module name, the shapes and a fix.

use super::{Layer, Op};
use crate::schema::declared::{LayerDecl, LayerKind};

pub(super) fn shape(s: &[usize]) -> String {
    format!("{s:?}")
}

/// Size a list of layers named `<prefix><index>`; returns them and the list's output shape.
pub(super) fn size_list(
    decls: &[LayerDecl],
    prefix: &str,
    input: &[usize],
) -> anyhow::Result<(Vec<Layer>, Vec<usize>)> {
    let mut layers = Vec::with_capacity(decls.len());
    let mut shape = input.to_vec();
    for (i, decl) in decls.iter().enumerate() {
        let layer = size(decl, &format!("{prefix}{i}"), &shape)?;
        shape = layer.output.clone();
        layers.push(layer);
    }
    Ok((layers, shape))
}

fn kind_name(kind: &LayerKind) -> &'static str {
    match kind {
        LayerKind::Conv2d { .. } => "Conv2d",
        LayerKind::BatchNorm2d { .. } => "BatchNorm2d",
        LayerKind::BatchNorm1d { .. } => "BatchNorm1d",
        LayerKind::ReLU => "ReLU",
        LayerKind::GELU { .. } => "GELU",
        LayerKind::SiLU => "SiLU",
        LayerKind::Identity => "Identity",
        LayerKind::MaxPool2d { .. } => "MaxPool2d",
        LayerKind::AvgPool2d { .. } => "AvgPool2d",
        LayerKind::AdaptiveAvgPool2d { .. } => "AdaptiveAvgPool2d",
        LayerKind::Flatten { .. } => "Flatten",
        LayerKind::Linear { .. } => "Linear",
        LayerKind::Dropout { .. } => "Dropout",
        LayerKind::LayerNorm { .. } => "LayerNorm",
        LayerKind::Sequential(_) => "Sequential",
        LayerKind::Residual { .. } => "Residual",
    }
}

/// One layer sized for a per-sample `input`.
fn size(decl: &LayerDecl, name: &str, input: &[usize]) -> anyhow::Result<Layer> {
    let at = At { decl, name, input };
    let same = |op: Op| Ok((op, input.to_vec()));
    let (op, output) = match &decl.kind {
        LayerKind::ReLU => same(Op::Relu),
        LayerKind::GELU { tanh } => same(Op::Gelu { tanh: *tanh }),
        LayerKind::SiLU => same(Op::Silu),
        LayerKind::Identity => same(Op::Identity),
        LayerKind::Dropout { p } => same(Op::Dropout { p: *p }),
        LayerKind::Conv2d { .. }
        | LayerKind::BatchNorm2d { .. }
        | LayerKind::MaxPool2d { .. }
        | LayerKind::AvgPool2d { .. }
        | LayerKind::AdaptiveAvgPool2d { .. } => at.image_layer(),
        LayerKind::Flatten { .. }
        | LayerKind::Linear { .. }
        | LayerKind::LayerNorm { .. }
        | LayerKind::BatchNorm1d { .. } => at.feature_layer(),
        LayerKind::Sequential(_) | LayerKind::Residual { .. } => at.structure(),
    }?;
    if output.contains(&0) {
        return Err(at.fail(format!("its output {} is empty", shape(&output))));
    }
    Ok(Layer {
        name: name.to_string(),
        op,
        input: input.to_vec(),
        output,
    })
}

/// The layer being sized, for its errors.
struct At<'a> {
    decl: &'a LayerDecl,
    name: &'a str,
    input: &'a [usize],
}

type Sized = anyhow::Result<(Op, Vec<usize>)>;

impl At<'_> {
    fn fail(&self, msg: String) -> anyhow::Error {
        anyhow::anyhow!(
            "Error in model layer '{}' ({} '{}' of the nn.Sequential, input {} per image): {msg}{}",
            self.decl.key,
            kind_name(&self.decl.kind),
            self.name,
            shape(self.input),
            self.decl.origin
        )
    }

    /// The input as an image (channels, height, width).
    fn image(&self) -> anyhow::Result<(usize, usize, usize)> {
        match self.input {
            [c, h, w] => Ok((*c, *h, *w)),
            _ => Err(self.fail(format!(
                "{} takes images [C, H, W], not {}: put it before the Flatten",
                kind_name(&self.decl.kind),
                shape(self.input)
            ))),
        }
    }

    /// The output size of a `k`x`k` window with stride `s` and padding `p` over an `h`x`w` input.
    fn window(
        &self,
        (h, w): (usize, usize),
        k: usize,
        s: usize,
        p: usize,
    ) -> anyhow::Result<(usize, usize)> {
        if s == 0 {
            return Err(self.fail("stride must be at least 1".into()));
        }
        if h + 2 * p < k || w + 2 * p < k {
            return Err(self.fail(format!(
                "the {k}x{k} window does not fit a {h}x{w} input with padding {p}"
            )));
        }
        Ok(((h + 2 * p - k) / s + 1, (w + 2 * p - k) / s + 1))
    }

    /// BatchNorm over `c` channels (or features), `num_features` checked against them; the shape is kept.
    fn batch_norm(
        &self,
        (num_features, c, unit): (Option<usize>, usize, &str),
        eps: f64,
        momentum: f64,
    ) -> Sized {
        if let Some(given) = num_features.filter(|&n| n != c) {
            return Err(self.fail(format!(
                "num_features is {given} but its input has {c} {unit}: set num_features={c}, or leave it out"
            )));
        }
        let op = Op::BatchNorm2d {
            channels: c,
            eps,
            momentum,
        };
        Ok((op, self.input.to_vec()))
    }

    /// Layers over images: convolution, BatchNorm, pooling.
    fn image_layer(&self) -> Sized {
        let (c, h, w) = self.image()?;
        match &self.decl.kind {
            LayerKind::Conv2d {
                in_channels,
                out_channels,
                kernel_size,
                stride,
                padding,
                bias,
            } => {
                if let Some(given) = in_channels.filter(|&i| i != c) {
                    return Err(self.fail(format!(
                        "in_channels is {given} but its input has {c} channels: set in_channels={c}, or \
                         leave it out to infer it"
                    )));
                }
                if *kernel_size == 0 || *out_channels == 0 {
                    return Err(self.fail("kernel_size and out_channels must be at least 1".into()));
                }
                let (oh, ow) = self.window((h, w), *kernel_size, *stride, *padding)?;
                let op = Op::Conv2d {
                    c_in: c,
                    c_out: *out_channels,
                    kernel: *kernel_size,
                    stride: *stride,
                    padding: *padding,
                    bias: *bias,
                };
                Ok((op, vec![*out_channels, oh, ow]))
            }
            LayerKind::BatchNorm2d {
                num_features,
                eps,
                momentum,
            } => self.batch_norm((*num_features, c, "channels"), *eps, *momentum),
            LayerKind::MaxPool2d {
                kernel_size,
                stride,
                padding,
            } => {
                if 2 * padding > *kernel_size {
                    return Err(self.fail(format!(
                        "padding {padding} is more than half the {kernel_size}x{kernel_size} window \
                         (PyTorch refuses it too)"
                    )));
                }
                let (oh, ow) = self.window((h, w), *kernel_size, *stride, *padding)?;
                let op = Op::MaxPool2d {
                    kernel: *kernel_size,
                    stride: *stride,
                    padding: *padding,
                };
                Ok((op, vec![c, oh, ow]))
            }
            LayerKind::AvgPool2d {
                kernel_size,
                stride,
            } => {
                if stride != kernel_size {
                    return Err(self.fail(format!(
                        "stride {stride} differs from the {kernel_size}x{kernel_size} window: declared \
                         models pool in disjoint windows (stride = kernel_size)"
                    )));
                }
                let (oh, ow) = self.window((h, w), *kernel_size, *stride, 0)?;
                let op = Op::AvgPool2d {
                    kernel: *kernel_size,
                    stride: *stride,
                };
                Ok((op, vec![c, oh, ow]))
            }
            LayerKind::AdaptiveAvgPool2d { output_size: out } => match *out {
                1 => Ok((Op::GlobalAvgPool, vec![c, 1, 1])),
                out if out > 0 && h % out == 0 && w % out == 0 && h == w => {
                    let k = h / out;
                    Ok((Op::AvgPool2d { kernel: k, stride: k }, vec![c, out, out]))
                }
                out => Err(self.fail(format!(
                    "output_size {out} does not divide the {h}x{w} input evenly (declared models pool in \
                     equal windows): use 1, or a divisor of {h}"
                ))),
            },
            _ => unreachable!("image_layer is called for image layers"),
        }
    }

    /// Layers over features: Flatten, Linear, LayerNorm.
    fn feature_layer(&self) -> Sized {
        let input = self.input;
        match &self.decl.kind {
            // The same statistics as BatchNorm2d's, per channel over the batch (and the length): the
            // engines run it as BatchNorm2d over a [N, C, L, 1] view.
            LayerKind::BatchNorm1d {
                num_features,
                eps,
                momentum,
            } => {
                let c = match input {
                    [c] | [c, _] => *c,
                    _ => {
                        return Err(self.fail(format!(
                        "BatchNorm1d takes [features] or [channels, length] inputs, not {}: use \
                             BatchNorm2d for images",
                        shape(input)
                    )))
                    }
                };
                self.batch_norm((*num_features, c, "features"), *eps, *momentum)
            }
            LayerKind::Flatten { start_dim, end_dim } => {
                // torch's dims count the batch: dim 0 is the batch, dims 1.. the sample's.
                let rank = input.len() as i64 + 1;
                let norm = |d: i64| if d < 0 { d + rank } else { d };
                let (s, e) = (norm(*start_dim), norm(*end_dim));
                if s < 1 || e >= rank || s > e {
                    return Err(self.fail(format!(
                        "Flatten(start_dim={start_dim}, end_dim={end_dim}) must keep the batch dimension \
                         and name dimensions of a {rank}-d batch: use start_dim=1"
                    )));
                }
                let (s, e) = (s as usize - 1, e as usize - 1);
                let mut out = input[..s].to_vec();
                out.push(input[s..=e].iter().product());
                out.extend_from_slice(&input[e + 1..]);
                Ok((Op::Flatten, out))
            }
            LayerKind::Linear {
                in_features,
                out_features,
                bias,
            } => {
                let [features] = input else {
                    return Err(self.fail(format!(
                        "Linear takes a flat [features] input here, not {}: put a Flatten before it",
                        shape(input)
                    )));
                };
                if let Some(given) = in_features.filter(|i| i != features) {
                    return Err(self.fail(format!(
                        "in_features is {given} but its input has {features} features: set \
                         in_features={features}, or leave it out to infer it"
                    )));
                }
                let op = Op::Linear {
                    c_in: *features,
                    c_out: *out_features,
                    bias: *bias,
                };
                Ok((op, vec![*out_features]))
            }
            LayerKind::LayerNorm {
                normalized_shape,
                eps,
            } => {
                let last = *input.last().unwrap_or(&0);
                if let Some(given) = normalized_shape.filter(|&n| n != last) {
                    return Err(self.fail(format!(
                        "normalized_shape is {given} but its input's last dimension is {last}"
                    )));
                }
                let op = Op::LayerNorm {
                    features: last,
                    eps: *eps,
                };
                Ok((op, input.to_vec()))
            }
            _ => unreachable!("feature_layer is called for feature layers"),
        }
    }

    /// `Sequential` and `Residual`: their layers sized in turn, under their module names.
    fn structure(&self) -> Sized {
        let (name, input) = (self.name, self.input);
        match &self.decl.kind {
            LayerKind::Sequential(inner) => {
                let (layers, out) = size_list(inner, &format!("{name}."), input)?;
                Ok((Op::Sequential(layers), out))
            }
            LayerKind::Residual { body, shortcut } => {
                let (body, out) = size_list(body, &format!("{name}.body."), input)?;
                let (shortcut, short_out) = match shortcut {
                    Some(s) => {
                        let (layers, out) = size_list(s, &format!("{name}.shortcut."), input)?;
                        (Some(layers), out)
                    }
                    None => (None, input.to_vec()),
                };
                if out != short_out {
                    let hint = if shortcut.is_none() {
                        " (give the block a shortcut, e.g. a 1x1 Conv2d with the body's stride and a \
                         BatchNorm2d)"
                    } else {
                        ""
                    };
                    return Err(self.fail(format!(
                        "its body gives {} but its shortcut gives {}: they are added, so they must \
                         agree{hint}",
                        shape(&out),
                        shape(&short_out),
                    )));
                }
                Ok((Op::Residual { body, shortcut }, out))
            }
            _ => unreachable!("structure is called for Sequential and Residual"),
        }
    }
}
