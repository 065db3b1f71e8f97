//! Forward passes of the model zoo on libtorch ops, over the same named parameters as the Candle models
//! (torchvision/timm names); the architectures' shapes come from the shared zoo descriptions.

use crate::comm::c10d::ProcessGroup;
use crate::comm::collective::Collective;
use crate::model::dropout::dropout_mask;
use crate::model::resnet::ResNet;
use crate::model::vit::Vit;
use crate::model::Architecture;
use crate::platform::rng::Rng;
use anyhow::Context;
use std::collections::BTreeMap;
use std::sync::Arc;
use tch::{Kind, Tensor};

pub(super) type Named = BTreeMap<String, Tensor>;

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

pub(super) fn get<'a>(p: &'a Named, name: &str) -> anyhow::Result<&'a Tensor> {
    p.get(name)
        .ok_or_else(|| anyhow::anyhow!("missing parameter {name}"))
}

fn linear(p: &Named, prefix: &str, x: &Tensor) -> anyhow::Result<Tensor> {
    Ok(x.f_linear(
        get(p, &format!("{prefix}.weight"))?,
        Some(get(p, &format!("{prefix}.bias"))?),
    )?)
}

/// Dropout with the mask drawn on `x`'s device by libtorch, from `seed` (the same seed, the same mask).
fn on_device_dropout(x: &Tensor, prob: f64, seed: u64) -> anyhow::Result<Tensor> {
    let mut out: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: `x` is a live tch handle; the shim writes a new `torch::Tensor*` into `out` on success
    // (owned by the Tensor made from it) and catches C++ exceptions.
    let status = unsafe { trainyard_dropout(x.as_ptr().cast(), prob, seed, &mut out) };
    anyhow::ensure!(
        status == 0 && !out.is_null(),
        "libtorch's dropout failed on {:?}",
        x.device()
    );
    // SAFETY: `out` is a heap-allocated `torch::Tensor` the shim made for us, i.e. a tch C_tensor.
    Ok(unsafe { Tensor::from_ptr(out.cast()) })
}

extern "C" {
    fn trainyard_dropout(
        x: *const std::ffi::c_void,
        p: f64,
        seed: u64,
        out: *mut *mut std::ffi::c_void,
    ) -> std::os::raw::c_int;
}

pub(super) fn drop(x: &Tensor, prob: f64, train: bool, rng: &mut Rng) -> anyhow::Result<Tensor> {
    if !train || prob <= 0.0 {
        return Ok(x.shallow_clone());
    }
    if x.device().is_cuda() {
        // A host mask would be drawn element by element and copied over on every step (20 MB a layer
        // for ViT-B at batch 128); the GPU draws it itself, seeded from the same keyed stream, so a
        // run is still reproducible (though not bit-equal to the CPU's masks).
        return on_device_dropout(x, prob, rng.next_u64());
    }
    let mask = dropout_mask(x.numel(), prob, rng);
    let mask = Tensor::f_from_slice(&mask)?
        .f_reshape(x.size())?
        .f_to_kind(x.kind())?
        .f_to(x.device())?;
    Ok(x.f_mul(&mask)?)
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

/// How a pass runs BatchNorm.
#[derive(Clone, Copy)]
pub(super) enum Norm<'a> {
    Eval,
    /// Batch statistics; with SyncBatchNorm, reduced over this group.
    Train(Option<&'a ProcessGroup>),
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

/// `batch_norm` with a layer's own `(eps, momentum)`.
pub(super) fn batch_norm_with(
    p: &Named,
    b: &mut Named,
    (name, x): (&str, &Tensor),
    norm: Norm,
    (eps, momentum): (f64, f64),
) -> anyhow::Result<Tensor> {
    let key = |s: &str| format!("{name}.{s}");
    let train = matches!(norm, Norm::Train(_));
    if let Norm::Train(Some(pg)) = norm {
        let y = pg.sync_batch_norm(
            x,
            get(p, &key("weight"))?,
            get(p, &key("bias"))?,
            get(b, &key("running_mean"))?,
            get(b, &key("running_var"))?,
            momentum,
            eps,
        )?;
        let tracked = key("num_batches_tracked");
        let count = get(b, &tracked)?.f_add_scalar(1.0)?;
        b.insert(tracked, count);
        return Ok(y);
    }
    let y = x.f_batch_norm(
        Some(get(p, &key("weight"))?),
        Some(get(p, &key("bias"))?),
        Some(get(b, &key("running_mean"))?),
        Some(get(b, &key("running_var"))?),
        train,
        momentum,
        eps,
        false,
    )?;
    if train {
        let tracked = key("num_batches_tracked");
        let count = get(b, &tracked)?.f_add_scalar(1.0)?;
        b.insert(tracked, count);
    }
    Ok(y)
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

/// ReLU in place, as torchvision's `nn.ReLU(inplace=True)`: on a fresh activation (a BatchNorm output,
/// whose backward does not read it) the same values and gradients without allocating another activation.
pub(super) fn relu_(mut x: Tensor) -> anyhow::Result<Tensor> {
    let _ = x.f_relu_()?;
    Ok(x)
}

/// `out += identity` (torchvision's BasicBlock/Bottleneck) when no type promotion is involved (mixed
/// precision may meet two dtypes: then out of place, promoting as before).
pub(super) fn add_(mut out: Tensor, identity: &Tensor) -> anyhow::Result<Tensor> {
    if out.kind() == identity.kind() {
        let _ = out.f_add_(identity)?;
        Ok(out)
    } else {
        Ok(out.f_add(identity)?)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn values(t: &Tensor) -> Vec<f32> {
        Vec::<f32>::try_from(&t.f_flatten(0, -1).unwrap()).unwrap()
    }

    /// The on-device path (run here on the CPU, where the shim works the same): the same seed gives the
    /// same mask, another seed another; each element is dropped or scaled by 1/(1-p); about p are dropped.
    #[test]
    fn on_device_dropout_is_seeded_and_scaled() {
        let x = Tensor::f_full([64, 100], 2.0, (tch::Kind::Float, tch::Device::Cpu)).unwrap();
        let a = values(&on_device_dropout(&x, 0.25, 11).unwrap());
        let b = values(&on_device_dropout(&x, 0.25, 11).unwrap());
        let c = values(&on_device_dropout(&x, 0.25, 12).unwrap());
        assert_eq!(a, b);
        assert_ne!(a, c);
        let kept = (2.0f32 * (1.0 / 0.75f64) as f32).to_bits();
        assert!(a.iter().all(|v| *v == 0.0 || v.to_bits() == kept), "{a:?}");
        let dropped = a.iter().filter(|v| **v == 0.0).count() as f64 / a.len() as f64;
        assert!((dropped - 0.25).abs() < 0.03, "dropped {dropped}");
    }
}
