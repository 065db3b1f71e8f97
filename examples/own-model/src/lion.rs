//! Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"), an optimizer torch.optim does
//! not have: each step moves every weight by the learning rate times the sign of a blend of its momentum
//! and its gradient, with decoupled weight decay. Written once over trainyard's `RuleTensor`, the same rule
//! runs on Candle, on libtorch and on FSDP's flat shards; its one state slot (`exp_avg`) is checkpointed
//! as `optimizer.<param>.exp_avg` and sharded with the parameter.
//!
//! `conf/optimizer/lion.yaml` names it as lightning-hydra-template names `torch.optim.Adam`:
//! `{_target_: own_model.optim.Lion, _partial_: true, lr: ..., betas: [...], weight_decay: ...}`.

use trainyard::registry::{OptimizerRule, OptimizerStep, ParamState, RuleTensor};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LionArgs {
    /// The blend of momentum and gradient that is signed (β1), and the momentum's decay (β2).
    #[serde(default = "default_betas")]
    betas: [f64; 2],
    /// Decoupled weight decay, as AdamW's (Lion's authors use 3-10x AdamW's value).
    #[serde(default)]
    weight_decay: f64,
}

fn default_betas() -> [f64; 2] {
    [0.9, 0.99]
}

pub struct Lion {
    betas: [f64; 2],
    weight_decay: f64,
}

fn lion(args: LionArgs) -> anyhow::Result<Lion> {
    for (i, b) in args.betas.iter().enumerate() {
        anyhow::ensure!(
            (0.0..1.0).contains(b),
            "betas[{i}] must be in [0, 1), got {b}"
        );
    }
    anyhow::ensure!(
        args.weight_decay >= 0.0,
        "weight_decay must be >= 0, got {}",
        args.weight_decay
    );
    Ok(Lion {
        betas: args.betas,
        weight_decay: args.weight_decay,
    })
}

impl OptimizerRule for Lion {
    fn slots(&self) -> Vec<&'static str> {
        vec!["exp_avg"]
    }

    fn update<T: RuleTensor>(
        &self,
        p: &T,
        grad: &T,
        state: &mut ParamState<'_, T>,
        step: &OptimizerStep,
    ) -> anyhow::Result<T> {
        let [b1, b2] = self.betas;
        // The momentum starts at zero.
        let m = match state.get("exp_avg") {
            Some(m) => m.duplicate(),
            None => grad.affine(0.0, 0.0)?,
        };
        let blend = m.affine(b1, 0.0)?.plus(&grad.affine(1.0 - b1, 0.0)?)?;
        let decayed = p.affine(1.0 - step.lr * self.weight_decay, 0.0)?;
        let updated = decayed.minus(&blend.signum()?.affine(step.lr, 0.0)?)?;
        state.set(
            "exp_avg",
            m.affine(b2, 0.0)?.plus(&grad.affine(1.0 - b2, 0.0)?)?,
        )?;
        Ok(updated)
    }
}

trainyard::register_optimizer!("own_model.optim.Lion", lion);
