//! The one training loop (fit + validate) for every strategy and backend, as burn-train's learner and
//! Lightning's fit loop: it executes the run plan (`plan::LoopPlan`) through a `strategy::Strategy` and
//! knows nothing of devices, ranks' collectives or backends.
//! - `fit_loop`: epochs, steps, accumulation, validation, stopping, and the test after them (`test: true`);
//! - `test_loop`: the test split with the best checkpoint's weights;
//! - `sinks`: where the run's metrics go (its `logger:`);
//! - `checkpointing`: ModelCheckpoint/EarlyStopping, where checkpoints go (S3 too), resuming;
//! - `finder`: the batch-size finder's trial runs;
//! - `profiler`: `trainer.profiler: simple`, each action's time;
//! - `summary`: `summary.json`, typed both ways.
//!
//! Metrics go to `loggers::MetricSink`s (CSV, TensorBoard, the console).

pub mod checkpointing;
pub mod finder;
mod fit_loop;
mod predict_loop;
pub mod profiler;
mod resume_from;
mod running_sums;
mod stateful;
pub use resume_from::{newest_first, own_checkpoints};
mod sinks;
pub mod summary;
mod test_loop;
mod user_callbacks;

pub use summary::{RunStatus, Summary};

use crate::callbacks::batch_size_finder::Finding;
use crate::comm::Distributed;
use crate::data::loader::LoaderSpec;
use crate::data::sampler::{DistributedSampler, Sampler};
use crate::data::shard_sampler::ShardSampler;
use crate::data::{self, Dataset, Split};
use crate::plan::{LoopPlan, RunPlan, Shares};
use crate::schema::{Experiment, Transform};
use crate::strategy::Ranks;
use anyhow::Context;
use std::path::Path;
use std::sync::Arc;

/// One job's training, as the launcher hands it over.
pub struct Job<'a> {
    pub exp: &'a Experiment,
    pub plan: &'a RunPlan,
    pub output_dir: &'a Path,
    /// The resolved config, stored in checkpoints.
    pub config_yaml: &'a str,
    /// The config as composed, unresolved (`.hydra/config.yaml`): `ckpt_path=auto` resumes an earlier run
    /// of the same one.
    pub job_config: &'a str,
    /// The job runs again in its own directory (a resumed sweep): it continues from its own last
    /// checkpoint, if an earlier attempt wrote one.
    pub resume_own: bool,
    /// A search's pruner: after each validation it may stop the run (`RunStatus::Pruned`).
    pub judge: Option<&'a dyn ValidationJudge>,
    /// The sweep this run is a job of (its directory's name): loggers group the sweep's runs by it.
    pub sweep_name: Option<String>,
    /// The launcher's logbook section for this run (its markdown, then its plots), written on request
    /// after `summary.json`, for the loggers that keep it with the run (W&B, MLflow).
    pub report: Option<&'a RunReport>,
}

/// Writes a run's logbook section given its directory; returns the files written (markdown first).
pub type RunReport = dyn Fn(&Path) -> anyhow::Result<Vec<std::path::PathBuf>>;

/// Someone outside the run who sees each validation's metrics and may end the run early: a search's
/// pruner. The trainer asks on rank 0 only and every rank stops together; it never knows who asks.
pub trait ValidationJudge {
    /// After the validation that ended `epoch` (0-based): `Some(reason)` stops the run as pruned.
    fn judge(
        &self,
        epoch: u64,
        metrics: &std::collections::HashMap<String, f64>,
    ) -> anyhow::Result<Option<String>>;
}

/// Train and validate as the experiment says, as this process's part of the run (`group`: its process
/// group, for DDP and FSDP), writing everything under the job's directory. With a batch-size finder
/// configured, the batch size is found first and the run trains with it.
pub fn fit(job: &Job, group: Option<Distributed>) -> anyhow::Result<Summary> {
    tracing::debug!("run plan: {:?}", job.plan);
    for warning in &job.plan.warnings {
        tracing::warn!("{warning}");
    }
    let exp = for_this_world(
        job.exp,
        &group.as_ref().map_or_else(Ranks::single, Ranks::of),
        job.output_dir,
    )?;
    let Some(cfg) = &job.plan.batch_size_finder else {
        return fit_with(&exp, job, None, group);
    };
    let finding = finder::find_batch_size(&exp, job.plan, cfg)?;
    let mut tuned = exp.clone();
    tuned.data.batch_size = finding.found;
    if !cfg.fit_after {
        tuned.trainer.max_epochs = 0;
    }
    fit_with(&tuned, job, Some(finding), group)
}

