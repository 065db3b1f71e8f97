//! A declared model (`model.name: declared`, read by `schema::declared`) sized for the data: every layer's
//! input and output shapes inferred from the images (`in_channels`/`in_features` may be left out, as
//! `LazyConv2d`/`LazyLinear` do), every mismatch refused before training with the layer's config key, its
//! module name, the place it was set and the shapes. Parameters are named as PyTorch's `nn.Sequential` of
//! the same layers names them (`0.weight`, `3.0.body.1.running_mean`; a `Residual` holds `body` and
//! `shortcut`), so a checkpoint loads into that `nn.Sequential` in PyTorch.

use super::spec::{Init, ParamSpec};
use crate::schema::declared::{DeclaredSpec, LayerDecl, LayerKind};

/// A layer sized for its input: what it computes, its module name and its per-sample shapes.
#[derive(Debug, Clone, PartialEq)]
pub struct Layer {
    /// PyTorch's module path (`3.0.body.0`): its parameters are `<name>.weight`, ...
    pub name: String,
    pub op: Op,
    /// Per-sample input shape ([C, H, W] or [features]).
    pub input: Vec<usize>,
    pub output: Vec<usize>,
}

/// What a layer computes, every size known.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Conv2d {
        c_in: usize,
        c_out: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
        bias: bool,
    },
    BatchNorm2d {
        channels: usize,
        eps: f64,
        momentum: f64,
    },
    Relu,
    Gelu {
        tanh: bool,
    },
    Silu,
    Identity,
    MaxPool2d {
        kernel: usize,
        stride: usize,
        padding: usize,
    },
    /// Also `AdaptiveAvgPool2d` (its window, which divides the input evenly).
    AvgPool2d {
        kernel: usize,
        stride: usize,
    },
    /// `AdaptiveAvgPool2d(1)`: the mean over each channel's pixels, keeping (C, 1, 1).
    GlobalAvgPool,
    Flatten,
    Linear {
        c_in: usize,
        c_out: usize,
        bias: bool,
    },
    Dropout {
        p: f64,
    },
    LayerNorm {
        features: usize,
        eps: f64,
    },
    Sequential(Vec<Layer>),
    Residual {
        body: Vec<Layer>,
        shortcut: Option<Vec<Layer>>,
    },
}

/// A declared network sized for `[channels, size, size]` images.
#[derive(Debug, Clone)]
pub struct Declared {
    pub layers: Vec<Layer>,
    /// The top-level layers of each stage (FSDP unit), in order.
    stages: Vec<std::ops::Range<usize>>,
}

impl Declared {
    /// Size `spec` for `channels`-channel `image_size` inputs; its output must be `classes` logits.
    pub fn new(
        spec: &DeclaredSpec,
        channels: usize,
        image_size: usize,
        classes: usize,
    ) -> anyhow::Result<Self> {
        let input = vec![channels, image_size, image_size];
        let (layers, output) = size_list(&spec.layers, "", &input)?;
        if output != [classes] {
            let last = spec.layers.last().expect("parse refuses an empty model");
            anyhow::bail!(
                "Error in model layer '{}': the model gives {} per image, but model.num_classes is {classes}: \
                 end with a Linear whose out_features is ${{model.num_classes}} (after a Flatten){}",
                last.key,
                shape(&output),
                last.origin
            );
        }
        let stages = stage_ranges(&layers);
        Ok(Declared { layers, stages })
    }

    /// Trainable parameters in the order PyTorch's `parameters()` yields them.
    pub fn specs(&self) -> Vec<ParamSpec> {
        let mut out = Vec::new();
        for layer in &self.layers {
            layer.visit(&mut |l| l.push_specs(&mut out));
        }
        out
    }

    /// BatchNorm running statistics with their starting values (name, shape, value).
    pub fn buffers(&self) -> Vec<(String, Vec<usize>, f32)> {
        let mut out = Vec::new();
        for layer in &self.layers {
            layer.visit(&mut |l| {
                if let Op::BatchNorm2d { channels, .. } = l.op {
                    out.push((format!("{}.running_mean", l.name), vec![channels], 0.0));
                    out.push((format!("{}.running_var", l.name), vec![channels], 1.0));
                    out.push((format!("{}.num_batches_tracked", l.name), vec![], 0.0));
                }
            });
        }
        out
    }

