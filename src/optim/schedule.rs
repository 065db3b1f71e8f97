//! Learning-rate schedules, shared by every backend: pure functions of the optimizer step, so a resumed
//! run continues the same curve. OneCycle matches PyTorch's `OneCycleLR` (cosine annealing, two phases,
//! momentum cycled inversely between 0.85 and 0.95 when the optimizer has momentum).

use crate::schema::{Interval, SchedulerConfig, SchedulerName};

#[derive(Debug, Clone)]
pub struct Schedule {
    cfg: SchedulerConfig,
    base_lr: f64,
    total_steps: u64,
    steps_per_epoch: u64,
}

/// The learning rate (and, for OneCycle, momentum) to use for one optimizer step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub lr: f64,
    pub momentum: Option<f64>,
}

fn cos_anneal(start: f64, end: f64, pct: f64) -> f64 {
    end + (start - end) / 2.0 * ((std::f64::consts::PI * pct).cos() + 1.0)
}

impl Schedule {
    pub fn new(
        cfg: &SchedulerConfig,
        base_lr: f64,
        total_steps: u64,
        steps_per_epoch: u64,
    ) -> Self {
        Schedule {
            cfg: cfg.clone(),
            base_lr,
            total_steps: total_steps.max(1),
            steps_per_epoch: steps_per_epoch.max(1),
        }
    }

    /// The point for optimizer step `step` (0-based), taken at the start of that step. Only a registered
    /// schedule can fail: a rate that is not a finite number ≥ 0 stops the run, naming it.
    pub fn at(&self, step: u64) -> anyhow::Result<Point> {
        anyhow::ensure!(
            self.cfg.name != SchedulerName::Registered || self.cfg.registered.is_some(),
            "scheduler.name=registered without the registered schedule"
        );
        let point = self.builtin_or_registered(step);
        let registered = self.cfg.registered.as_deref();
        if let Some(r) = registered.filter(|_| !(point.lr.is_finite() && point.lr >= 0.0)) {
            anyhow::bail!(
                "scheduler _target_ {} gave the learning rate {} for step {step}: a rate is a finite \
                 number >= 0{}",
                r.spec.target,
                point.lr,
                r.spec.origin
            );
        }
        Ok(point)
    }

