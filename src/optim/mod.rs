//! The optimizer rules — PyTorch's SGD (momentum, dampening 0, nesterov, weight decay), Adam and AdamW —
//! written once over a small tensor interface, so every backend updates its parameters with the same
//! arithmetic in the same order (what makes cross-backend runs and checkpoints agree). State slots use
//! PyTorch's names: `<param>.momentum_buffer`, `<param>.exp_avg`, `<param>.exp_avg_sq`.

pub mod plateau;
pub mod schedule;
mod tensors;

use crate::registry::{AnyRule, OptimizerStep, ParamState};
use crate::schema::{OptimizerConfig, OptimizerName};
use anyhow::Context;
use std::collections::BTreeMap;

/// The element-wise operations the rules need, on a backend's tensor type.
pub trait OptTensor: Sized {
    /// Another handle on the same values (the rules never write into a tensor, so sharing is fine).
    fn duplicate(&self) -> Self;
    /// A copy that owns its values: optimizer state must not alias a gradient buffer that the backend
    /// reuses (libtorch zeroes `.grad` in place for the next step).
    fn owned_copy(&self) -> anyhow::Result<Self>;
    /// `self * mul + add`.
    fn affine(&self, mul: f64, add: f64) -> anyhow::Result<Self>;
    fn plus(&self, other: &Self) -> anyhow::Result<Self>;
    fn minus(&self, other: &Self) -> anyhow::Result<Self>;
    fn divide(&self, other: &Self) -> anyhow::Result<Self>;
    fn square(&self) -> anyhow::Result<Self>;
    fn root(&self) -> anyhow::Result<Self>;
    /// Σ x² as f64 (for gradient norms).
    fn sum_of_squares(&self) -> anyhow::Result<f64>;
    /// Each value limited to [-max, max] (clipping gradients by value).
    fn clamp_abs(&self, max: f64) -> anyhow::Result<Self>;
    /// The element-wise product.
    fn times(&self, other: &Self) -> anyhow::Result<Self>;
    /// Each value's sign: -1, 0 or 1 (`torch.sign`).
    fn signum(&self) -> anyhow::Result<Self>;
    /// A registered optimizer's rule on this kind of tensor (`registry::register_optimizer!`).
    #[doc(hidden)]
    fn registered_update(
        _rule: &dyn AnyRule,
        _p: &Self,
        _grad: &Self,
        _state: &mut ParamState<'_, Self>,
        _step: &OptimizerStep,
    ) -> anyhow::Result<Self> {
        anyhow::bail!("a registered optimizer does not run on this kind of tensor")
    }
    /// SGD with momentum in one pass where a backend has it: `(new parameter, new momentum buffer)` from
    /// this parameter, its gradient and the previous buffer (`None` on the first step), bit-identical to
    /// the rule's separate operations (`Optimizer::update`). `None`: not available, use the operations.
    fn sgd_momentum_fused(
        &self,
        _grad: &Self,
        _buf: Option<&Self>,
        _k: SgdStep,
    ) -> Option<anyhow::Result<(Self, Self)>> {
        None
    }
}

/// Every tensor type the rules run on offers a registered rule its operations (`registry::RuleTensor`).
impl<T: OptTensor> crate::registry::RuleTensor for T {
    fn duplicate(&self) -> Self {
        OptTensor::duplicate(self)
    }
    fn owned_copy(&self) -> anyhow::Result<Self> {
        OptTensor::owned_copy(self)
    }
    fn affine(&self, mul: f64, add: f64) -> anyhow::Result<Self> {
        OptTensor::affine(self, mul, add)
    }
    fn plus(&self, other: &Self) -> anyhow::Result<Self> {
        OptTensor::plus(self, other)
    }
    fn minus(&self, other: &Self) -> anyhow::Result<Self> {
        OptTensor::minus(self, other)
    }
    fn times(&self, other: &Self) -> anyhow::Result<Self> {
        OptTensor::times(self, other)
    }
    fn divide(&self, other: &Self) -> anyhow::Result<Self> {
        OptTensor::divide(self, other)
    }
    fn square(&self) -> anyhow::Result<Self> {
        OptTensor::square(self)
    }
    fn root(&self) -> anyhow::Result<Self> {
        OptTensor::root(self)
    }
    fn signum(&self) -> anyhow::Result<Self> {
        OptTensor::signum(self)
    }
    fn clamp_abs(&self, max: f64) -> anyhow::Result<Self> {
        OptTensor::clamp_abs(self, max)
    }
    fn sum_of_squares(&self) -> anyhow::Result<f64> {
        OptTensor::sum_of_squares(self)
    }
}

