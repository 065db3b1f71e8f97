//! The batch-size finder's runs (Lightning's `BatchSizeFinder`, `callbacks/batch_size_finder.rs` has its
//! search rules): real trials of `steps_per_trial` training steps on the training set, each with a fresh
//! strategy, measuring the peak above what was in use before the trial: the heap's on the CPU, CUDA's
//! caching allocator's on a GPU (`memory::Meter`).

use crate::callbacks::batch_size_finder::{search, Finding};
use crate::data::loader::{EpochLoader, LoaderSpec};
use crate::data::{self, Split};
use crate::plan::RunPlan;
use crate::schema::{BatchSizeFinder, Experiment};
use std::sync::Arc;

/// Search for the largest batch size that fits (the run plan has checked the budget is measurable).
pub fn find_batch_size(
    exp: &Experiment,
    plan: &RunPlan,
    cfg: &BatchSizeFinder,
) -> anyhow::Result<Finding> {
    data::download::ensure(&exp.data)?;
    let train_set = data::open(&exp.data, Split::Train, exp.seed)?;
    // The run's own sampler on one rank: a dataset read as shards streams here too.
    let sampler = super::sampler_of(
        exp,
        &crate::strategy::Ranks::single(),
        train_set.as_ref(),
        true,
        true,
    )?;
    let steps = cfg.steps_per_trial.max(1) as usize;
    let finding = search(cfg, train_set.len(), |b| {
        let mut trial_exp = exp.clone();
        trial_exp.data.batch_size = b;
        let meter = crate::platform::memory::Meter::start(&trial_exp)?;
        {
            let mut strategy = crate::strategy::build(&trial_exp, plan, None)?;
            let spec = LoaderSpec {
                dataset: train_set.clone(),
                transforms: Arc::new(exp.data.train_transforms.clone()),
                batch_size: b,
                drop_last: false,
                num_workers: exp.data.num_workers,
                prefetch: 2,
                seed: exp.seed,
                // Batches reach the engine as in the run itself.
                stager: strategy.batch_stager(),
                read_ahead: exp.data.shuffle_buffer,
                skipped: None,
            };
            // Exactly `steps` steps, into further epochs when one has fewer batches.
            let mut done = 0;
            for epoch in 0.. {
                for batch in
                    EpochLoader::new(&spec, epoch, &sampler.order(epoch)).take(steps - done)
                {
                    strategy.forward_backward(&batch?, 1.0, true)?;
                    strategy.optimizer_step(exp.optimizer.lr, None, None)?;
                    done += 1;
                }
                if done >= steps {
                    break;
                }
            }
        }
        meter.peak_above_start()
    })?;
    tracing::info!(
        "batch size finder ({}): batch size {} ({}; {} trials)",
        serde_json::to_value(finding.mode)?
            .as_str()
            .unwrap_or_default(),
        finding.found,
        finding.stopped_because,
        finding.trials.len()
    );
    Ok(finding)
}
