//! Linear warm-up, then cosine decay to a floor, over the run's optimizer steps (the schedule of most
//! vision-transformer recipes; torch needs `SequentialLR(LinearLR, CosineAnnealingLR)` for it). A pure
//! function of the step, so a resumed run continues the same curve.
//!
//! `conf/scheduler/warmup_cosine.yaml`: `{_target_: own_model.schedules.WarmupCosine, _partial_: true,
//! warmup_steps: ..., min_lr_ratio: ...}`.

use trainyard::registry::{LrSchedule, ScheduleContext};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmupCosineArgs {
    /// Steps of linear warm-up from base_lr / warmup_steps to base_lr.
    warmup_steps: u64,
    /// The floor, as a share of the base rate.
    #[serde(default)]
    min_lr_ratio: f64,
}

pub struct WarmupCosine(WarmupCosineArgs);

fn warmup_cosine(args: WarmupCosineArgs) -> anyhow::Result<WarmupCosine> {
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.min_lr_ratio),
        "min_lr_ratio must be in [0, 1], got {}",
        args.min_lr_ratio
    );
    Ok(WarmupCosine(args))
}

impl LrSchedule for WarmupCosine {
    fn lr(&self, step: u64, run: &ScheduleContext) -> f64 {
        let warmup = self.0.warmup_steps;
        if step < warmup {
            return run.base_lr * (step + 1) as f64 / warmup as f64;
        }
        let span = run.total_steps.saturating_sub(warmup).max(1) as f64;
        let progress = ((step - warmup) as f64 / span).min(1.0);
        let floor = run.base_lr * self.0.min_lr_ratio;
        floor + (run.base_lr - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

trainyard::register_schedule!("own_model.schedules.WarmupCosine", warmup_cosine);