/// Every rank resumed at the same step, or none resumed: each reads the checkpoint from its own disk, and
/// a node without the run's files (a replacement machine) would start over while the others go on.
fn same_resume_point(ranks: &crate::strategy::Ranks, step: Option<u64>) -> anyhow::Result<()> {
    let Some(comm) = ranks.comm() else {
        return Ok(());
    };
    let mine = step.map_or(-1.0, |s| s as f64);
    let mut v = [mine, -mine];
    comm.all_reduce_f64(&mut v, crate::comm::collective::ReduceOp::Max)?;
    let (highest, lowest) = (v[0], -v[1]);
    let said = |s: f64| match s < 0.0 {
        true => "a fresh start".to_string(),
        false => format!("step {s}"),
    };
    anyhow::ensure!(
        highest == lowest,
        "the ranks resumed at different points (this rank, {}, at {}; others between {} and {}): every \
         node must see the run's checkpoints (a shared run directory, or callbacks.model_checkpoint.dirpath \
         on s3://)",
        ranks.rank,
        said(mine),
        said(lowest),
        said(highest)
    );
    Ok(())
}

/// The experiment as this process runs it: a drawn seed (`seed: null`) made rank 0's on every rank, so
/// the ranks start from the same weights and shuffle alike; a whole step's batch size
/// (`data.batch_size_is_global`) divided among the processes.
fn for_this_world(
    exp: &Experiment,
    ranks: &Ranks,
    output_dir: &Path,
) -> anyhow::Result<Experiment> {
    let mut exp = exp.clone();
    if exp.seed_drawn {
        let mut seed = [match ranks.is_global_zero() {
            true => run_dir_seed(output_dir) as f64,
            false => 0.0,
        }];
        ranks.sum(&mut seed)?;
        exp.seed = seed[0] as u64;
        if ranks.is_global_zero() {
            tracing::info!(
                "seed: null, so this run drew seed {} (from its run directory: a requeued run keeps it)",
                exp.seed
            );
        }
    }
    if exp.data.batch_size_is_global {
        let world = ranks.world_size.max(1);
        anyhow::ensure!(
            exp.data.batch_size.is_multiple_of(world),
            "data.batch_size={} is not divisible by the number of processes ({world}); it is the whole \
             step's batch (as lightning-hydra-template's MNISTDataModule divides it): choose a multiple \
             of {world}",
            exp.data.batch_size
        );
        exp.data.batch_size /= world;
    }
    Ok(exp)
}

/// `seed: null`'s seed for a run: a hash of its directory (a fresh run has a new one; a run requeued into
/// its own directory, to resume from its checkpoint, draws the same seed and so the same shuffles), below
/// 2^32 so the f64 the ranks agree through holds it exactly.
fn run_dir_seed(output_dir: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    output_dir.hash(&mut hasher);
    hasher.finish() & u64::from(u32::MAX)
}