    fn builtin_or_registered(&self, step: u64) -> Point {
        let c = &self.cfg;
        // Epoch-interval schedules only change at epoch boundaries.
        let t = match c.interval {
            Interval::Step => step,
            Interval::Epoch => (step / self.steps_per_epoch) * self.steps_per_epoch,
        };
        match c.name {
            SchedulerName::Registered => match c.registered.as_deref() {
                Some(r) => {
                    let run = crate::registry::ScheduleContext {
                        base_lr: self.base_lr,
                        total_steps: self.total_steps,
                        steps_per_epoch: self.steps_per_epoch,
                    };
                    Point {
                        lr: r.schedule.lr(t, &run),
                        momentum: r.schedule.momentum(t, &run),
                    }
                }
                // `schema::extract` refuses the name without a `_target_`.
                None => Point {
                    lr: f64::NAN,
                    momentum: None,
                },
            },
            // ReduceLROnPlateau's rate is the fit loop's (`optim::plateau`): it follows the metric.
            SchedulerName::Constant | SchedulerName::Plateau => Point {
                lr: self.base_lr,
                momentum: None,
            },
            SchedulerName::Step => {
                let size = c.step_size.unwrap_or(30) as u64;
                let k = match c.interval {
                    Interval::Step => t / size.max(1),
                    Interval::Epoch => (t / self.steps_per_epoch) / size.max(1),
                };
                Point {
                    lr: self.base_lr * c.gamma.unwrap_or(0.1).powi(k as i32),
                    momentum: None,
                }
            }
            SchedulerName::Cosine => {
                let warmup =
                    (c.warmup_epochs.unwrap_or(0.0) * self.steps_per_epoch as f64).round() as u64;
                let min_lr = c.min_lr.unwrap_or(0.0);
                let lr = if t < warmup {
                    self.base_lr * (t + 1) as f64 / warmup as f64
                } else {
                    let span = (self.total_steps - warmup.min(self.total_steps)).max(1) as f64;
                    let progress = ((t - warmup) as f64 / span).min(1.0);
                    cos_anneal(self.base_lr, min_lr, progress)
                };
                Point { lr, momentum: None }
            }
            SchedulerName::Onecycle => {
                let max_lr = c.max_lr.unwrap_or(self.base_lr);
                let initial = max_lr / c.div_factor.unwrap_or(25.0);
                let min_lr = initial / c.final_div_factor.unwrap_or(1e4);
                let end1 = c.pct_start.unwrap_or(0.3) * self.total_steps as f64 - 1.0;
                let end2 = self.total_steps as f64 - 1.0;
                let s = t as f64;
                let (lr, momentum) = if s <= end1 {
                    let pct = s / end1;
                    (
                        cos_anneal(initial, max_lr, pct),
                        cos_anneal(0.95, 0.85, pct),
                    )
                } else {
                    let pct = ((s - end1) / (end2 - end1)).min(1.0);
                    (cos_anneal(max_lr, min_lr, pct), cos_anneal(0.85, 0.95, pct))
                };
                Point {
                    lr,
                    momentum: Some(momentum),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(name: SchedulerName) -> SchedulerConfig {
        SchedulerConfig {
            name,
            interval: Interval::Step,
            max_lr: Some(0.1),
            pct_start: Some(0.3),
            div_factor: Some(25.0),
            final_div_factor: Some(1e4),
            warmup_epochs: Some(1.0),
            min_lr: Some(0.0),
            step_size: Some(2),
            gamma: Some(0.5),
            monitor: None,
            mode: None,
            factor: None,
            patience: None,
            threshold: None,
            threshold_mode: None,
            cooldown: None,
            eps: None,
            registered: None,
        }
    }

    /// PyTorch's OneCycleLR definition (torch/optim/lr_scheduler.py, anneal_strategy='cos', three_phase=False)
    /// evaluated for max_lr=0.1, total_steps=10, pct_start=0.3; checked against torch itself by the oracle.
    #[test]
    fn onecycle_matches_pytorch() {
        let s = Schedule::new(&cfg(SchedulerName::Onecycle), 0.1, 10, 10);
        let expected = [
            0.0040000000000000036,
            0.052000000000000005,
            0.1,
            0.09504846320134738,
            0.0811745653949763,
            0.06112620219362893,
            0.03887419780637107,
            0.0188258346050237,
            0.004951936798652629,
            4e-07,
        ];
        for (step, want) in expected.iter().enumerate() {
            let got = s.at(step as u64).unwrap().lr;
            assert!((got - want).abs() < 1e-12, "step {step}: {got} vs {want}");
        }
        assert!((s.at(2).unwrap().momentum.unwrap() - 0.85).abs() < 1e-12);
        assert!((s.at(0).unwrap().momentum.unwrap() - 0.95).abs() < 1e-12);
    }

    #[test]
    fn cosine_warms_up_then_decays_to_min() {
        let s = Schedule::new(&cfg(SchedulerName::Cosine), 1.0, 100, 10);
        assert!((s.at(0).unwrap().lr - 0.1).abs() < 1e-12);
        assert!((s.at(9).unwrap().lr - 1.0).abs() < 1e-12);
        // After the 10 warm-up steps, half a cosine over the 90 left: (1 + cos(π · 40/90)) / 2 at step 50.
        let want = (1.0 + (std::f64::consts::PI * 40.0 / 90.0).cos()) / 2.0;
        assert!(
            (s.at(50).unwrap().lr - want).abs() < 1e-12,
            "{} vs {want}",
            s.at(50).unwrap().lr
        );
        assert!(s.at(99).unwrap().lr < 0.001);
    }

    #[test]
    fn step_decay_per_epoch() {
        let mut c = cfg(SchedulerName::Step);
        c.interval = Interval::Epoch;
        let s = Schedule::new(&c, 1.0, 100, 10);
        assert_eq!(s.at(19).unwrap().lr, 1.0);
        assert_eq!(s.at(20).unwrap().lr, 0.5);
        assert_eq!(s.at(45).unwrap().lr, 0.25);
    }
}
