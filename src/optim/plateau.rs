//! torch's `ReduceLROnPlateau`: the learning rate is cut by `factor` when the monitored metric has not
//! improved (by `threshold`, relative or absolute) for more than `patience` validations, then left alone
//! for `cooldown` validations; never below `min_lr`, and not for a change smaller than `eps`. Stepped once
//! per validation with the metric's value, as Lightning steps it (`interval: epoch`, `monitor`). Its
//! state is saved with the training state, so a resumed run continues the same curve.

use crate::schema::{Mode, SchedulerConfig, ThresholdMode};

/// What changes as the run goes: saved in checkpoints.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PlateauState {
    pub lr: f64,
    /// The best value so far (`None` before the first step: torch's `mode_worse`).
    pub best: Option<f64>,
    pub num_bad_epochs: u64,
    pub cooldown_counter: u64,
}

#[derive(Debug, Clone)]
pub struct Plateau {
    pub monitor: String,
    mode: Mode,
    factor: f64,
    patience: u64,
    threshold: f64,
    threshold_mode: ThresholdMode,
    cooldown: u64,
    min_lr: f64,
    eps: f64,
    pub state: PlateauState,
}

impl Plateau {
    /// torch's defaults for what the config leaves unset; the run starts at `base_lr`.
    pub fn new(cfg: &SchedulerConfig, base_lr: f64) -> anyhow::Result<Plateau> {
        let factor = cfg.factor.unwrap_or(0.1);
        anyhow::ensure!(
            factor < 1.0,
            "scheduler.factor={factor}: ReduceLROnPlateau's factor must be < 1.0 (torch refuses it too)"
        );
        Ok(Plateau {
            monitor: cfg.monitor.clone().unwrap_or_else(|| "val/loss".into()),
            mode: cfg.mode.unwrap_or(Mode::Min),
            factor,
            patience: cfg.patience.unwrap_or(10),
            threshold: cfg.threshold.unwrap_or(1e-4),
            threshold_mode: cfg.threshold_mode.unwrap_or_default(),
            cooldown: cfg.cooldown.unwrap_or(0),
            min_lr: cfg.min_lr.unwrap_or(0.0),
            eps: cfg.eps.unwrap_or(1e-8),
            state: PlateauState {
                lr: base_lr,
                best: None,
                num_bad_epochs: 0,
                cooldown_counter: 0,
            },
        })
    }

    pub fn lr(&self) -> f64 {
        self.state.lr
    }

    /// torch's `is_better`: does `a` beat `best` by the threshold?
    fn is_better(&self, a: f64, best: Option<f64>) -> bool {
        // torch's best starts at ±inf (`mode_worse`); kept as `None` here, as JSON has no infinity.
        let best = best.unwrap_or(match self.mode {
            Mode::Min => f64::INFINITY,
            Mode::Max => f64::NEG_INFINITY,
        });
        match (self.mode, self.threshold_mode) {
            (Mode::Min, ThresholdMode::Rel) => a < best * (1.0 - self.threshold),
            (Mode::Min, ThresholdMode::Abs) => a < best - self.threshold,
            (Mode::Max, ThresholdMode::Rel) => a > best * (self.threshold + 1.0),
            (Mode::Max, ThresholdMode::Abs) => a > best + self.threshold,
        }
    }

    /// One validation's value of the monitored metric. Returns the new rate when it was cut.
    pub fn step(&mut self, metric: f64) -> Option<f64> {
        if self.is_better(metric, self.state.best) {
            self.state.best = Some(metric);
            self.state.num_bad_epochs = 0;
        } else {
            self.state.num_bad_epochs += 1;
        }
        let s = &mut self.state;
        if s.cooldown_counter > 0 {
            s.cooldown_counter -= 1;
            s.num_bad_epochs = 0;
        }
        if s.num_bad_epochs > self.patience {
            s.cooldown_counter = self.cooldown;
            s.num_bad_epochs = 0;
            let new_lr = (s.lr * self.factor).max(self.min_lr);
            if s.lr - new_lr > self.eps {
                s.lr = new_lr;
                return Some(new_lr);
            }
        }
        None
    }
}