/// The constants of one SGD-with-momentum update.
#[derive(Debug, Clone, Copy)]
pub struct SgdStep {
    pub lr: f64,
    pub weight_decay: f64,
    pub momentum: f64,
    pub nesterov: bool,
}

/// An optimizer's configuration and state.
#[derive(Debug, Clone)]
pub struct Optimizer<T> {
    pub config: OptimizerConfig,
    /// Slots by `<param>.<slot>`.
    pub state: BTreeMap<String, T>,
    /// Completed optimizer steps (Adam's bias correction uses `steps + 1`).
    pub steps: u64,
}

/// How gradients are clipped before a step: Lightning's `gradient_clip_val` with its
/// `gradient_clip_algorithm` (`norm`: PyTorch's `clip_grad_norm_` over all gradients together; `value`:
/// `clip_grad_value_`, each value limited to ±the limit).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GradClip {
    Norm(f64),
    Value(f64),
}

impl GradClip {
    /// The trainer's setting: none without a `gradient_clip_val`.
    pub fn of(limit: Option<f64>, algorithm: crate::schema::ClipAlgorithm) -> Option<GradClip> {
        let limit = limit?;
        Some(match algorithm {
            crate::schema::ClipAlgorithm::Norm => GradClip::Norm(limit),
            crate::schema::ClipAlgorithm::Value => GradClip::Value(limit),
        })
    }

    /// The largest global norm allowed, when clipping by norm.
    pub fn max_norm(clip: Option<GradClip>) -> Option<f64> {
        match clip {
            Some(GradClip::Norm(max)) => Some(max),
            _ => None,
        }
    }

    /// `grad` limited to ±the limit when clipping by value; otherwise itself.
    pub fn clamp<T: OptTensor>(clip: Option<GradClip>, grad: T) -> anyhow::Result<T> {
        match clip {
            Some(GradClip::Value(max)) => grad.clamp_abs(max),
            _ => Ok(grad),
        }
    }
}

/// The global gradient norm and the factor that clips it to `clip_norm` (PyTorch's
/// `clip_grad_norm_`: max / (norm + 1e-6) when over the limit).
pub fn clip_factor<'a, T: OptTensor + 'a>(
    grads: impl IntoIterator<Item = &'a T>,
    clip_norm: Option<f64>,
) -> anyhow::Result<(f64, f64)> {
    let mut sq = 0.0f64;
    for g in grads {
        sq += g.sum_of_squares()?;
    }
    let norm = sq.sqrt();
    let scale = match clip_norm {
        Some(max) if norm > max => max / (norm + 1e-6),
        _ => 1.0,
    };
    Ok((norm, scale))
}

impl<T: OptTensor> Optimizer<T> {
    pub fn new(config: OptimizerConfig) -> Self {
        Optimizer {
            config,
            state: BTreeMap::new(),
            steps: 0,
        }
    }