fn fit_with(
    exp: &Experiment,
    job: &Job,
    finding: Option<Finding>,
    group: Option<Distributed>,
) -> anyhow::Result<Summary> {
    let started = std::time::Instant::now();
    let ranks = group.as_ref().map_or_else(Ranks::single, Ranks::of);
    summary::reset_peak_rss();
    let mut data = DataSets::open(exp, &ranks)?;
    let plan = LoopPlan::new(exp, data.shares())?;
    let mut strategy = crate::strategy::build(exp, job.plan, group)?;
    // A GPU engine's batches are copied to page-locked memory by the loader, off the step's path.
    data.train_spec.stager = strategy.batch_stager();
    data.val_spec.stager = data.train_spec.stager.clone();
    for set in data.test.iter_mut().chain(data.predict.iter_mut()) {
        set.spec.stager = data.train_spec.stager.clone();
    }
    if let Some(ms) = exp
        .callbacks
        .model_summary
        .as_ref()
        .filter(|_| ranks.is_global_zero())
    {
        print_model_summary(exp, ms.max_depth)?;
    }
    let (resumed_state, resumed_from) = resume_from::restore(
        exp,
        strategy.as_mut(),
        job.output_dir,
        job.resume_own,
        job.job_config,
    )?;
    same_resume_point(&ranks, resumed_state.as_ref().map(|t| t.global_step))?;
    strategy.start()?;
    let mut profiler = profiler::Profiler::new(exp.trainer.profiler.as_ref(), started);
    profiler.record("setup", started);
    let fit = fit_loop::FitLoop::new(exp, job, &plan, &data, strategy, resumed_state, profiler)?;
    let mut outcome = match exp.train {
        true => fit.run()?,
        false => fit,
    };
    let mut status = outcome.status.clone();
    if exp.trainer.max_epochs == 0 && finding.is_some() {
        status = RunStatus::BatchSizeOnly;
    }
    if exp.test && status.tests_after() {
        outcome.test(exp.train)?;
    }
    if let Some(predict) = &exp.predict {
        outcome.predict(predict)?;
    }
    let summary = outcome.summary(exp, &ranks, status, started, resumed_from, finding)?;
    if ranks.is_global_zero() {
        summary.write(job.output_dir)?;
    }
    let rank = (ranks.world_size > 1).then_some(ranks.rank);
    if let Some(path) = outcome.profiler.report(job.output_dir, rank)? {
        tracing::info!("profiler report: {}", path.display());
    }
    // Written only when a sink keeps it (only rank 0 has such sinks).
    let report = match job.report.filter(|_| outcome.sinks_keep_run_report()) {
        Some(write) => write(job.output_dir).unwrap_or_else(|e| {
            tracing::warn!("the run's logbook section was not written for its loggers: {e:#}");
            Vec::new()
        }),
        None => Vec::new(),
    };
    outcome.finish_sinks(&summary, &report)?;
    Ok(summary)
}

/// The data sets a run trains and validates on, with their loaders' settings and this rank's samplers.
pub struct DataSets {
    pub train: Arc<dyn Dataset>,
    pub val: Arc<dyn Dataset>,
    pub train_spec: LoaderSpec,
    pub val_spec: LoaderSpec,
    /// PyTorch's DistributedSampler: this rank takes every world-th index (padded to equal shares); for
    /// a dataset read as shards, whole shards per rank (`shard_sampler`).
    pub train_sampler: Sampler,
    /// Validation sees every sample exactly once, so distributed metrics equal one device's (Lightning
    /// repeats samples to even out the shares); a rank whose share runs out first keeps taking part in
    /// the others' collectives.
    pub val_sampler: Sampler,
    /// `test: true`: the test split, sampled as validation is.
    pub test: Option<EvalSet>,
    /// `train predict`: the split it predicts, sampled as validation is.
    pub predict: Option<EvalSet>,
}

/// A split measured without training on it (the test split): its loader's settings and this rank's share.
pub struct EvalSet {
    pub spec: LoaderSpec,
    pub sampler: Sampler,
}

