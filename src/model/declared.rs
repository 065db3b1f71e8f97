//! A declared model (`model.name: declared`, read by `schema::declared`) sized for the data: every layer's
//! input and output shapes inferred from the images (`in_channels`/`in_features` may be left out, as
//! `LazyConv2d`/`LazyLinear` do), every mismatch refused before training with the layer's config key, its
//! module name, the place it was set and the shapes. Parameters are named as PyTorch's `nn.Sequential` of
//! the same layers names them (`0.weight`, `3.0.body.1.running_mean`; a `Residual` holds `body` and
//! `shortcut`), so a checkpoint loads into that `nn.Sequential` in PyTorch.

use super::spec::{Init, ParamSpec};
use crate::schema::declared::DeclaredSpec;

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

mod sizing;
use sizing::{shape, size_list};

#[cfg(test)]
mod tests;
