//! A mid-epoch checkpoint's running sums (`TrainingState::running`): the trainer's step statistics as the
//! checkpoint stores them, and back.

use crate::backend::{StepStats, MAX_METRICS};
use crate::storage::checkpoint::StatSums;

/// Step statistics as a checkpoint stores them (a mid-epoch checkpoint's running sums).
pub(super) fn to_sums(stats: &StepStats) -> StatSums {
    StatSums {
        loss_sum: stats.loss_sum,
        correct1: stats.correct1,
        correct5: stats.correct5,
        count: stats.count,
        metric_sums: stats.metric_sums.to_vec(),
    }
}

/// Back from a checkpoint.
pub(super) fn from_sums(sums: &StatSums) -> StepStats {
    let mut metric_sums = [0.0; MAX_METRICS];
    for (slot, value) in metric_sums.iter_mut().zip(&sums.metric_sums) {
        *slot = *value;
    }
    StepStats {
        loss_sum: sums.loss_sum,
        correct1: sums.correct1,
        correct5: sums.correct5,
        count: sums.count,
        metric_sums,
    }
}