impl DataSets {
    /// One download per run: rank 0 fetches, the others wait for it and then only check the files.
    fn open(exp: &Experiment, ranks: &Ranks) -> anyhow::Result<DataSets> {
        if ranks.is_global_zero() {
            data::download::ensure(&exp.data)?;
        }
        ranks
            .barrier()
            .context("waiting for rank 0 to fetch the data set")?;
        if !ranks.is_global_zero() {
            data::download::ensure(&exp.data)?;
        }
        let overfit = crate::plan::overfit_limit(exp).is_some();
        let (train, val) = if exp.train {
            let train = data::open(&exp.data, Split::Train, exp.seed)?;
            let val = match overfit {
                true => train.clone(),
                false => data::open(&exp.data, Split::Val, exp.seed)?,
            };
            (train, val)
        } else {
            // `train eval`, `train predict`: nothing is trained or validated, so no training data is
            // needed (a WebDataset's `train_urls` may be absent); the measured split stands in for both.
            let split = match exp.predict.as_ref().map(|p| p.split) {
                Some(crate::schema::PredictSplit::Train) => Split::Train,
                Some(crate::schema::PredictSplit::Val) => Split::Val,
                _ => Split::Test,
            };
            let measured = data::open(&exp.data, split, exp.seed)?;
            (measured.clone(), measured)
        };
        let skipped = exp
            .data
            .skip_corrupt
            .then(|| Arc::new(data::skipped::Skipped::default()));
        let spec = |set: Arc<dyn Dataset>, transforms: &[Transform], drop_last: bool| LoaderSpec {
            dataset: set,
            transforms: Arc::new(transforms.to_vec()),
            batch_size: exp.data.batch_size,
            drop_last,
            num_workers: exp.data.num_workers,
            prefetch: 2,
            seed: exp.seed,
            stager: None,
            read_ahead: exp.data.shuffle_buffer,
            skipped: skipped.clone(),
        };
        let test = match exp.test {
            true => {
                let set = match exp.train {
                    true => data::open(&exp.data, Split::Test, exp.seed)?,
                    false => train.clone(),
                };
                Some(EvalSet {
                    sampler: sampler_of(exp, ranks, set.as_ref(), false, false)?,
                    spec: spec(set, &exp.data.val_transforms, false),
                })
            }
            false => None,
        };
        // `train predict`: the split opened above, every input once over the ranks.
        let predict = match exp.predict.is_some() && !exp.train {
            true => Some(EvalSet {
                sampler: sampler_of(exp, ranks, train.as_ref(), false, false)?,
                spec: spec(train.clone(), &exp.data.val_transforms, false),
            }),
            false => None,
        };
        Ok(DataSets {
            test,
            predict,
            train_spec: spec(
                train.clone(),
                &exp.data.train_transforms,
                exp.data.drop_last,
            ),
            val_spec: spec(val.clone(), &exp.data.val_transforms, false),
            train_sampler: sampler_of(exp, ranks, train.as_ref(), !overfit, true)?,
            val_sampler: sampler_of(exp, ranks, val.as_ref(), false, false)?,
            train,
            val,
        })
    }

    /// This rank's shares of the training and validation samples.
    fn shares(&self) -> Shares {
        Shares {
            train: self.train_sampler.share(),
            val: self.val_sampler.share(),
            val_largest: self.val_sampler.largest_share(),
        }
    }
}

/// This rank's sampler of `set`: `training` shares are equal on every rank (padded, or for shards
/// `data.uneven_shards`), evaluation shares hold each sample once (a rank may have none).
pub(crate) fn sampler_of(
    exp: &Experiment,
    ranks: &Ranks,
    set: &dyn Dataset,
    shuffle: bool,
    training: bool,
) -> anyhow::Result<Sampler> {
    if let Some(lens) = set.shard_lens() {
        let sampler = ShardSampler {
            lens,
            num_replicas: ranks.world_size,
            rank: ranks.rank,
            shuffle,
            seed: exp.seed,
            buffer: exp.data.shuffle_buffer,
            even: training.then_some(exp.data.uneven_shards),
        };
        if training {
            sampler.check().map_err(|e| anyhow::anyhow!("data: {e}"))?;
        }
        return Ok(Sampler::Shards(sampler));
    }
    Ok(Sampler::Samples(DistributedSampler {
        num_replicas: ranks.world_size,
        rank: ranks.rank,
        pad: training,
        ..DistributedSampler::single(set.len(), shuffle, exp.seed)
    }))
}

/// Print parameters (and buffers) per module and the total (the ModelSummary callback), from the model's
/// description: no engine, so no rank waits for a sharded model to be gathered.
fn print_model_summary(exp: &Experiment, max_depth: u64) -> anyhow::Result<()> {
    let arch = crate::model::Architecture::of(exp)?;
    for line in model_summary(&arch, max_depth) {
        tracing::info!("{line}");
    }
    Ok(())
}

