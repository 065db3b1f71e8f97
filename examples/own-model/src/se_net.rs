//! A small convolutional network with a squeeze-and-excitation gate (not in trainyard's zoo), written with
//! candle-nn and registered under the `_target_` its config names (conf/model/se_net.yaml).

use candle_core::{Result, Tensor, D};
use candle_nn::{Conv2d, Conv2dConfig, Linear, Module, VarBuilder};
use trainyard::registry::{CandleModel, ModelContext};

/// The arguments `model:` gives the constructor (any other key is refused, naming its file and line).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SeNetArgs {
    /// Channels of the two convolutions.
    width: usize,
    /// The gate's bottleneck: width / reduction channels.
    reduction: usize,
}

/// conv-relu-pool, conv-relu, a squeeze-and-excitation gate over the channels, global pooling, a head.
struct SeNet {
    stem: Conv2d,
    conv: Conv2d,
    squeeze: Linear,
    excite: Linear,
    head: Linear,
}

fn se_net(args: SeNetArgs, vb: VarBuilder, ctx: &ModelContext) -> anyhow::Result<SeNet> {
    anyhow::ensure!(
        args.reduction >= 1 && args.width >= args.reduction,
        "reduction must be between 1 and width"
    );
    let same = Conv2dConfig {
        padding: 1,
        ..Default::default()
    };
    let w = args.width;
    Ok(SeNet {
        stem: candle_nn::conv2d(ctx.channels, w, 3, same, vb.pp("stem"))?,
        conv: candle_nn::conv2d(w, w, 3, same, vb.pp("conv"))?,
        squeeze: candle_nn::linear(w, w / args.reduction, vb.pp("se.squeeze"))?,
        excite: candle_nn::linear(w / args.reduction, w, vb.pp("se.excite"))?,
        head: candle_nn::linear(w, ctx.num_classes, vb.pp("head"))?,
    })
}

impl CandleModel for SeNet {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        let h = self.stem.forward(x)?.relu()?.max_pool2d(2)?;
        let h = self.conv.forward(&h)?.relu()?;
        let pooled = h.mean(D::Minus1)?.mean(D::Minus1)?;
        let gate = self
            .excite
            .forward(&self.squeeze.forward(&pooled)?.relu()?)?;
        let gate = (gate.neg()?.exp()? + 1.0)?.recip()?; // sigmoid
        let h = h.broadcast_mul(&gate.unsqueeze(2)?.unsqueeze(3)?)?;
        self.head.forward(&h.mean(D::Minus1)?.mean(D::Minus1)?)
    }
}

trainyard::register_candle_model!("own_model.models.SeNet", se_net);
