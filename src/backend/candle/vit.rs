//! Vision Transformer (tiny/small/base, patch 16/32, any image size) with timm's parameter names
//! (`cls_token`, `pos_embed`, `patch_embed.proj`, `blocks.{i}.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}`,
//! `norm`, `head`), so `vit_base_patch32_224` weights load.
//!
//! Softmax and LayerNorm are written from basic ops on purpose: candle-nn's fused `softmax_last_dim` and
//! `layer_norm` have no backward pass, so gradients would silently stop before them.

use super::models::{param, Buffers, CandleModel, Init, ParamSpec, Params};
use crate::rng::Rng;
use crate::schema::{ModelConfig, VitVariant};
use candle_core::{Result, Tensor, D};

/// timm's ViT LayerNorm epsilon.
const LN_EPS: f64 = 1e-6;

pub struct Vit {
    dim: usize,
    depth: usize,
    heads: usize,
    patch: usize,
    grid: usize,
    in_channels: usize,
    classes: usize,
    dropout: f64,
}

impl Vit {
    pub fn new(
        cfg: &ModelConfig,
        in_channels: usize,
        data_image_size: usize,
    ) -> anyhow::Result<Self> {
        let (dim, depth, heads) = match cfg.variant.unwrap_or(VitVariant::Base) {
            VitVariant::Tiny => (192, 12, 3),
            VitVariant::Small => (384, 12, 6),
            VitVariant::Base => (768, 12, 12),
        };
        let patch = cfg.patch_size.unwrap_or(16);
        let image = cfg.image_size.unwrap_or(data_image_size);
        if image != data_image_size {
            anyhow::bail!(
                "model.image_size={image} but the data set's images are {data_image_size}x{data_image_size}: \
                 set model.image_size=${{data.image_size}}, or resize the images in data.train_transforms"
            );
        }
        if patch == 0 || !image.is_multiple_of(patch) {
            anyhow::bail!("model.patch_size={patch} does not divide model.image_size={image}: use a patch size that divides it");
        }
        Ok(Vit {
            dim,
            depth,
            heads,
            patch,
            grid: image / patch,
            in_channels,
            classes: cfg.num_classes,
            dropout: cfg.dropout,
        })
    }

    /// (width, depth, heads, patch size, dropout): what another backend's forward pass needs.
    pub fn shape(&self) -> (usize, usize, usize, usize, f64) {
        (self.dim, self.depth, self.heads, self.patch, self.dropout)
    }

    /// FSDP units in forward order: the embedding (`patch_embed`, `cls_token`, `pos_embed`), each
    /// transformer block, the head (`norm`, `head`).
    pub fn stages(&self) -> Vec<Vec<String>> {
        let mut stages = vec![vec![
            "patch_embed".to_string(),
            "cls_token".to_string(),
            "pos_embed".to_string(),
        ]];
        stages.extend((0..self.depth).map(|i| vec![format!("blocks.{i}")]));
        stages.push(vec!["norm".to_string(), "head".to_string()]);
        stages
    }

    pub fn tokens(&self) -> usize {
        self.grid * self.grid + 1
    }
}

fn spec(out: &mut Vec<ParamSpec>, name: String, shape: Vec<usize>, init: Init) {
    let fan_in = shape.iter().skip(1).product::<usize>().max(1);
    out.push(ParamSpec {
        name,
        shape,
        fan_in,
        init,
    });
}

/// timm's `init_weights`: linear weights N(0, 0.02) (trunc_normal_ with std 0.02), biases zero.
fn linear_spec(out: &mut Vec<ParamSpec>, name: &str, inp: usize, outp: usize) {
    spec(
        out,
        format!("{name}.weight"),
        vec![outp, inp],
        Init::Normal(0.02),
    );
    spec(out, format!("{name}.bias"), vec![outp], Init::Constant(0.0));
}

fn norm_spec(out: &mut Vec<ParamSpec>, name: &str, dim: usize) {
    spec(
        out,
        format!("{name}.weight"),
        vec![dim],
        Init::Constant(1.0),
    );
    spec(out, format!("{name}.bias"), vec![dim], Init::Constant(0.0));
}

fn linear(p: &Params, name: &str, x: &Tensor) -> Result<Tensor> {
    let w = param(p, &format!("{name}.weight"))?;
    let b = param(p, &format!("{name}.bias"))?;
    super::autocast::linear(x, w, b)
}

/// LayerNorm over the last dimension from basic ops (differentiable).
pub fn layer_norm(p: &Params, name: &str, x: &Tensor) -> Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let centered = x.broadcast_sub(&mean)?;
    let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = centered.broadcast_div(&(var + LN_EPS)?.sqrt()?)?;
    normed
        .broadcast_mul(param(p, &format!("{name}.weight"))?)?
        .broadcast_add(param(p, &format!("{name}.bias"))?)
}

/// Softmax over the last dimension from basic ops (differentiable). The max is a constant shift, so
/// it is detached.
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    let shifted = x.broadcast_sub(&x.max_keepdim(D::Minus1)?.detach())?;
    let e = shifted.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