/// Lightning's ModelSummary: the modules down to `max_depth` in the order the model defines them (not
/// sorted as text: `layers.2` before `layers.10`), each with its parameters; then the trainable count as
/// PyTorch gives it (`sum(p.numel() for p in model.parameters())`), and the buffers (BatchNorm's running
/// statistics) apart, as they are state, not parameters.
fn model_summary(arch: &crate::model::Architecture, max_depth: u64) -> Vec<String> {
    let mut groups = indexmap::IndexMap::<String, usize>::new();
    let group = |name: &str| -> String {
        let key: Vec<&str> = name.split('.').take(max_depth.max(1) as usize).collect();
        key.join(".")
    };
    let mut trainable = 0;
    for spec in arch.specs() {
        let n: usize = spec.shape.iter().product();
        *groups.entry(group(&spec.name)).or_default() += n;
        trainable += n;
    }
    let mut buffers = 0;
    for (name, shape, _) in arch.buffers() {
        // A module holding only buffers still has its row (with 0 parameters).
        groups.entry(group(&name)).or_default();
        buffers += shape.iter().product::<usize>();
    }
    let mut lines = vec![format!("{:<32} {:>12}", "module", "params")];
    lines.extend(groups.iter().map(|(name, n)| format!("{name:<32} {n:>12}")));
    lines.push(format!("{:<32} {trainable:>12}", "total trainable params"));
    if buffers > 0 {
        lines.push(format!("{:<32} {buffers:>12}", "buffers (not parameters)"));
    }
    lines.push(format!(
        "{:<32} {:>12.3}",
        "estimated size (MB)",
        (trainable + buffers) as f64 * 4.0 / 1e6
    ));
    lines
}

#[cfg(test)]
mod tests {
    /// `seed: null`: the same run directory draws the same seed (a requeued run resumes with its own
    /// shuffles); another directory, another seed.
    #[test]
    fn a_run_directory_keeps_its_drawn_seed() {
        let a = super::run_dir_seed(std::path::Path::new("logs/train/runs/2026-11-27_10-00-00"));
        let again =
            super::run_dir_seed(std::path::Path::new("logs/train/runs/2026-11-27_10-00-00"));
        let b = super::run_dir_seed(std::path::Path::new("logs/train/runs/2026-11-27_10-00-01"));
        assert_eq!(a, again);
        assert_ne!(a, b);
        assert!(a <= u64::from(u32::MAX));
    }

    /// The summary lists modules in the model's own order and counts what PyTorch counts as
    /// parameters: torchvision's CIFAR-stem ResNet-18 has 11,173,962, its BatchNorm statistics apart.
    #[test]
    fn the_model_summary_keeps_module_order_and_pytorchs_count() {
        let exp = crate::testing::experiment(
            "{name: resnet18, num_classes: 10, cifar_stem: true}",
            "{name: sgd, lr: 0.1}",
            "{strategy: single, devices: 1}",
            10,
        );
        let arch = crate::model::Architecture::of(&exp).unwrap();
        let lines = super::model_summary(&arch, 1);
        let names: Vec<&str> = lines[1..8]
            .iter()
            .map(|l| l.split_whitespace().next().unwrap())
            .collect();
        assert_eq!(
            names,
            ["conv1", "bn1", "layer1", "layer2", "layer3", "layer4", "fc"]
        );
        let total = lines
            .iter()
            .find(|l| l.starts_with("total trainable"))
            .unwrap();
        assert!(total.ends_with(" 11173962"), "{total}");
        let mlp = crate::testing::experiment(
            "{name: mlp, num_classes: 4, hidden: [8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8]}",
            "{name: sgd, lr: 0.1}",
            "{strategy: single, devices: 1}",
            4,
        );
        let arch = crate::model::Architecture::of(&mlp).unwrap();
        let lines = super::model_summary(&arch, 2);
        let names: Vec<&str> = lines
            .iter()
            .skip(1)
            .map(|l| l.split_whitespace().next().unwrap())
            .collect();
        let ten = names.iter().position(|n| *n == "layers.10").unwrap();
        let two = names.iter().position(|n| *n == "layers.2").unwrap();
        assert!(two < ten, "{names:?}");
    }
}
