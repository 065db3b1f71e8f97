//! `test: true`: after fitting, the best checkpoint's weights (Lightning's `trainer.test(ckpt_path="best")`)
//! measured once on the test split, every sample once across the ranks, as validation measures.

use super::EvalSet;
use crate::backend::StepStats;
use crate::data::loader::EpochLoader;
use crate::strategy::{Ranks, Strategy};
use anyhow::Context;
use std::path::Path;

/// Load the best checkpoint ModelCheckpoint kept (`best`: its path, the same on every rank) into the
/// strategy, each rank its own part of it; without one, the weights training ended with are tested, with
/// the template's warning.
pub fn load_best(strategy: &mut dyn Strategy, best: Option<&Path>) -> anyhow::Result<()> {
    let Some(best) = best else {
        tracing::warn!(
            "test: no best checkpoint was kept (no ModelCheckpoint, or it never saved); testing the \
             weights training ended with"
        );
        return Ok(());
    };
    let file = strategy.checkpoint_file(&best.display().to_string());
    let rank = strategy.ranks().rank;
    anyhow::ensure!(
        Path::new(&file).is_file(),
        "test: the best checkpoint {file} is not on this machine (rank {rank}): testing after a \
         multi-node run reads it from callbacks.model_checkpoint.dirpath, which must then be a shared \
         file system"
    );
    let loaded = crate::storage::checkpoint::load(Path::new(&file))?;
    strategy
        .load_state_dict(&loaded.state)
        .with_context(|| format!("test: loading the best checkpoint {file}"))?;
    if strategy.ranks().is_global_zero() {
        tracing::info!("test: the best checkpoint, {}", best.display());
    }
    Ok(())
}

/// One pass over this rank's `batches` test batches, then its part in the other ranks' collectives up to
/// `rounds`; the statistics summed over ranks. `after` sees each batch once it is evaluated (the
/// stateful metrics take the model's outputs for it).
pub fn evaluate(
    strategy: &mut dyn Strategy,
    ranks: &Ranks,
    set: &EvalSet,
    (batches, rounds): (usize, usize),
    mut after: impl FnMut(&mut dyn Strategy, &crate::data::loader::Batch) -> anyhow::Result<()>,
) -> anyhow::Result<StepStats> {
    strategy.before_validation()?;
    let order = set.sampler.order(0);
    let mut stats = StepStats::default();
    let mut done = 0;
    for batch in EpochLoader::new(&set.spec, 0, &order).take(batches) {
        let batch = batch?;
        stats.add(&strategy.evaluate(&batch)?);
        after(strategy, &batch)?;
        done += 1;
    }
    for _ in done..rounds {
        strategy.evaluate_idle()?;
    }
    ranks.sum_stats(stats)
}
