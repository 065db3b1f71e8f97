//! The same squeeze-and-excitation network on libtorch (tch's `nn` layers on a `VarStore` path), under the
//! same `_target_`: `backend=tch` builds this one, `backend=candle` the Candle one (src/se_net.rs). The
//! parameter names are the same, so a checkpoint of either loads into the other.

use trainyard::registry::tch::{nn, nn::Module, Tensor};
use trainyard::registry::ModelContext;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SeNetArgs {
    width: i64,
    reduction: i64,
}

#[derive(Debug)]
struct SeNet {
    stem: nn::Conv2D,
    conv: nn::Conv2D,
    squeeze: nn::Linear,
    excite: nn::Linear,
    head: nn::Linear,
}

fn se_net(args: SeNetArgs, p: &nn::Path, ctx: &ModelContext) -> anyhow::Result<SeNet> {
    anyhow::ensure!(
        args.reduction >= 1 && args.width >= args.reduction,
        "reduction must be between 1 and width"
    );
    let same = nn::ConvConfig {
        padding: 1,
        ..Default::default()
    };
    let (w, r) = (args.width, args.reduction);
    Ok(SeNet {
        stem: nn::conv2d(p / "stem", ctx.channels as i64, w, 3, same),
        conv: nn::conv2d(p / "conv", w, w, 3, same),
        squeeze: nn::linear(p / "se" / "squeeze", w, w / r, Default::default()),
        excite: nn::linear(p / "se" / "excite", w / r, w, Default::default()),
        head: nn::linear(p / "head", w, ctx.num_classes as i64, Default::default()),
    })
}

impl nn::ModuleT for SeNet {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Tensor {
        let h = self.stem.forward(x).relu().max_pool2d_default(2);
        let h = self.conv.forward(&h).relu();
        let pooled = h.mean_dim(&[2i64, 3][..], false, None);
        let gate = self
            .excite
            .forward(&self.squeeze.forward(&pooled).relu())
            .sigmoid();
        let h = &h * gate.unsqueeze(2).unsqueeze(3);
        self.head.forward(&h.mean_dim(&[2i64, 3][..], false, None))
    }
}

trainyard::register_tch_model!("own_model.models.SeNet", se_net);