    /// The stages by their top-level module names: a new stage at each top-level layer with parameters,
    /// except a BatchNorm/LayerNorm right after one (it normalises that layer's output); layers without
    /// parameters join the stage before them, so a Conv2d-BatchNorm2d-ReLU run is one unit.
    pub fn stages(&self) -> Vec<Vec<String>> {
        self.stages
            .iter()
            .map(|r| r.clone().map(|i| self.layers[i].name.clone()).collect())
            .collect()
    }

    /// The top-level layers of stage `k`.
    pub fn stage(&self, k: usize) -> &[Layer] {
        &self.layers[self.stages[k].clone()]
    }

    /// The module name of the last layer with parameters: the classifier head, left as initialised when
    /// pretrained weights for another `num_classes` are loaded.
    pub fn head(&self) -> Option<String> {
        let mut head = None;
        for layer in &self.layers {
            layer.visit(&mut |l| {
                if matches!(l.op, Op::Linear { .. } | Op::Conv2d { .. }) {
                    head = Some(l.name.clone());
                }
            });
        }
        head
    }
}

impl Layer {
    /// This layer, then every layer inside it, in PyTorch's module order.
    pub fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Layer)) {
        f(self);
        match &self.op {
            Op::Sequential(inner) => inner.iter().for_each(|l| l.visit(f)),
            Op::Residual { body, shortcut } => {
                body.iter().for_each(|l| l.visit(f));
                shortcut.iter().flatten().for_each(|l| l.visit(f));
            }
            _ => {}
        }
    }

    /// Does this layer (or anything inside it) hold parameters?
    pub fn has_params(&self) -> bool {
        let mut any = false;
        self.visit(&mut |l| {
            any |= matches!(
                l.op,
                Op::Conv2d { .. }
                    | Op::BatchNorm2d { .. }
                    | Op::Linear { .. }
                    | Op::LayerNorm { .. }
            )
        });
        any
    }

    fn push_specs(&self, out: &mut Vec<ParamSpec>) {
        let n = &self.name;
        let param = |name: String, shape: Vec<usize>, fan_in: usize, init: Init| ParamSpec {
            name,
            shape,
            fan_in,
            init,
        };
        match self.op {
            Op::Conv2d {
                c_in,
                c_out,
                kernel,
                bias,
                ..
            } => {
                let fan_in = c_in * kernel * kernel;
                out.push(param(
                    format!("{n}.weight"),
                    vec![c_out, c_in, kernel, kernel],
                    fan_in,
                    Init::Default,
                ));
                if bias {
                    out.push(param(
                        format!("{n}.bias"),
                        vec![c_out],
                        fan_in,
                        Init::Default,
                    ));
                }
            }
            Op::Linear { c_in, c_out, bias } => {
                out.push(param(
                    format!("{n}.weight"),
                    vec![c_out, c_in],
                    c_in,
                    Init::Default,
                ));
                if bias {
                    out.push(param(format!("{n}.bias"), vec![c_out], c_in, Init::Default));
                }
            }
            Op::BatchNorm2d { channels: c, .. } | Op::LayerNorm { features: c, .. } => {
                out.push(param(
                    format!("{n}.weight"),
                    vec![c],
                    c,
                    Init::Constant(1.0),
                ));
                out.push(param(format!("{n}.bias"), vec![c], c, Init::Constant(0.0)));
            }
            _ => {}
        }
    }
}

fn stage_ranges(layers: &[Layer]) -> Vec<std::ops::Range<usize>> {
    let mut stages: Vec<std::ops::Range<usize>> = Vec::new();
    let mut stage_has_params = false;
    for (i, layer) in layers.iter().enumerate() {
        let joins_previous = match &layer.op {
            _ if stages.is_empty() => false,
            Op::BatchNorm2d { .. } | Op::LayerNorm { .. } => stage_has_params,
            _ => !layer.has_params(),
        };
        if joins_previous {
            stages.last_mut().expect("not empty").end = i + 1;
        } else {
            stages.push(i..i + 1);
            stage_has_params = false;
        }
        stage_has_params |= layer.has_params();
    }
    stages
}

