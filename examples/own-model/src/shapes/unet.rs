//! A small U-Net (`own_model.models.UNet`): two 3x3 convolutions per level, max-pooling down twice,
//! nearest upsampling back with the skip connection concatenated at each level, and a 1x1 convolution to
//! one logit per class and pixel (`(N, C, H, W)`, what a per-pixel cross-entropy and mean IoU read).

use candle_core::{Result, Tensor};
use candle_nn::{Conv2d, Conv2dConfig, Module, VarBuilder};
use trainyard::registry::{CandleModel, ModelContext};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct UNetArgs {
    /// Channels of the first level (doubled at each level down).
    base: usize,
}

/// Two 3x3 convolutions, each followed by a ReLU.
struct Block(Conv2d, Conv2d);

impl Block {
    fn new(inputs: usize, outputs: usize, vb: VarBuilder) -> Result<Block> {
        let same = Conv2dConfig {
            padding: 1,
            ..Default::default()
        };
        Ok(Block(
            candle_nn::conv2d(inputs, outputs, 3, same, vb.pp("0"))?,
            candle_nn::conv2d(outputs, outputs, 3, same, vb.pp("2"))?,
        ))
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.1.forward(&self.0.forward(x)?.relu()?)?.relu()
    }
}

struct UNet {
    down: [Block; 2],
    bottom: Block,
    up: [Block; 2],
    head: Conv2d,
}

fn unet(args: UNetArgs, vb: VarBuilder, ctx: &ModelContext) -> anyhow::Result<UNet> {
    let [channels, height, width] = ctx.input_shape[..] else {
        anyhow::bail!(
            "a U-Net reads images (channels, height, width); the data gives {:?}",
            ctx.input_shape
        );
    };
    anyhow::ensure!(
        height % 4 == 0 && width % 4 == 0,
        "a U-Net of two levels halves the image twice: {height}x{width} is not a multiple of 4"
    );
    let b = args.base;
    Ok(UNet {
        down: [
            Block::new(channels, b, vb.pp("down.0"))?,
            Block::new(b, 2 * b, vb.pp("down.1"))?,
        ],
        bottom: Block::new(2 * b, 4 * b, vb.pp("bottom"))?,
        up: [
            Block::new(4 * b + 2 * b, 2 * b, vb.pp("up.0"))?,
            Block::new(2 * b + b, b, vb.pp("up.1"))?,
        ],
        head: candle_nn::conv2d(b, ctx.num_classes, 1, Default::default(), vb.pp("head"))?,
    })
}

impl CandleModel for UNet {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        let skip0 = self.down[0].forward(x)?;
        let skip1 = self.down[1].forward(&skip0.max_pool2d(2)?)?;
        let mut h = self.bottom.forward(&skip1.max_pool2d(2)?)?;
        for (block, skip) in self.up.iter().zip([&skip1, &skip0]) {
            let (_, _, sh, sw) = skip.dims4()?;
            let up = h.upsample_nearest2d(sh, sw)?;
            h = block.forward(&Tensor::cat(&[&up, skip], 1)?)?;
        }
        self.head.forward(&h)
    }
}

trainyard::register_candle_model!("own_model.models.UNet", unet);
