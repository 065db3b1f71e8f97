//! The Vision Transformer (tiny/small/base, any patch size dividing the image) as timm builds it: parameter
//! names (`cls_token`, `pos_embed`, `patch_embed.proj`, `blocks.{i}.{norm1,attn.qkv,attn.proj,norm2,
//! mlp.fc1,mlp.fc2}`, `norm`, `head`, so `vit_base_patch32_224` weights load), shapes, initialisation and
//! stages.

use super::spec::{Init, ParamSpec};
use crate::schema::{ModelConfig, VitVariant};

fn vit(
    cfg: &ModelConfig,
    channels: usize,
    image_size: usize,
) -> anyhow::Result<super::Architecture> {
    Ok(super::Architecture::Vit(Vit::new(
        cfg, channels, image_size,
    )?))
}

// torchvision's `vit_b_16` and `vit_b_32` set `model.variant` and `model.patch_size` as well
// (`schema::targets::zoo`); timm's names come through `timm.create_model`.
super::zoo::register_zoo_model!(name: "vit", order: 30,
    targets: ["torchvision.models.vit_b_16", "torchvision.models.vit_b_32"],
    keys: ["variant", "patch_size", "image_size"], dropout: true, build: vit);

/// The transformer's geometry.
pub struct Vit {
    /// Token width.
    pub dim: usize,
    pub depth: usize,
    pub heads: usize,
    pub patch: usize,
    /// Patches per side.
    pub grid: usize,
    pub in_channels: usize,
    pub classes: usize,
    pub dropout: f64,
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

    /// Patch tokens plus the class token.
    pub fn tokens(&self) -> usize {
        self.grid * self.grid + 1
    }

    /// Parameters with timm's names and initialisation.
    pub fn specs(&self) -> Vec<ParamSpec> {
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
