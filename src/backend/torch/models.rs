//! Forward passes of the model zoo on libtorch ops, over the same named parameters as the Candle models
//! (torchvision/timm names); the architectures' shapes come from the shared zoo descriptions.

use crate::comm::c10d::ProcessGroup;
use crate::comm::collective::Collective;
use crate::model::resnet::ResNet;
use crate::model::vit::Vit;
use crate::model::Architecture;
use crate::platform::rng::Rng;
use anyhow::Context;
use std::sync::Arc;
use tch::{Kind, Tensor};

use super::ops::{add_, batch_norm_with, drop, get, relu_, Named, Norm};

const BN_EPS: f64 = 1e-5;
const BN_MOMENTUM: f64 = 0.1;

/// The forward passes on libtorch, over `model::Architecture`'s stages.
pub struct Arch {
    pub arch: Architecture,
    /// SyncBatchNorm's group: libtorch's SyncBatchNorm reduces over it, so it must be a c10d group.
    pub sync_batchnorm: Option<Arc<dyn Collective>>,
}

impl Arch {
    /// How BatchNorm runs in this pass: training mode (with SyncBatchNorm's c10d group, when on), or
    /// evaluation with the running statistics.
    fn norm(&self, train: bool) -> anyhow::Result<Norm<'_>> {
        Ok(match (train, &self.sync_batchnorm) {
            (false, _) => Norm::Eval,
            (true, None) => Norm::Train(None),
            (true, Some(group)) => Norm::Train(Some(
                ProcessGroup::of(group.as_ref())
                    .context("SyncBatchNorm on backend=tch reduces over a c10d process group")?,
            )),
        })
    }

    /// The whole forward pass: the stages in order.
    pub fn forward(
        &self,
        p: &Named,
        b: &mut Named,
        x: &Tensor,
        train: bool,
        rng: &mut Rng,
    ) -> anyhow::Result<Tensor> {
        let mut h = x.shallow_clone();
        for k in 0..self.arch.stages().len() {
            h = self.forward_stage(k, p, b, &h, train, rng)?;
        }
        Ok(h)
    }

    /// Stage `k` of the forward pass (the same cut as the Candle models').
    pub fn forward_stage(
        &self,
        k: usize,
        p: &Named,
        b: &mut Named,
        x: &Tensor,
        train: bool,
        rng: &mut Rng,
    ) -> anyhow::Result<Tensor> {
        Ok(match &self.arch {
            Architecture::Mlp(mlp) => match k {
                0 => x.f_flatten(1, -1)?,
                k if k <= mlp.depth() => {
                    let h = linear(p, &format!("layers.{}", k - 1), x)?.f_relu()?;
                    drop(&h, mlp.dropout, train, rng)?
                }
                _ => linear(p, "head", x)?,
            },
            Architecture::Cnn(cnn) => match k {
                0 => x.shallow_clone(),
                k if k <= cnn.blocks() => {
                    let name = format!("blocks.{}.conv", k - 1);
                    let h = x
                        .f_conv2d(
                            get(p, &format!("{name}.weight"))?,
                            Some(get(p, &format!("{name}.bias"))?),
                            [1, 1],
                            [1, 1],
                            [1, 1],
                            1,
                        )?
                        .f_relu()?;
                    let s = h.size();
                    if s[2] >= 2 && s[3] >= 2 {
                        h.f_max_pool2d([2, 2], [2, 2], [0, 0], [1, 1], false)?
                    } else {
                        h
                    }
                }
                _ => {
                    let pooled = global_avg_pool(x)?;
                    linear(p, "head", &drop(&pooled, cnn.dropout, train, rng)?)?
                }
            },
            Architecture::ResNet(net) => resnet_stage(net, k, p, b, x, self.norm(train)?)?,
            Architecture::Vit(vit) => vit_stage(vit, k, p, x, train, rng)?,
            Architecture::Declared(net) => {
                super::declared::stage(net, k, p, b, x, (self.norm(train)?, train), rng)?
            }
            Architecture::Registered(m) => anyhow::bail!(
                "model _target_ {}: the engine runs a registered model's own forward pass, not stages",
                m.target
            ),
        })
    }
}

fn linear(p: &Named, prefix: &str, x: &Tensor) -> anyhow::Result<Tensor> {
    Ok(x.f_linear(
        get(p, &format!("{prefix}.weight"))?,
        Some(get(p, &format!("{prefix}.bias"))?),
    )?)
}

/// Mean over H then W, in the order the Candle models take it, in the activations' dtype.
pub(super) fn global_avg_pool(h: &Tensor) -> anyhow::Result<Tensor> {
    Ok(h.f_mean_dim(Some([-1i64].as_slice()), false, None::<Kind>)?
        .f_mean_dim(Some([-1i64].as_slice()), false, None::<Kind>)?)
}

fn conv(p: &Named, name: &str, x: &Tensor, stride: i64, padding: i64) -> anyhow::Result<Tensor> {
    Ok(x.f_conv2d::<Tensor>(
        get(p, &format!("{name}.weight"))?,
        None,
        [stride, stride],
        [padding, padding],
        [1, 1],
        1,
    )?)
}

/// BatchNorm2d through libtorch (running statistics updated in place in train mode, with PyTorch's
/// momentum and unbiased variance), counting batches as `nn.BatchNorm2d` does.
fn batch_norm(
    p: &Named,
    b: &mut Named,
    name: &str,
    x: &Tensor,
    norm: Norm,
) -> anyhow::Result<Tensor> {
    batch_norm_with(p, b, (name, x), norm, (BN_EPS, BN_MOMENTUM))
}