fn shape(s: &[usize]) -> String {
    format!("{s:?}")
}

/// Size a list of layers named `<prefix><index>`; returns them and the list's output shape.
fn size_list(
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
    let fail = |msg: String| {
        anyhow::anyhow!(
            "Error in model layer '{}' ({} '{name}' of the nn.Sequential, input {} per image): {msg}{}",
            decl.key,
            kind_name(&decl.kind),
            shape(input),
            decl.origin
        )
    };
    let image = |what: &str| -> anyhow::Result<(usize, usize, usize)> {
        match input {
            [c, h, w] => Ok((*c, *h, *w)),
            _ => Err(fail(format!(
                "{what} takes images [C, H, W], not {}: put it before the Flatten",
                shape(input)
            ))),
        }
    };
    let window =
        |h: usize, w: usize, k: usize, s: usize, p: usize| -> anyhow::Result<(usize, usize)> {
            if s == 0 {
                return Err(fail("stride must be at least 1".into()));
            }
            if h + 2 * p < k || w + 2 * p < k {
                return Err(fail(format!(
                    "the {k}x{k} window does not fit a {h}x{w} input with padding {p}"
                )));
            }
            Ok(((h + 2 * p - k) / s + 1, (w + 2 * p - k) / s + 1))
        };
    let same = |op: Op| (op, input.to_vec());
    let (op, output) = match &decl.kind {
        LayerKind::Conv2d {
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            bias,
        } => {
            let (c, h, w) = image("Conv2d")?;
            if let Some(given) = in_channels.filter(|&i| i != c) {
                return Err(fail(format!(
                    "in_channels is {given} but its input has {c} channels: set in_channels={c}, or leave \
                     it out to infer it"
                )));
            }
            if *kernel_size == 0 || *out_channels == 0 {
                return Err(fail(
                    "kernel_size and out_channels must be at least 1".into(),
                ));
            }
            let (oh, ow) = window(h, w, *kernel_size, *stride, *padding)?;
            (
                Op::Conv2d {
                    c_in: c,
                    c_out: *out_channels,
                    kernel: *kernel_size,
                    stride: *stride,
                    padding: *padding,
                    bias: *bias,
                },
                vec![*out_channels, oh, ow],
            )
        }
        LayerKind::BatchNorm2d {
            num_features,
            eps,
            momentum,
        } => {
            let (c, ..) = image("BatchNorm2d")?;
            if let Some(given) = num_features.filter(|&n| n != c) {
                return Err(fail(format!(
                    "num_features is {given} but its input has {c} channels: set num_features={c}, or \
                     leave it out"
                )));
            }
            same(Op::BatchNorm2d {
                channels: c,
                eps: *eps,
                momentum: *momentum,
            })
        }
        LayerKind::ReLU => same(Op::Relu),
        LayerKind::GELU { tanh } => same(Op::Gelu { tanh: *tanh }),
        LayerKind::SiLU => same(Op::Silu),
        LayerKind::Identity => same(Op::Identity),
        LayerKind::Dropout { p } => same(Op::Dropout { p: *p }),
        LayerKind::MaxPool2d {
            kernel_size,
            stride,
            padding,
        } => {
            let (c, h, w) = image("MaxPool2d")?;
            if 2 * padding > *kernel_size {
                return Err(fail(format!(
                    "padding {padding} is more than half the {kernel_size}x{kernel_size} window (PyTorch \
                     refuses it too)"
                )));
            }
            let (oh, ow) = window(h, w, *kernel_size, *stride, *padding)?;
            (
                Op::MaxPool2d {
                    kernel: *kernel_size,
                    stride: *stride,
                    padding: *padding,
                },
                vec![c, oh, ow],
            )
        }
        LayerKind::AvgPool2d {
            kernel_size,
            stride,
        } => {
            let (c, h, w) = image("AvgPool2d")?;
            if stride != kernel_size {
                return Err(fail(format!(
                    "stride {stride} differs from the {kernel_size}x{kernel_size} window: declared models \
                     pool in disjoint windows (stride = kernel_size)"
                )));
            }
            let (oh, ow) = window(h, w, *kernel_size, *stride, 0)?;
            (
                Op::AvgPool2d {
                    kernel: *kernel_size,
                    stride: *stride,
                },
                vec![c, oh, ow],
            )
        }
        LayerKind::AdaptiveAvgPool2d { output_size } => {
            let (c, h, w) = image("AdaptiveAvgPool2d")?;
            let out = *output_size;
            if out == 1 {
                (Op::GlobalAvgPool, vec![c, 1, 1])
            } else if out > 0 && h % out == 0 && w % out == 0 && h == w {
                let k = h / out;
                (
                    Op::AvgPool2d {
                        kernel: k,
                        stride: k,
                    },
                    vec![c, out, out],
                )
            } else {
                return Err(fail(format!(
                    "output_size {out} does not divide the {h}x{w} input evenly (declared models pool in \
                     equal windows): use 1, or a divisor of {h}"
                )));
            }
        }
        LayerKind::Flatten { start_dim, end_dim } => {
            // torch's dims count the batch: dim 0 is the batch, dims 1.. the sample's.
            let rank = input.len() as i64 + 1;
            let norm = |d: i64| if d < 0 { d + rank } else { d };
            let (s, e) = (norm(*start_dim), norm(*end_dim));
            if s < 1 || e >= rank || s > e {
                return Err(fail(format!(
                    "Flatten(start_dim={start_dim}, end_dim={end_dim}) must keep the batch dimension and \
                     name dimensions of a {rank}-d batch: use start_dim=1"
                )));
            }
            let (s, e) = (s as usize - 1, e as usize - 1);
            let mut out = input[..s].to_vec();
            out.push(input[s..=e].iter().product());
            out.extend_from_slice(&input[e + 1..]);
            (Op::Flatten, out)
        }
        LayerKind::Linear {
            in_features,
            out_features,
            bias,
        } => {
            let Some(&last) = input.last() else {
                return Err(fail("Linear needs an input with features".into()));
            };
            if input.len() != 1 {
                return Err(fail(format!(
                    "Linear takes a flat [features] input here, not {}: put a Flatten before it",
                    shape(input)
                )));
            }
            if let Some(given) = in_features.filter(|&i| i != last) {
                return Err(fail(format!(
                    "in_features is {given} but its input has {last} features: set in_features={last}, \
                     or leave it out to infer it"
                )));
            }
            (
                Op::Linear {
                    c_in: last,
                    c_out: *out_features,
                    bias: *bias,
                },
                vec![*out_features],
            )
        }
        LayerKind::LayerNorm {
            normalized_shape,
            eps,
        } => {
            let last = *input.last().unwrap_or(&0);
            if let Some(given) = normalized_shape.filter(|&n| n != last) {
                return Err(fail(format!(
                    "normalized_shape is {given} but its input's last dimension is {last}"
                )));
            }
            same(Op::LayerNorm {
                features: last,
                eps: *eps,
            })
        }
        LayerKind::Sequential(inner) => {
            let (layers, out) = size_list(inner, &format!("{name}."), input)?;
            (Op::Sequential(layers), out)
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
                return Err(fail(format!(
                    "its body gives {} but its shortcut gives {}: they are added, so they must agree{}",
                    shape(&out),
                    shape(&short_out),
                    if shortcut.is_none() {
                        " (give the block a shortcut, e.g. a 1x1 Conv2d with the body's stride and a \
                         BatchNorm2d)"
                    } else {
                        ""
                    }
                )));
            }
            (Op::Residual { body, shortcut }, out)
        }
    };
    if output.contains(&0) {
        return Err(fail(format!("its output {} is empty", shape(&output))));
    }
    Ok(Layer {
        name: name.to_string(),
        op,
        input: input.to_vec(),
        output,
    })
}

#[cfg(test)]
mod tests;