    /// The new value of parameter `name` (`p`) given its gradient, at this learning rate; `momentum`
    /// overrides SGD's momentum (OneCycle's momentum cycling) when the optimizer uses momentum.
    pub fn update(
        &mut self,
        name: &str,
        p: &T,
        grad: &T,
        lr: f64,
        momentum: Option<f64>,
    ) -> anyhow::Result<T> {
        let o = &self.config;
        match o.name {
            OptimizerName::Registered => {
                let r = o
                    .registered
                    .as_deref()
                    .context("optimizer.name=registered without the registered optimizer")?;
                let step = OptimizerStep {
                    lr,
                    step: self.steps + 1,
                    momentum,
                };
                let mut state = ParamState::new(name, &r.slots, &r.spec.target, &mut self.state);
                T::registered_update(r.rule.as_ref(), p, grad, &mut state, &step).with_context(
                    || format!("optimizer _target_ {}, parameter '{name}'", r.spec.target),
                )
            }
            OptimizerName::Sgd => {
                let m = momentum.filter(|_| o.momentum != 0.0).unwrap_or(o.momentum);
                let key = format!("{name}.momentum_buffer");
                let k = SgdStep {
                    lr,
                    weight_decay: o.weight_decay,
                    momentum: m,
                    nesterov: o.nesterov,
                };
                if m != 0.0 {
                    if let Some(done) = p.sgd_momentum_fused(grad, self.state.get(&key), k) {
                        let (new_p, buf) = done?;
                        self.state.insert(key, buf);
                        return Ok(new_p);
                    }
                }
                let mut g = grad.duplicate();
                if o.weight_decay != 0.0 {
                    g = g.plus(&p.affine(o.weight_decay, 0.0)?)?;
                }
                if m != 0.0 {
                    let buf = match self.state.get(&key) {
                        Some(b) => b.affine(m, 0.0)?.plus(&g)?,
                        None => g.owned_copy()?,
                    };
                    g = if o.nesterov {
                        g.plus(&buf.affine(m, 0.0)?)?
                    } else {
                        buf.duplicate()
                    };
                    self.state.insert(key, buf);
                }
                p.minus(&g.affine(lr, 0.0)?)
            }
            OptimizerName::Adam | OptimizerName::Adamw => {
                let (b1, b2) = (o.betas[0], o.betas[1]);
                let t = self.steps as i32 + 1;
                let mut g = grad.duplicate();
                let mut p = p.duplicate();
                if o.weight_decay != 0.0 {
                    if o.name == OptimizerName::Adamw {
                        p = p.affine(1.0 - lr * o.weight_decay, 0.0)?;
                    } else {
                        g = g.plus(&p.affine(o.weight_decay, 0.0)?)?;
                    }
                }
                let (km, kv) = (format!("{name}.exp_avg"), format!("{name}.exp_avg_sq"));
                let m = match self.state.get(&km) {
                    Some(m) => m.affine(b1, 0.0)?.plus(&g.affine(1.0 - b1, 0.0)?)?,
                    None => g.affine(1.0 - b1, 0.0)?,
                };
                let v = match self.state.get(&kv) {
                    Some(v) => v
                        .affine(b2, 0.0)?
                        .plus(&g.square()?.affine(1.0 - b2, 0.0)?)?,
                    None => g.square()?.affine(1.0 - b2, 0.0)?,
                };
                let bc1 = 1.0 - b1.powi(t);
                let bc2 = 1.0 - b2.powi(t);
                // PyTorch: p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)
                let denom = v.affine(1.0 / bc2, 0.0)?.root()?.affine(1.0, o.eps)?;
                let step = m.divide(&denom)?.affine(lr / bc1, 0.0)?;
                self.state.insert(km, m);
                self.state.insert(kv, v);
                p.minus(&step)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scalar "tensor" for checking the rules against hand-computed PyTorch values.
    #[derive(Debug, Clone, Copy, PartialEq)]
    struct S(f64);

    impl OptTensor for S {
        fn duplicate(&self) -> Self {
            *self
        }
        fn owned_copy(&self) -> anyhow::Result<Self> {
            Ok(*self)
        }
        fn affine(&self, mul: f64, add: f64) -> anyhow::Result<Self> {
            Ok(S(self.0 * mul + add))
        }
        fn plus(&self, o: &Self) -> anyhow::Result<Self> {
            Ok(S(self.0 + o.0))
        }
        fn minus(&self, o: &Self) -> anyhow::Result<Self> {
            Ok(S(self.0 - o.0))
        }
        fn divide(&self, o: &Self) -> anyhow::Result<Self> {
            Ok(S(self.0 / o.0))
        }
        fn square(&self) -> anyhow::Result<Self> {
            Ok(S(self.0 * self.0))
        }
        fn clamp_abs(&self, max: f64) -> anyhow::Result<Self> {
            Ok(S(self.0.clamp(-max, max)))
        }
        fn root(&self) -> anyhow::Result<Self> {
            Ok(S(self.0.sqrt()))
        }
        fn sum_of_squares(&self) -> anyhow::Result<f64> {
            Ok(self.0 * self.0)
        }
        fn times(&self, o: &Self) -> anyhow::Result<Self> {
            Ok(S(self.0 * o.0))
        }
        fn signum(&self) -> anyhow::Result<Self> {
            Ok(S(if self.0 == 0.0 { 0.0 } else { self.0.signum() }))
        }
    }

    fn config(yaml: &str) -> OptimizerConfig {
        let node = crate::config::yaml::parse(yaml, "<test>").unwrap().unwrap();
        serde_json::from_value(node.to_json()).unwrap()
    }

    #[test]
    fn sgd_momentum_nesterov_and_decay() {
        let mut o = Optimizer::new(config(
            "{name: sgd, lr: 0.1, momentum: 0.9, nesterov: true, weight_decay: 0.01}",
        ));
        // step 1: g = 1 + 0.01*2 = 1.02; buf = 1.02; nesterov g = 1.02 + 0.9*1.02 = 1.938
        let p = o.update("w", &S(2.0), &S(1.0), 0.1, None).unwrap();
        assert!((p.0 - (2.0 - 0.1 * 1.938)).abs() < 1e-12);
        o.steps += 1;
        // step 2: g = 1 + 0.01*p; buf = 0.9*1.02 + g; update g + 0.9*buf
        let g = 1.0 + 0.01 * p.0;
        let buf = 0.9 * 1.02 + g;
        let p2 = o.update("w", &p, &S(1.0), 0.1, None).unwrap();
        assert!((p2.0 - (p.0 - 0.1 * (g + 0.9 * buf))).abs() < 1e-12);
    }

    #[test]
    fn adamw_first_step_moves_by_lr() {
        let mut o = Optimizer::new(config(
            "{name: adamw, lr: 0.001, weight_decay: 0.1, betas: [0.9, 0.999], eps: 1e-8}",
        ));
        // First Adam step: m̂ = g, v̂ = g², so the step is lr * g/(|g| + eps) ≈ lr; AdamW decays p first.
        let p = o.update("w", &S(1.0), &S(0.5), 0.001, None).unwrap();
        let expected = 1.0 * (1.0 - 0.001 * 0.1) - 0.001 * 0.5 / (0.5 + 1e-8);
        assert!((p.0 - expected).abs() < 1e-12, "{}", p.0);
        assert_eq!(o.state.len(), 2);
    }

    #[test]
    fn clipping_by_value_limits_each_value_and_only_then() {
        let by_value = GradClip::of(Some(1.0), crate::schema::ClipAlgorithm::Value);
        assert_eq!(GradClip::clamp(by_value, S(3.0)).unwrap(), S(1.0));
        assert_eq!(GradClip::clamp(by_value, S(-3.0)).unwrap(), S(-1.0));
        assert_eq!(GradClip::clamp(by_value, S(0.5)).unwrap(), S(0.5));
        let by_norm = GradClip::of(Some(1.0), crate::schema::ClipAlgorithm::Norm);
        assert_eq!(GradClip::clamp(by_norm, S(3.0)).unwrap(), S(3.0));
        assert_eq!(GradClip::max_norm(by_norm), Some(1.0));
        assert_eq!(GradClip::max_norm(by_value), None);
        assert_eq!(
            GradClip::of(None, crate::schema::ClipAlgorithm::Value),
            None
        );
    }

    #[test]
    fn clipping_factor() {
        let g = [S(3.0), S(4.0)];
        assert_eq!(clip_factor(&g, None).unwrap(), (5.0, 1.0));
        let (norm, scale) = clip_factor(&g, Some(1.0)).unwrap();
        assert_eq!(norm, 5.0);
        assert!((scale - 1.0 / (5.0 + 1e-6)).abs() < 1e-15);
    }
}