/// Stage `k` of torchvision's ResNet: 0 the stem, then each residual block, then the head.
fn resnet_stage(
    net: &ResNet,
    k: usize,
    p: &Named,
    b: &mut Named,
    x: &Tensor,
    norm: Norm,
) -> anyhow::Result<Tensor> {
    if k == 0 {
        let h = if net.cifar_stem() {
            conv(p, "conv1", x, 1, 1)?
        } else {
            conv(p, "conv1", x, 2, 3)?
        };
        let h = relu_(batch_norm(p, b, "bn1", &h, norm)?)?;
        return Ok(if net.cifar_stem() {
            h
        } else {
            h.f_max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false)?
        });
    }
    let layout = net.layout();
    let Some((name, c_in, width, stride)) = layout.get(k - 1) else {
        return linear(p, "fc", &global_avg_pool(x)?);
    };
    let (h, stride) = (x, *stride as i64);
    let c_out = width * net.expansion();
    let identity = if stride != 1 || *c_in != c_out {
        let d = conv(p, &format!("{name}.downsample.0"), h, stride, 0)?;
        batch_norm(p, b, &format!("{name}.downsample.1"), &d, norm)?
    } else {
        h.shallow_clone()
    };
    let out = if net.bottleneck() {
        let o = conv(p, &format!("{name}.conv1"), h, 1, 0)?;
        let o = relu_(batch_norm(p, b, &format!("{name}.bn1"), &o, norm)?)?;
        let o = conv(p, &format!("{name}.conv2"), &o, stride, 1)?;
        let o = relu_(batch_norm(p, b, &format!("{name}.bn2"), &o, norm)?)?;
        let o = conv(p, &format!("{name}.conv3"), &o, 1, 0)?;
        batch_norm(p, b, &format!("{name}.bn3"), &o, norm)?
    } else {
        let o = conv(p, &format!("{name}.conv1"), h, stride, 1)?;
        let o = relu_(batch_norm(p, b, &format!("{name}.bn1"), &o, norm)?)?;
        let o = conv(p, &format!("{name}.conv2"), &o, 1, 1)?;
        batch_norm(p, b, &format!("{name}.bn2"), &o, norm)?
    };
    relu_(add_(out, &identity)?)
}

const LN_EPS: f64 = 1e-6;

fn layer_norm(p: &Named, name: &str, x: &Tensor, dim: i64) -> anyhow::Result<Tensor> {
    Ok(x.f_layer_norm(
        [dim],
        Some(get(p, &format!("{name}.weight"))?),
        Some(get(p, &format!("{name}.bias"))?),
        LN_EPS,
        false,
    )?)
}

/// timm's `Attention`: fused qkv projection, scaled dot-product softmax per head, output projection.
fn attention(p: &Named, name: &str, x: &Tensor, heads: i64) -> anyhow::Result<Tensor> {
    let s = x.size();
    let (b, n, d) = (s[0], s[1], s[2]);
    let hd = d / heads;
    let qkv = linear(p, &format!("{name}.qkv"), x)?
        .f_reshape([b, n, 3, heads, hd])?
        .f_permute([2, 0, 3, 1, 4])?;
    let (q, k, v) = (
        qkv.f_select(0, 0)?,
        qkv.f_select(0, 1)?,
        qkv.f_select(0, 2)?,
    );
    let scores = q
        .f_matmul(&k.f_transpose(-2, -1)?)?
        .f_mul_scalar(1.0 / (hd as f64).sqrt())?;
    let out = scores
        .f_softmax(-1, None::<Kind>)? // the input's dtype; autocast decides under mixed precision
        .f_matmul(&v)?
        .f_transpose(1, 2)?
        .f_reshape([b, n, d])?;
    linear(p, &format!("{name}.proj"), &out)
}

/// Stage `k` of timm's VisionTransformer (class token, learned position embedding, pre-norm blocks, token
/// pooling): 0 the embedding, then each block, then the head; dropout drawn in the Candle model's order.
fn vit_stage(
    vit: &Vit,
    k: usize,
    p: &Named,
    x: &Tensor,
    train: bool,
    rng: &mut Rng,
) -> anyhow::Result<Tensor> {
    let (depth, heads, dropout) = (vit.depth, vit.heads, vit.dropout);
    let (dim, patch) = (vit.dim as i64, vit.patch as i64);
    if k == 0 {
        let batch = x.size()[0];
        let patches = x.f_conv2d(
            get(p, "patch_embed.proj.weight")?,
            Some(get(p, "patch_embed.proj.bias")?),
            [patch, patch],
            [0, 0],
            [1, 1],
            1,
        )?;
        let tokens = patches.f_flatten(2, -1)?.f_transpose(1, 2)?;
        let cls = get(p, "cls_token")?.f_expand([batch, 1, dim], false)?;
        let h = Tensor::f_cat(&[cls, tokens], 1)?.f_add(get(p, "pos_embed")?)?;
        return drop(&h, dropout, train, rng);
    }
    if k > depth {
        let h = layer_norm(p, "norm", x, dim)?;
        return linear(p, "head", &h.f_select(1, 0)?);
    }
    let blk = format!("blocks.{}", k - 1);
    let a = attention(
        p,
        &format!("{blk}.attn"),
        &layer_norm(p, &format!("{blk}.norm1"), x, dim)?,
        heads as i64,
    )?;
    let h = x.f_add(&drop(&a, dropout, train, rng)?)?;
    let m = linear(
        p,
        &format!("{blk}.mlp.fc1"),
        &layer_norm(p, &format!("{blk}.norm2"), &h, dim)?,
    )?
    .f_gelu("none")?;
    let m = linear(
        p,
        &format!("{blk}.mlp.fc2"),
        &drop(&m, dropout, train, rng)?,
    )?;
    Ok(h.f_add(&drop(&m, dropout, train, rng)?)?)
}