impl Vit {
    fn attention(&self, p: &Params, name: &str, x: &Tensor) -> Result<Tensor> {
        let (b, n, d) = x.dims3()?;
        let hd = d / self.heads;
        let qkv = linear(p, &format!("{name}.qkv"), x)?
            .reshape((b, n, 3, self.heads, hd))?
            .permute((2, 0, 3, 1, 4))?;
        let q = qkv.get(0)?.contiguous()?;
        let k = qkv.get(1)?.contiguous()?;
        let v = qkv.get(2)?.contiguous()?;
        let scores =
            (super::autocast::matmul(&q, &k.t()?.contiguous()?)? * (1.0 / (hd as f64).sqrt()))?;
        let attn = softmax_last_dim(&scores)?;
        let out = super::autocast::matmul(&attn, &v)?
            .transpose(1, 2)?
            .reshape((b, n, d))?;
        linear(p, &format!("{name}.proj"), &out)
    }
}

impl CandleModel for Vit {
    fn specs(&self) -> Vec<ParamSpec> {
        let mut out = Vec::new();
        let d = self.dim;
        spec(
            &mut out,
            "cls_token".into(),
            vec![1, 1, d],
            Init::Normal(1e-6),
        );
        spec(
            &mut out,
            "pos_embed".into(),
            vec![1, self.tokens(), d],
            Init::Normal(0.02),
        );
        let fan_in = self.in_channels * self.patch * self.patch;
        out.push(ParamSpec {
            name: "patch_embed.proj.weight".into(),
            shape: vec![d, self.in_channels, self.patch, self.patch],
            fan_in,
            init: Init::Default,
        });
        out.push(ParamSpec {
            name: "patch_embed.proj.bias".into(),
            shape: vec![d],
            fan_in,
            init: Init::Default,
        });
        for i in 0..self.depth {
            let blk = format!("blocks.{i}");
            norm_spec(&mut out, &format!("{blk}.norm1"), d);
            linear_spec(&mut out, &format!("{blk}.attn.qkv"), d, 3 * d);
            linear_spec(&mut out, &format!("{blk}.attn.proj"), d, d);
            norm_spec(&mut out, &format!("{blk}.norm2"), d);
            linear_spec(&mut out, &format!("{blk}.mlp.fc1"), d, 4 * d);
            linear_spec(&mut out, &format!("{blk}.mlp.fc2"), 4 * d, d);
        }
        norm_spec(&mut out, "norm", d);
        linear_spec(&mut out, "head", d, self.classes);
        out
    }

    fn stages(&self) -> Vec<Vec<String>> {
        Vit::stages(self)
    }

    fn forward_stage(
        &self,
        k: usize,
        p: &Params,
        _b: &mut Buffers,
        x: &Tensor,
        train: bool,
        rng: &mut Rng,
    ) -> Result<Tensor> {
        if k == 0 {
            let batch = x.dim(0)?;
            let w = param(p, "patch_embed.proj.weight")?;
            let patches = super::conv::conv2d(x, w, self.patch, 0)?
                .broadcast_add(&param(p, "patch_embed.proj.bias")?.reshape((1, self.dim, 1, 1))?)?;
            // (B, D, g, g) -> (B, g*g, D)
            let tokens = patches.flatten_from(2)?.transpose(1, 2)?;
            let cls = param(p, "cls_token")?.broadcast_as((batch, 1, self.dim))?;
            let h = Tensor::cat(&[&cls, &tokens], 1)?.broadcast_add(param(p, "pos_embed")?)?;
            return super::models::dropout(&h, self.dropout, train, rng);
        }
        if k > self.depth {
            let h = layer_norm(p, "norm", x)?;
            // timm's default global_pool='token': the class token.
            let cls = h.narrow(1, 0, 1)?.squeeze(1)?;
            return linear(p, "head", &cls);
        }
        let blk = format!("blocks.{}", k - 1);
        let a = self.attention(
            p,
            &format!("{blk}.attn"),
            &layer_norm(p, &format!("{blk}.norm1"), x)?,
        )?;
        let h = (x + super::models::dropout(&a, self.dropout, train, rng)?)?;
        let m = linear(
            p,
            &format!("{blk}.mlp.fc1"),
            &layer_norm(p, &format!("{blk}.norm2"), &h)?,
        )?
        .gelu_erf()?;
        let m = linear(
            p,
            &format!("{blk}.mlp.fc2"),
            &super::models::dropout(&m, self.dropout, train, rng)?,
        )?;
        h + super::models::dropout(&m, self.dropout, train, rng)?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn softmax_and_layer_norm_have_gradients() {
        let x = Var::from_tensor(
            &Tensor::new(&[[1f32, 2.0, 3.0], [0.5, -1.0, 2.0]], &Device::Cpu).unwrap(),
        )
        .unwrap();
        let probe = Tensor::new(&[[1f32, -2.0, 0.5], [3.0, 1.0, -1.0]], &Device::Cpu).unwrap();
        let s = softmax_last_dim(&x).unwrap();
        let reference = candle_nn::ops::softmax_last_dim(&x).unwrap();
        let diff = (&s - &reference)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-6);
        let g = (s * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let gx = g.get(&x).unwrap().to_vec2::<f32>().unwrap();
        // d/dx_i sum_j p_j s_j = s_i (p_i - sum_j p_j s_j)
        let sv = reference.to_vec2::<f32>().unwrap();
        let pv = probe.to_vec2::<f32>().unwrap();
        for r in 0..2 {
            let dot: f32 = (0..3).map(|j| sv[r][j] * pv[r][j]).sum();
            for i in 0..3 {
                assert!((gx[r][i] - sv[r][i] * (pv[r][i] - dot)).abs() < 1e-5);
            }
        }
    }
}
