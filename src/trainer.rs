//! The one training loop (fit + validate), shared by every backend: it speaks only `backend::Engine`.
//! It owns the epoch/step bookkeeping (limits, accumulation, fast_dev_run, max_steps), the schedule,
//! checkpointing with resume, early stopping, `metrics.csv` and `summary.json`.

use crate::backend::{self, StepStats};
use crate::checkpoint::{self, TrainingState};
use crate::data::loader::{EpochLoader, LoaderSpec};
use crate::data::sampler::DistributedSampler;
use crate::data::{self, Split};
use crate::loggers::csv::CsvLogger;
use crate::optim::schedule::Schedule;
use crate::schema::{
    Accelerator, Devices, Experiment, FastDevRun, Limit, Limit0, Mode, Precision, Strategy,
};
use anyhow::Context;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// What `summary.json` records about a finished (or stopped) run.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub task_name: String,
    pub status: String,
    pub backend: String,
    pub model: String,
    pub data: String,
    pub strategy: String,
    pub precision: String,
    pub num_nodes: usize,
    pub devices: usize,
    pub batch_size: usize,
    pub global_batch_size: usize,
    pub num_parameters: usize,
    pub epochs_completed: u64,
    pub global_step: u64,
    pub best: Option<BestMetric>,
    pub final_metrics: BTreeMap<String, f64>,
    pub wall_time_s: f64,
    pub train_time_s: f64,
    pub train_samples_per_s: f64,
    /// Median time of one optimizer step's compute (forward, backward, update), excluding data loading.
    pub median_step_time_s: Option<f64>,
    pub peak_rss_bytes: Option<u64>,
    pub best_checkpoint: Option<String>,
    pub last_checkpoint: Option<String>,
    pub resumed_from: Option<String>,
    /// What the batch-size finder tried and chose, when it ran.
    pub batch_size_finder: Option<crate::callbacks::batch_size_finder::Finding>,
    /// DeviceStatsMonitor's figures for the whole run, when it ran.
    pub device_stats: Option<crate::callbacks::device_stats::DeviceStatsSummary>,
    /// The Timer callback's limit and the training time it measured, when it ran.
    pub timer: Option<crate::callbacks::timer::TimerSummary>,
    /// Parameter, gradient and optimizer-state bytes each rank keeps for training, by rank (what
    /// FSDP's sharding divides).
    pub state_bytes_per_rank: Vec<backend::StateBytes>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BestMetric {
    pub monitor: String,
    pub value: f64,
    pub epoch: u64,
}

/// How many of `available` batches a limit allows (Lightning's rules: an int counts, a float is a fraction).
fn limited(available: usize, limit: Limit) -> usize {
    match limit {
        Limit::Batches(n) => available.min(n as usize),
        Limit::Fraction(f) => {
            let n = (available as f64 * f).floor() as usize;
            if f > 0.0 {
                n.max(1).min(available)
            } else {
                0
            }
        }
    }
}

/// The process's peak resident memory (Linux `VmHWM`).
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Start a new peak for `peak_rss_bytes` (Linux: writing 5 to `/proc/self/clear_refs` resets `VmHWM`), so
/// each job of an in-process sweep reports its own peak, not the largest of every job before it.
pub fn reset_peak_rss() {
    if let Err(e) = std::fs::write("/proc/self/clear_refs", "5") {
        tracing::debug!("could not reset the peak RSS (/proc/self/clear_refs): {e}");
    }
}

/// The ranks of a distributed run as validation sees them.
#[derive(Clone, Copy)]
struct ValidationSync<'a> {
    comm: &'a dyn crate::comm::collective::Collective,
    /// The model has BatchNorm running statistics, which drift apart per rank.
    buffers: bool,
}

/// One pass over the validation set (the same batches every time); in a distributed run, rank 0's
/// BatchNorm buffers are used (as DDP's broadcast_buffers does) and the statistics summed over ranks.
/// Evaluate this rank's `batches`, then, while other ranks still have batches (`rounds` in all, the
/// largest share's), take part in their collectives; the metrics are summed over ranks.
fn run_validation(
    engine: &mut dyn backend::Engine,
    spec: &LoaderSpec,
    indices: &[usize],
    (batches, rounds): (usize, usize),
    sync: Option<ValidationSync>,
) -> anyhow::Result<StepStats> {
    if let Some(ValidationSync {
        comm,
        buffers: true,
    }) = sync
    {
        crate::comm::collective::broadcast_state(comm, engine)?;
    }
    let mut v = StepStats::default();
    for batch in EpochLoader::new(spec, 0, indices).take(batches) {
        v.add(&engine.evaluate(&batch?)?);
    }
    for _ in batches..rounds {
        engine.evaluate_idle()?;
    }
    match sync {
        Some(ValidationSync { comm, .. }) => crate::comm::collective::sum_stats(comm, &v),
        None => Ok(v),
    }
}

/// ModelCheckpoint and EarlyStopping, run after every validation (mid-epoch ones included, as
/// Lightning's `on_validation_end`) and at each epoch's end: did the monitored metric improve, which
/// checkpoints to write or replace, and whether to stop.
struct Keeper<'a> {
    ckpt_cfg: Option<&'a crate::schema::ModelCheckpoint>,
    stop_cfg: Option<&'a crate::schema::EarlyStopping>,
    dir: Option<PathBuf>,
    lead: bool,
    rank: usize,
    /// FSDP sharded checkpoints: every rank writes its own file beside rank 0's.
    sharded: bool,
    config_yaml: &'a str,
    /// Upload a written checkpoint (s3:// dirpath) and say where it is.
    publish: &'a dyn Fn(&Path) -> anyhow::Result<String>,
    unpublish: &'a dyn Fn(&Path),
    best_path: Option<PathBuf>,
    last_path: Option<PathBuf>,
    best_location: Option<String>,
    last_location: Option<String>,
}

impl Keeper<'_> {
    /// Update the best value and the patience count, write the due checkpoints; returns why to stop when
    /// EarlyStopping's patience ran out.
    fn on_validation_end(
        &mut self,
        engine: &dyn backend::Engine,
        state: &mut TrainingState,
        epoch: u64,
    ) -> anyhow::Result<Option<String>> {
        // ModelCheckpoint and EarlyStopping share the "did the monitored metric improve" question.
        let monitor = self
            .ckpt_cfg
            .and_then(|c| c.monitor.clone().map(|m| (m, c.mode)))
            .or_else(|| self.stop_cfg.map(|s| (s.monitor.clone(), s.mode)));
        let mut improved = false;
        if let Some((name, mode)) = &monitor {
            if let Some(&value) = state.metrics.get(name.as_str()) {
                let min_delta = self.stop_cfg.map(|s| s.min_delta).unwrap_or(0.0);
                improved = state
                    .best
                    .is_none_or(|(b, _)| better(*mode, value, b, min_delta));
                if improved {
                    state.best = Some((value, epoch));
                    state.epochs_without_improvement = 0;
                } else {
                    state.epochs_without_improvement += 1;
                }
            }
        }
        self.save_checkpoints(engine, state, epoch, improved)?;
        Ok(self.stop_cfg.and_then(|stop| {
            (state.metrics.contains_key(stop.monitor.as_str())
                && state.epochs_without_improvement >= stop.patience)
                .then(|| {
                    format!(
                        "early stopped: {} did not improve for {} validation checks",
                        stop.monitor, stop.patience
                    )
                })
        }))
    }

    fn save_checkpoints(
        &mut self,
        engine: &dyn backend::Engine,
        state: &TrainingState,
        epoch: u64,
        improved: bool,
    ) -> anyhow::Result<()> {
        // Rank 0 writes; every rank takes part when the state is consolidated by a collective (FSDP
        // full) or when each rank writes its own shard (FSDP sharded).
        let writes = self.lead || engine.state_dict_is_collective() || self.sharded;
        let (Some(cfg), Some(dir), true) = (self.ckpt_cfg, self.dir.clone(), writes) else {
            return Ok(());
        };
        let weights = engine.state_dict()?;
        let save = |path: &Path| -> anyhow::Result<Option<String>> {
            if self.lead {
                checkpoint::save(path, &weights, state, self.config_yaml)?;
                return Ok(Some((self.publish)(path)?));
            }
            if self.sharded {
                // Each rank's part goes where rank 0's goes (an s3:// dirpath included).
                let mine = crate::strategy::fsdp::shard_path(path, self.rank);
                checkpoint::save(&mine, &weights, state, self.config_yaml)?;
                (self.publish)(&mine)?;
            }
            Ok(None)
        };
        let discard = |path: &Path| {
            if self.lead {
                (self.unpublish)(path);
            } else {
                (self.unpublish)(&crate::strategy::fsdp::shard_path(path, self.rank));
            }
        };
        // `every_n_epochs` counts the epoch in progress, as Lightning's (current_epoch + 1).
        let due = (epoch + 1).is_multiple_of(cfg.every_n_epochs.max(1));
        if due && cfg.save_top_k != 0 && (improved || cfg.monitor.is_none()) {
            let name = crate::callbacks::checkpoint_name(
                &cfg.filename,
                epoch,
                state.global_step,
                &state.metrics,
            );
            let path = dir.join(format!("{name}.safetensors"));
            self.best_location = save(&path)?;
            if cfg.save_top_k == 1 {
                if let Some(old) = self.best_path.replace(path.clone()) {
                    if old != path {
                        discard(&old);
                    }
                }
            } else {
                self.best_path = Some(path);
            }
        }
        if cfg.save_last {
            let path = dir.join("last.safetensors");
            self.last_location = save(&path)?;
            self.last_path = Some(path);
        }
        Ok(())
    }
}

/// The median of measured step times (forward, backward and optimizer step; no data loading).
fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    (!v.is_empty()).then(|| v[v.len() / 2])
}

fn better(mode: Mode, new: f64, old: f64, min_delta: f64) -> bool {
    match mode {
        Mode::Max => new > old + min_delta,
        Mode::Min => new < old - min_delta,
    }
}

/// Where `ckpt_path` points: a file, or `last`: the newest `last.safetensors` among this task's runs.
pub fn resolve_ckpt_path(
    ckpt: &str,
    exp: &Experiment,
    output_dir: &Path,
    shard: Option<usize>,
) -> anyhow::Result<PathBuf> {
    // Rank r of a sharded (FSDP) run reads its own part, found beside rank 0's file.
    let part = |url: crate::s3::S3Url| match shard {
        Some(r) => url.with_file_name(&crate::strategy::fsdp::shard_file_name(url.file_name(), r)),
        None => url,
    };
    if crate::s3::is_s3(ckpt) {
        return fetch_remote_checkpoint(&part(crate::s3::S3Url::parse(ckpt)?), output_dir);
    }
    if ckpt == "last" {
        if let Some(prefix) = remote_checkpoint_prefix(exp)? {
            let last = prefix.join("last.safetensors");
            if crate::s3::exists(&last)? {
                return fetch_remote_checkpoint(&part(last), output_dir);
            }
        }
    }
    let local = resolve_local_checkpoint(ckpt, exp, output_dir)?;
    Ok(match shard {
        Some(r) => crate::strategy::fsdp::shard_path(&local, r),
        None => local,
    })
}

/// `ckpt_path` on this machine: a file, or `last` (the newest run's `checkpoints/last.safetensors`).
fn resolve_local_checkpoint(
    ckpt: &str,
    exp: &Experiment,
    output_dir: &Path,
) -> anyhow::Result<PathBuf> {
    if ckpt != "last" {
        let p = PathBuf::from(ckpt);
        anyhow::ensure!(p.is_file(), "ckpt_path={ckpt}: no such checkpoint file");
        return Ok(p);
    }
    let runs = output_dir
        .parent()
        .context("the run directory has no parent")?;
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(runs)
        .map(|r| {
            r.flatten()
                .map(|e| e.path().join("checkpoints").join("last.safetensors"))
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    candidates.sort();
    candidates.pop().with_context(|| {
        format!(
            "ckpt_path=last: no checkpoints/last.safetensors in any earlier run of '{}' under {}",
            exp.task_name,
            runs.display()
        )
    })
}

/// `callbacks.model_checkpoint.dirpath` when it is an `s3://` prefix.
fn remote_checkpoint_prefix(exp: &Experiment) -> anyhow::Result<Option<crate::s3::S3Url>> {
    match &exp.callbacks.model_checkpoint {
        Some(c) if crate::s3::is_s3(&c.dirpath) => Ok(Some(crate::s3::S3Url::parse(&c.dirpath)?)),
        _ => Ok(None),
    }
}

/// Where a resumed run came from: the remote URL for checkpoints fetched from S3, else the file.
fn checkpoint_origin(path: &Path, output_dir: &Path, exp: &Experiment) -> String {
    if path.starts_with(output_dir.join(".resume")) {
        if let Some(ckpt) = exp.ckpt_path.as_deref().filter(|c| crate::s3::is_s3(c)) {
            return ckpt.to_string();
        }
        if let Ok(Some(prefix)) = remote_checkpoint_prefix(exp) {
            return prefix.join("last.safetensors").to_string();
        }
    }
    path.display().to_string()
}

/// Download a checkpoint from S3 into the run directory (`.resume/`) for loading.
fn fetch_remote_checkpoint(url: &crate::s3::S3Url, output_dir: &Path) -> anyhow::Result<PathBuf> {
    let name = url
        .key
        .rsplit('/')
        .next()
        .unwrap_or("checkpoint.safetensors");
    let local = output_dir.join(".resume").join(name);
    tracing::info!("downloading {url}");
    crate::s3::download(url, &local).with_context(|| format!("ckpt_path={url}"))?;
    Ok(local)
}

/// Refuse, by name, what the experiment asks for that this build cannot do yet, rather than ignore it.
pub fn check_supported(exp: &Experiment) -> anyhow::Result<()> {
    let t = &exp.trainer;
    let mut missing: Vec<String> = Vec::new();
    crate::strategy::dp::check_placement(exp, &|k| std::env::var(k).ok())?;
    if t.strategy == Strategy::Single
        && (t.num_nodes > 1 || matches!(t.devices, Devices::Count(n) if n > 1))
    {
        missing
            .push("trainer.strategy=single with several devices or nodes; use trainer=ddp (or trainer=dp)".into());
    }
    if matches!(t.strategy, Strategy::Ddp | Strategy::Fsdp) && !cfg!(feature = "torch") {
        missing.push(format!(
            "trainer.strategy={}: its collectives are libtorch's c10d (Gloo), which this build does not \
             have; eval \"$(scripts/install-libtorch.sh)\" and rebuild with --features torch",
            t.strategy
        ));
    }
    if t.sync_batchnorm && t.strategy == Strategy::Dp {
        missing.push(
            "trainer.sync_batchnorm=true with trainer.strategy=dp: SyncBatchNorm reduces over the ranks of a \
             process group (ddp, fsdp), as PyTorch's does; use trainer=ddp, or set \
             trainer.sync_batchnorm=false"
                .into(),
        );
    }
    if matches!(t.strategy, Strategy::Ddp | Strategy::Fsdp)
        && (t.auto_scale_batch_size.is_some() || exp.callbacks.batch_size_finder.is_some())
    {
        missing.push(format!(
            "trainer.auto_scale_batch_size with trainer.strategy={}: find the batch size with one device \
             (trainer=single), then train with it",
            t.strategy
        ));
    }
    if matches!(t.accelerator, Accelerator::Gpu | Accelerator::Cuda)
        && exp.backend == crate::schema::Backend::Candle
    {
        missing.push(
            "trainer.accelerator=gpu on backend=candle: Candle's CUDA path; use backend=tch for GPUs, \
             or trainer.accelerator=cpu (or auto)"
                .into(),
        );
    }
    if exp.backend == crate::schema::Backend::Tch && !cfg!(feature = "torch") {
        missing.push(
            "backend=tch: this build has no libtorch; eval \"$(scripts/install-libtorch.sh)\" and \
             rebuild with --features torch"
                .into(),
        );
    }
    if exp.backend == crate::schema::Backend::Candle
        && !matches!(t.precision, Precision::Full | Precision::MixedBf16)
    {
        missing.push(format!(
            "trainer.precision={}: the Candle CPU backend runs 32-true and bf16-mixed only (fp16 with loss \
             scaling and pure-bf16 weights need backend=tch)",
            serde_json::to_value(t.precision).unwrap_or_default().as_str().unwrap_or("?")
        ));
    }
    let remote_dir = exp
        .callbacks
        .model_checkpoint
        .as_ref()
        .is_some_and(|c| crate::s3::is_s3(&c.dirpath));
    let remote_ckpt = exp.ckpt_path.as_deref().is_some_and(crate::s3::is_s3);
    if (remote_dir || remote_ckpt) && !crate::s3::AVAILABLE {
        missing.push(
            "s3:// checkpoints (callbacks.model_checkpoint.dirpath / ckpt_path): this build has no S3 \
             support; rebuild with `cargo build --release --features s3`"
                .into(),
        );
    }
    if missing.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "this build cannot run the experiment as configured yet; not implemented:\n    - {}",
        missing.join("\n    - ")
    )
}

/// The console logger's bar (batches, ETA, loss, throughput) when stdout is a terminal and the logger is
/// not in plain mode; otherwise none, and the per-epoch lines are the console output.
fn progress_bar(
    exp: &Experiment,
    batches: usize,
    epoch: u64,
    max_epochs: u64,
) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    let console = exp.logger.console.as_ref()?;
    if console.plain || !std::io::stdout().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(batches as u64);
    let style = indicatif::ProgressStyle::with_template(
        "epoch {prefix} [{bar:30}] {pos}/{len} ETA {eta} {msg}",
    )
    .ok()?
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(format!("{}/{max_epochs}", epoch + 1));
    Some(bar)
}

/// Print parameters per tensor and the total (the ModelSummary callback).
fn print_model_summary(state: &crate::tensor::StateDict, max_depth: u64) {
    let mut groups: BTreeMap<String, usize> = BTreeMap::new();
    for (name, t) in state.iter().filter(|(k, _)| !k.starts_with("optimizer.")) {
        let key: Vec<&str> = name.split('.').take(max_depth.max(1) as usize).collect();
        *groups.entry(key.join(".")).or_default() += t.numel();
    }
    let total: usize = groups.values().sum();
    tracing::info!("{:<32} {:>12}", "module", "params");
    for (name, n) in &groups {
        tracing::info!("{name:<32} {n:>12}");
    }
    tracing::info!("{:<32} {total:>12}", "total trainable");
}

/// The batch-size finder's settings when the run asks for one: `callbacks.batch_size_finder`, with its mode
/// taken from `trainer.auto_scale_batch_size` when that is set (Lightning 1.x's flag).
fn finder_config(exp: &Experiment) -> anyhow::Result<Option<crate::schema::BatchSizeFinder>> {
    let mut cfg = match (
        &exp.callbacks.batch_size_finder,
        exp.trainer.auto_scale_batch_size,
    ) {
        (None, None) => return Ok(None),
        (Some(c), _) => c.clone(),
        (None, Some(_)) => serde_json::from_value(serde_json::json!({}))?,
    };
    if let Some(mode) = exp.trainer.auto_scale_batch_size {
        cfg.mode = mode;
    }
    if !matches!(
        exp.trainer.fast_dev_run,
        FastDevRun::Flag(false) | FastDevRun::Batches(0)
    ) {
        tracing::warn!(
            "batch size finder skipped: trainer.fast_dev_run is set (as Lightning does)"
        );
        return Ok(None);
    }
    Ok(Some(cfg))
}

/// Run the batch-size finder: real trials of `steps_per_trial` training steps on the training set, each
/// with a fresh engine, measuring the heap's peak above what was in use before the trial.
fn find_batch_size(
    exp: &Experiment,
    cfg: &crate::schema::BatchSizeFinder,
) -> anyhow::Result<crate::callbacks::batch_size_finder::Finding> {
    let on_gpu = matches!(
        exp.trainer.accelerator,
        Accelerator::Gpu | Accelerator::Cuda
    );
    anyhow::ensure!(
        on_gpu || cfg.max_memory.is_some() || cfg.max_val.is_some(),
        "the batch size finder on the CPU needs a memory budget: set callbacks.batch_size_finder.max_memory \
         (bytes; e.g. +callbacks.batch_size_finder.max_memory=4000000000) or max_val — nothing runs out of \
         device memory here"
    );
    anyhow::ensure!(
        cfg.max_memory.is_none() || crate::memory::is_counting(),
        "callbacks.batch_size_finder.max_memory needs heap accounting, which only the `train` binary installs"
    );
    data::download::ensure(&exp.data)?;
    let train_set = data::open(&exp.data, Split::Train, exp.seed)?;
    let sampler = DistributedSampler::single(train_set.len(), true, exp.seed);
    let indices = sampler.indices(0);
    let steps = cfg.steps_per_trial.max(1) as usize;
    let finding = crate::callbacks::batch_size_finder::search(cfg, train_set.len(), |b| {
        let mut trial_exp = exp.clone();
        trial_exp.data.batch_size = b;
        let before = crate::memory::reset_peak();
        {
            let mut engine = crate::strategy::engine(&trial_exp)?;
            let spec = LoaderSpec {
                dataset: train_set.clone(),
                transforms: Arc::new(exp.data.train_transforms.clone()),
                batch_size: b,
                drop_last: false,
                num_workers: exp.data.num_workers,
                prefetch: 2,
                seed: exp.seed,
            };
            // Exactly `steps` steps, into further epochs when one has fewer batches.
            let mut done = 0;
            for epoch in 0.. {
                for batch in EpochLoader::new(&spec, epoch, &indices).take(steps - done) {
                    engine.forward_backward(&batch?, 1.0)?;
                    engine.optimizer_step(exp.optimizer.lr, None, None)?;
                    done += 1;
                }
                if done >= steps {
                    break;
                }
            }
        }
        Ok(crate::memory::peak().saturating_sub(before) as u64)
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

/// Train and validate as the experiment says, writing everything under `output_dir`. With a batch-size
/// finder configured, the batch size is found first and the run trains with it.
pub fn fit(exp: &Experiment, output_dir: &Path, config_yaml: &str) -> anyhow::Result<Summary> {
    fit_on(exp, output_dir, config_yaml, None)
}

/// `fit` as one rank of a distributed run (`dist`), or alone (`None`).
pub fn fit_on(
    exp: &Experiment,
    output_dir: &Path,
    config_yaml: &str,
    dist: Option<&crate::comm::Distributed>,
) -> anyhow::Result<Summary> {
    check_supported(exp)?; // also checked before the run directory is made; kept for library callers
    let Some(cfg) = finder_config(exp)? else {
        return fit_with(exp, output_dir, config_yaml, None, dist);
    };
    let finding = find_batch_size(exp, &cfg)?;
    let mut tuned = exp.clone();
    tuned.data.batch_size = finding.found;
    if !cfg.fit_after {
        tuned.trainer.max_epochs = 0;
    }
    fit_with(&tuned, output_dir, config_yaml, Some(finding), dist)
}

fn fit_with(
    exp: &Experiment,
    output_dir: &Path,
    config_yaml: &str,
    finding: Option<crate::callbacks::batch_size_finder::Finding>,
    dist: Option<&crate::comm::Distributed>,
) -> anyhow::Result<Summary> {
    let started = Instant::now();
    // Distributed: every rank trains; only rank 0 (the leader) writes logs, checkpoints and the summary.
    let comm = dist.map(|d| d.comm.as_ref());
    let lead = dist.is_none_or(|d| d.is_leader());
    let (rank, world) = dist.map_or((0, 1), |d| (d.rank, d.world_size));
    let global = |stats: StepStats| -> anyhow::Result<StepStats> {
        match comm {
            Some(c) => crate::comm::collective::sum_stats(c, &stats),
            None => Ok(stats),
        }
    };
    let grad_sync = crate::strategy::ddp::GradSync::of(exp);
    if grad_sync.gradient_as_bucket_view
        && exp.backend == crate::schema::Backend::Candle
        && comm.is_some()
    {
        tracing::warn!(
            "trainer.ddp.gradient_as_bucket_view=true has no effect with backend=candle: its gradients \
             are averaged through host buffers after the backward pass (backend=tch uses libtorch's reducer)"
        );
    }
    // Ranks' clocks differ: a stop decision taken on one rank's clock (the Timer) is taken by all, at the
    // same step, so none is left waiting in a collective.
    let agree = |here: bool| match comm {
        Some(c) => crate::comm::collective::any(c, here),
        None => Ok(here),
    };
    reset_peak_rss();
    let mut timer = crate::callbacks::timer::Timer::from_config(exp.callbacks.timer.as_ref())?;
    let t = &exp.trainer;
    let fast_dev = match t.fast_dev_run {
        FastDevRun::Flag(true) => Some(1usize),
        FastDevRun::Batches(n) if n > 0 => Some(n as usize),
        _ => None,
    };
    let overfit = match t.overfit_batches {
        Limit0::Batches(n) if n > 0 => Some(Limit::Batches(n)),
        Limit0::Fraction(f) if f > 0.0 => Some(Limit::Fraction(f)),
        _ => None,
    };

    // One download per run: rank 0 fetches, the others wait for it and then only check the files.
    match comm {
        Some(c) => {
            if lead {
                data::download::ensure(&exp.data)?;
            }
            c.barrier()
                .context("waiting for rank 0 to fetch the data set")?;
            if !lead {
                data::download::ensure(&exp.data)?;
            }
        }
        None => data::download::ensure(&exp.data)?,
    }
    let train_set = data::open(&exp.data, Split::Train, exp.seed)?;
    let val_set = if overfit.is_some() {
        train_set.clone()
    } else {
        data::open(&exp.data, Split::Val, exp.seed)?
    };
    anyhow::ensure!(!train_set.is_empty(), "the training set is empty");
    let loader = |set: Arc<dyn data::Dataset>,
                  transforms: &Vec<crate::schema::Transform>,
                  drop_last: bool| LoaderSpec {
        dataset: set,
        transforms: Arc::new(transforms.clone()),
        batch_size: exp.data.batch_size,
        drop_last,
        num_workers: exp.data.num_workers,
        prefetch: 2,
        seed: exp.seed,
    };
    let train_spec = loader(
        train_set.clone(),
        &exp.data.train_transforms,
        exp.data.drop_last,
    );
    let val_spec = loader(val_set.clone(), &exp.data.val_transforms, false);
    // PyTorch's DistributedSampler: rank r of `world` takes every world-th index (padded to equal shares).
    let sampler = |len: usize, shuffle: bool| DistributedSampler {
        num_replicas: world,
        rank,
        ..DistributedSampler::single(len, shuffle, exp.seed)
    };
    let train_sampler = sampler(train_set.len(), overfit.is_none());
    // Validation sees every sample exactly once, so distributed metrics equal one device's (Lightning
    // repeats samples to even out the shares). A rank whose share runs out first keeps taking part in
    // the others' collectives (`run_validation`).
    let val_sampler = DistributedSampler {
        pad: false,
        ..sampler(val_set.len(), false)
    };

    let available = crate::data::loader::batches_of(
        &train_sampler.indices(0),
        exp.data.batch_size,
        exp.data.drop_last,
    )
    .len();
    let train_batches = match (fast_dev, overfit) {
        (Some(n), _) => n.min(available),
        (None, Some(limit)) => limited(available, limit),
        (None, None) => limited(available, t.limit_train_batches),
    };
    let val_batches_of = |samples: usize| {
        let available = samples.div_ceil(exp.data.batch_size);
        match (fast_dev, overfit) {
            (Some(n), _) => n.min(available),
            (None, Some(_)) => train_batches,
            (None, None) => limited(available, t.limit_val_batches),
        }
    };
    // Rank 0's share is the largest: every rank validates when it has batches (a rank with none still
    // takes part in the collectives), and as many rounds as it has.
    let val_rounds = (
        val_batches_of(val_sampler.num_samples()),
        val_batches_of(val_set.len().div_ceil(world)),
    );
    let validates = val_rounds.1 > 0;
    anyhow::ensure!(
        train_batches > 0,
        "no training batches: check data.batch_size and trainer.limit_train_batches"
    );
    let accumulate = t.accumulate_grad_batches.max(1) as usize;
    let steps_per_epoch = train_batches.div_ceil(accumulate) as u64;
    let max_epochs = if fast_dev.is_some() { 1 } else { t.max_epochs };
    let total_steps = if t.max_steps > 0 {
        t.max_steps as u64
    } else {
        max_epochs * steps_per_epoch
    };
    let schedule = Schedule::new(
        &exp.scheduler,
        exp.optimizer.lr,
        total_steps,
        steps_per_epoch,
    );

    // SyncBatchNorm: BatchNorm layers on this thread use the global batch's statistics for the whole run.
    let _sync_batchnorm = crate::strategy::sync_batchnorm::enter(
        dist.filter(|_| t.sync_batchnorm).map(|d| d.comm.clone()),
    );
    let mut engine: Box<dyn backend::Engine + '_> = crate::strategy::engine(exp)?;
    let val_sync = match comm {
        Some(comm) => Some(ValidationSync {
            comm,
            // DDP's broadcast_buffers; FSDP leaves each rank its own (as PyTorch's does).
            buffers: t.strategy == Strategy::Ddp
                && !t.sync_batchnorm
                && engine.state_dict()?.keys().any(|k| k.contains("running_")),
        }),
        None => None,
    };
    if let Some(ms) = exp.callbacks.model_summary.as_ref().filter(|_| lead) {
        print_model_summary(&engine.state_dict()?, ms.max_depth);
    }
    let sharded_checkpoints = t.strategy == Strategy::Fsdp
        && t.fsdp.as_ref().map(|f| f.state_dict_type)
            == Some(crate::schema::StateDictType::Sharded);
    if t.strategy == Strategy::Fsdp {
        let c = comm.context("trainer.strategy=fsdp runs as ranks of a process group")?;
        // Every rank shards rank 0's initial model; later loads (pretrained, resume) read the same file
        // on every rank, or each rank its own shard.
        crate::comm::collective::broadcast_state(c, engine.as_mut())
            .context("broadcasting rank 0's model to every rank")?;
        engine = Box::new(crate::strategy::fsdp::ShardedEngine::new(exp, engine, c)?);
    }
    let callbacks_on = fast_dev.is_none();
    let ckpt_cfg = exp
        .callbacks
        .model_checkpoint
        .as_ref()
        .filter(|_| callbacks_on);
    let stop_cfg = exp
        .callbacks
        .early_stopping
        .as_ref()
        .filter(|_| callbacks_on);

    let mut state = TrainingState {
        epoch: 0,
        global_step: 0,
        metrics: HashMap::new(),
        best: None,
        epochs_without_improvement: 0,
        batches_done: 0,
    };
    if let Some(file) = &exp.model.pretrained {
        let path = Path::new(file);
        let loaded = checkpoint::load(path).with_context(|| format!("model.pretrained={file}"))?;
        let kept = engine
            .load_pretrained(&loaded.state)
            .with_context(|| format!("model.pretrained={file}"))?;
        tracing::info!(
            "loaded pretrained weights from {file}; newly initialised: {}",
            if kept.is_empty() {
                "none".into()
            } else {
                kept.join(", ")
            }
        );
    }
    let mut resumed_from = None;
    if let Some(ckpt) = &exp.ckpt_path {
        let shard = (sharded_checkpoints && rank > 0).then_some(rank);
        let path = resolve_ckpt_path(ckpt, exp, output_dir, shard)?;
        let loaded = checkpoint::load(&path)?;
        engine
            .load_state_dict(&loaded.state)
            .with_context(|| format!("loading {}", path.display()))?;
        if let Some(training) = loaded.training {
            state = training;
        }
        tracing::info!(
            "Resumed from {} (epoch {}, step {})",
            path.display(),
            state.epoch,
            state.global_step
        );
        resumed_from = Some(checkpoint_origin(&path, output_dir, exp));
    }
    if let Some(c) = comm.filter(|_| t.strategy == Strategy::Ddp) {
        // DDP starts every replica from rank 0's weights, buffers and optimizer state.
        crate::comm::collective::broadcast_state(c, engine.as_mut())
            .context("broadcasting rank 0's model to every rank")?;
    }

    // DeviceStatsMonitor: the GPU is sampled only when the run is on one (NVML index 0 of the visible set).
    let mut device_stats = exp
        .callbacks
        .device_stats
        .as_ref()
        .filter(|_| lead)
        .map(|d| {
            crate::callbacks::device_stats::DeviceStatsMonitor::start(
                std::time::Duration::from_millis(d.sample_every_ms.max(1)),
                matches!(t.accelerator, Accelerator::Gpu | Accelerator::Cuda).then_some(0),
            )
        });
    let mut csv = if let (Some(csv_config), true) = (&exp.logger.csv, callbacks_on && lead) {
        let mut extra: Vec<&'static str> = Vec::new();
        if t.precision == Precision::Mixed16 {
            extra.push("loss_scale");
        }
        if exp.callbacks.device_stats.is_some() {
            extra.extend(crate::callbacks::device_stats::COLUMNS);
        }
        Some(CsvLogger::open(
            output_dir,
            resumed_from.is_some(),
            &extra,
            csv_config.flush_every_n_steps,
        )?)
    } else {
        None
    };
    let mut tensorboard = match (&exp.logger.tensorboard, callbacks_on && lead) {
        (Some(tb), true) => Some(crate::loggers::tensorboard::TensorBoardWriter::create(
            &output_dir.join(&tb.dir),
        )?),
        _ => None,
    };
    let log_every = t.log_every_n_steps.max(1);
    let mut train_time = 0.0f64;
    let mut train_samples = 0u64;
    let mut status = "completed".to_string();
    // An s3:// dirpath: checkpoints are written (atomically) to the run's checkpoints/ and then uploaded.
    let remote_prefix = remote_checkpoint_prefix(exp)?;
    if let Some(prefix) = remote_prefix
        .as_ref()
        .filter(|_| ckpt_cfg.is_some() && lead)
    {
        // Fail before training, not at the first checkpoint, when the bucket cannot be reached.
        crate::s3::exists(&prefix.join("last.safetensors"))
            .with_context(|| format!("callbacks.model_checkpoint.dirpath={prefix}"))?;
    }
    let ckpt_dir = ckpt_cfg.map(|c| match &remote_prefix {
        Some(_) => output_dir.join("checkpoints"),
        None => PathBuf::from(&c.dirpath),
    });
    let publish = |path: &Path| -> anyhow::Result<String> {
        let Some(prefix) = &remote_prefix else {
            return Ok(path.display().to_string());
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let url = prefix.join(&name);
        let started = Instant::now();
        crate::s3::upload(path, &url)?;
        tracing::info!(
            "uploaded {url} ({} bytes) in {:.1}s",
            std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
            started.elapsed().as_secs_f64()
        );
        Ok(url.to_string())
    };
    let unpublish = |path: &Path| {
        let _ = std::fs::remove_file(path);
        if let (Some(prefix), Some(name)) = (&remote_prefix, path.file_name()) {
            if let Err(e) = crate::s3::delete(&prefix.join(&name.to_string_lossy())) {
                tracing::warn!("could not delete the replaced checkpoint: {e:#}");
            }
        }
    };
    let mut keeper = Keeper {
        ckpt_cfg,
        stop_cfg,
        dir: ckpt_dir.clone(),
        lead,
        rank,
        sharded: sharded_checkpoints,
        config_yaml,
        publish: &publish,
        unpublish: &unpublish,
        best_path: None,
        last_path: None,
        best_location: None,
        last_location: None,
    };
    let mut stopped_mid_epoch: Option<String> = None;
    let mut last_train = StepStats::default();
    let mut last_val: Option<StepStats> = None;

    // Lightning's val_check_interval: a fraction of the epoch's batches, or every N batches.
    let val_every = match t.val_check_interval {
        Limit::Fraction(f) if f < 1.0 => Some(((train_batches as f64 * f).floor() as usize).max(1)),
        Limit::Fraction(_) => None,
        Limit::Batches(n) => Some((n as usize).max(1)),
    };
    if let Some(n) = val_every {
        anyhow::ensure!(
            matches!(t.val_check_interval, Limit::Fraction(_)) || n <= train_batches,
            "trainer.val_check_interval={n} is more than the {train_batches} training batches of an epoch: \
             use at most {train_batches}, or a fraction such as 0.25"
        );
    }
    let val_indices = val_sampler.indices(0);
    let mut step_times: Vec<f64> = Vec::new();
    // LearningRateMonitor: `lr` is logged only when the callback is configured: on epoch rows always, on
    // step rows with `logging_interval: step`.
    let lr_each_step = matches!(
        &exp.callbacks.lr_monitor,
        Some(m) if m.logging_interval == crate::schema::Interval::Step
    );
    let lr_each_epoch = exp.callbacks.lr_monitor.is_some();
    let mut step_compute = 0.0;
    if let Some(t) = timer.as_mut() {
        t.start();
    }

    'epochs: while state.epoch < max_epochs {
        let epoch = state.epoch;
        let epoch_start = Instant::now();
        // Resumed from a mid-epoch checkpoint: this epoch's first batches are trained already. The
        // sampler's order and the augmentation (keyed by sample) are the same, so skipping is exact.
        let skip = std::mem::take(&mut state.batches_done) as usize;
        let all_indices = train_sampler.indices(epoch);
        let indices = &all_indices[(skip * exp.data.batch_size).min(all_indices.len())..];
        let mut epoch_stats = StepStats::default();
        let mut window = StepStats::default();
        let mut lr_now = schedule.at(state.global_step).lr;
        let bar = progress_bar(exp, train_batches, epoch, max_epochs).filter(|_| lead);
        for (i, batch) in EpochLoader::new(&train_spec, epoch, indices)
            .take(train_batches.saturating_sub(skip))
            .enumerate()
        {
            let i = i + skip;
            let batch = batch?;
            let step_start = Instant::now();
            let ends_window = (i + 1).is_multiple_of(accumulate) || i + 1 == train_batches;
            if let (Some(c), true) = (comm, ends_window) {
                engine.arm_gradient_sync(c, &grad_sync)?;
            }
            let stats = engine.forward_backward(&batch, 1.0 / accumulate as f64)?;
            step_compute += step_start.elapsed().as_secs_f64();
            anyhow::ensure!(
                stats.loss().is_finite(),
                "the training loss became {} at epoch {epoch}, step {}; lower optimizer.lr or set trainer.gradient_clip_val",
                stats.loss(),
                state.global_step
            );
            epoch_stats.add(&stats);
            window.add(&stats);
            train_samples += batch.len() as u64;
            if let Some(bar) = &bar {
                bar.inc(1);
                bar.set_message(format!(
                    "loss {:.4}  {:.0} img/s",
                    stats.loss(),
                    epoch_stats.count as f64 / epoch_start.elapsed().as_secs_f64().max(1e-9)
                ));
            }
            if ends_window {
                let point = schedule.at(state.global_step);
                lr_now = point.lr;
                let update_start = Instant::now();
                if let Some(c) = comm {
                    engine.all_reduce_gradients(c, &grad_sync)?;
                }
                engine.optimizer_step(point.lr, point.momentum, t.gradient_clip_val)?;
                step_times.push(step_compute + update_start.elapsed().as_secs_f64());
                step_compute = 0.0;
                state.global_step += 1;
                if state.global_step.is_multiple_of(log_every) {
                    let all = global(window)?;
                    let mut scalars = vec![("train/loss", all.loss()), ("train/acc1", all.acc1())];
                    if lr_each_step {
                        scalars.push(("lr", point.lr));
                    }
                    if let Some(scale) = engine.loss_scale() {
                        scalars.push(("loss_scale", scale));
                    }
                    if let Some(csv) = csv.as_mut() {
                        let mut row = BTreeMap::from_iter(scalars.iter().copied());
                        row.insert("epoch", epoch as f64);
                        row.insert("step", state.global_step as f64);
                        csv.log(&row)?;
                    }
                    if let Some(tb) = tensorboard.as_mut() {
                        tb.scalars(state.global_step, &scalars)?;
                    }
                    window = StepStats::default();
                }
                let mid_epoch_check = val_every.is_some_and(|n| (i + 1).is_multiple_of(n))
                    && i + 1 < train_batches
                    && validates
                    && (epoch + 1).is_multiple_of(t.check_val_every_n_epoch.max(1));
                if mid_epoch_check {
                    let v = run_validation(
                        engine.as_mut(),
                        &val_spec,
                        &val_indices,
                        val_rounds,
                        val_sync,
                    )?;
                    let scalars = [
                        ("val/loss", v.loss()),
                        ("val/acc1", v.acc1()),
                        ("val/acc5", v.acc5()),
                    ];
                    if let Some(csv) = csv.as_mut() {
                        let mut row = BTreeMap::from(scalars);
                        row.insert("epoch", epoch as f64);
                        row.insert("step", state.global_step as f64);
                        csv.log(&row)?;
                    }
                    if let Some(tb) = tensorboard.as_mut() {
                        tb.scalars(state.global_step, &scalars)?;
                    }
                    tracing::info!(
                        "epoch {}/{max_epochs}  step {}  (batch {}/{train_batches})  val/loss {:.4}  val/acc1 {:.3}  val/acc5 {:.3}",
                        epoch + 1,
                        state.global_step,
                        i + 1,
                        v.loss(),
                        v.acc1(),
                        v.acc5()
                    );
                    // Lightning's on_validation_end: checkpoints and early stopping follow every
                    // validation, so a checkpoint here records how far into the epoch it was taken.
                    for (name, value) in scalars {
                        state.metrics.insert(name.into(), value);
                    }
                    last_val = Some(v);
                    state.batches_done = (i + 1) as u64;
                    let stop = keeper.on_validation_end(engine.as_ref(), &mut state, epoch)?;
                    state.batches_done = 0;
                    if let Some(why) = stop {
                        stopped_mid_epoch = Some(why);
                        break;
                    }
                }
                if t.max_steps > 0 && state.global_step >= t.max_steps as u64 {
                    status = "max_steps reached".into();
                    train_time += epoch_start.elapsed().as_secs_f64();
                    state.epoch += 1;
                    last_train = global(epoch_stats)?;
                    break 'epochs;
                }
                // Timer: out of time mid-epoch; the epoch ends here (validation, checkpoint, then stop).
                if let Some(t) = timer.as_mut() {
                    if t.stop_after_step(agree)? {
                        break;
                    }
                }
            }
        }
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        let epoch_train_time = epoch_start.elapsed().as_secs_f64();
        train_time += epoch_train_time;
        let epoch_stats = global(epoch_stats)?;
        last_train = epoch_stats;
        state.epoch += 1;

        let validate = validates
            && stopped_mid_epoch.is_none()
            && (state.epoch.is_multiple_of(t.check_val_every_n_epoch.max(1))
                || state.epoch == max_epochs);
        let mut val = None;
        if validate {
            let v = run_validation(
                engine.as_mut(),
                &val_spec,
                &val_indices,
                val_rounds,
                val_sync,
            )?;
            val = Some(v);
            last_val = Some(v);
        }
        let throughput = epoch_stats.count as f64 / epoch_train_time.max(1e-9);
        let mut row = BTreeMap::from([
            ("epoch", epoch as f64),
            ("step", state.global_step as f64),
            ("train/loss", epoch_stats.loss()),
            ("train/acc1", epoch_stats.acc1()),
            ("epoch_time_s", epoch_train_time),
            ("samples_per_s", throughput),
        ]);
        state
            .metrics
            .insert("train/loss".into(), epoch_stats.loss());
        state
            .metrics
            .insert("train/acc1".into(), epoch_stats.acc1());
        if lr_each_epoch {
            row.insert("lr", lr_now);
        }
        if let Some(v) = val {
            row.insert("val/loss", v.loss());
            row.insert("val/acc1", v.acc1());
            row.insert("val/acc5", v.acc5());
            state.metrics.insert("val/loss".into(), v.loss());
            state.metrics.insert("val/acc1".into(), v.acc1());
            state.metrics.insert("val/acc5".into(), v.acc5());
        }
        if let Some(scale) = engine.loss_scale() {
            row.insert("loss_scale", scale);
        }
        if let Some(monitor) = device_stats.as_mut() {
            row.extend(monitor.epoch_metrics());
        }
        if let Some(csv) = csv.as_mut() {
            csv.log(&row)?;
        }
        if let Some(tb) = tensorboard.as_mut() {
            let scalars: Vec<(&str, f64)> = row
                .iter()
                // With per-step lr the epoch's lr would repeat the last step's value.
                .filter(|(k, _)| {
                    let repeated_lr = lr_each_step && **k == "lr";
                    !matches!(**k, "epoch" | "step") && !repeated_lr
                })
                .map(|(k, v)| (*k, *v))
                .collect();
            tb.scalars(state.global_step, &scalars)?;
        }
        tracing::info!(
            "epoch {}/{max_epochs}  step {}  train/loss {:.4}  train/acc1 {:.3}{}  {:.1}s  {:.0} img/s",
            epoch + 1,
            state.global_step,
            epoch_stats.loss(),
            epoch_stats.acc1(),
            val.map(|v| format!("  val/loss {:.4}  val/acc1 {:.3}  val/acc5 {:.3}", v.loss(), v.acc1(), v.acc5()))
                .unwrap_or_default(),
            epoch_train_time,
            throughput
        );

        // ModelCheckpoint + EarlyStopping, unless they already ran on this point (a mid-epoch validation
        // that stopped the run).
        let early_stop = match stopped_mid_epoch.take() {
            Some(why) => Some(why),
            None => keeper.on_validation_end(engine.as_ref(), &mut state, epoch)?,
        };
        if let Some(t) = timer.as_mut() {
            if let Some(why) = t.stop_at_epoch_end(agree)? {
                status = why;
                break;
            }
        }
        if let Some(why) = early_stop {
            status = why;
            break;
        }
    }

    let mut final_metrics: BTreeMap<String, f64> =
        state.metrics.iter().map(|(k, v)| (k.clone(), *v)).collect();
    if last_val.is_none() && last_train.count > 0 {
        final_metrics.insert("train/loss".into(), last_train.loss());
    }
    let monitor = ckpt_cfg
        .and_then(|c| c.monitor.clone())
        .or_else(|| stop_cfg.map(|s| s.monitor.clone()));
    if exp.trainer.max_epochs == 0 && finding.is_some() {
        status = "batch size found; not trained (fit_after=false)".into();
    }
    let train_samples = match comm {
        Some(c) => {
            let mut n = [train_samples as f64];
            c.all_reduce_f64(&mut n, crate::comm::collective::ReduceOp::Sum)?;
            n[0] as u64
        }
        None => train_samples,
    };
    // Each rank fills its row; the sum leaves every row in place.
    const FIELDS: usize = 4;
    let mut bytes = vec![0.0f64; FIELDS * world];
    let mine = engine.state_bytes();
    bytes[FIELDS * rank..FIELDS * (rank + 1)].copy_from_slice(&[
        mine.parameters as f64,
        mine.gradients as f64,
        mine.optimizer_state as f64,
        mine.unsharded_peak as f64,
    ]);
    if let Some(c) = comm {
        c.all_reduce_f64(&mut bytes, crate::comm::collective::ReduceOp::Sum)?;
    }
    let state_bytes_per_rank = bytes
        .chunks(FIELDS)
        .map(|r| backend::StateBytes {
            parameters: r[0] as u64,
            gradients: r[1] as u64,
            optimizer_state: r[2] as u64,
            unsharded_peak: r[3] as u64,
        })
        .collect();
    let summary = Summary {
        state_bytes_per_rank,
        task_name: exp.task_name.clone(),
        status,
        backend: format!("{:?}", exp.backend).to_lowercase(),
        model: format!("{:?}", exp.model.name).to_lowercase(),
        data: format!("{:?}", exp.data.name).to_lowercase(),
        strategy: exp.trainer.strategy.to_string(),
        precision: serde_json::to_value(exp.trainer.precision)?
            .as_str()
            .unwrap_or_default()
            .to_string(),
        num_nodes: dist.map_or(1, |d| d.num_nodes),
        devices: world / dist.map_or(1, |d| d.num_nodes.max(1)) * engine.replicas(),
        batch_size: exp.data.batch_size,
        global_batch_size: exp.data.batch_size * accumulate * world,
        num_parameters: engine.num_parameters(),
        epochs_completed: state.epoch,
        global_step: state.global_step,
        best: match (monitor, state.best) {
            (Some(monitor), Some((value, epoch))) => Some(BestMetric {
                monitor,
                value,
                epoch,
            }),
            _ => None,
        },
        final_metrics,
        wall_time_s: started.elapsed().as_secs_f64(),
        train_time_s: train_time,
        train_samples_per_s: train_samples as f64 / train_time.max(1e-9),
        median_step_time_s: median(&step_times),
        peak_rss_bytes: peak_rss_bytes(),
        best_checkpoint: keeper
            .best_location
            .or(keeper.best_path.map(|p| p.display().to_string())),
        last_checkpoint: keeper
            .last_location
            .or(keeper.last_path.map(|p| p.display().to_string())),
        resumed_from,
        batch_size_finder: finding,
        // Before device stats, whose sampler thread may take a sampling period to stop.
        timer: timer.map(|t| t.summary()),
        device_stats: device_stats.and_then(|m| m.finish(output_dir)),
    };
    if lead {
        crate::records::write_atomic(
            &output_dir.join("summary.json"),
            serde_json::to_string_pretty(&summary)?.as_bytes(),
        )?;
    }
    Ok(summary)
}

#[cfg(test)]
mod peak_rss_tests {
    /// The peak RSS can be reset: after touching 512 MiB and freeing it, a reset brings the peak back
    /// well under it (what keeps a sweep's jobs from inheriting each other's peaks). The margin is wide
    /// because other tests run in the same process.
    #[test]
    fn peak_rss_resets() {
        let big = vec![1u8; 512 << 20];
        std::hint::black_box(&big);
        let before = super::peak_rss_bytes().unwrap();
        assert!(before >= 512 << 20, "{before}");
        drop(big);
        super::reset_peak_rss();
        let after = super::peak_rss_bytes().unwrap();
        assert!(
            after < before - (128 << 20),
            "peak {before} -> {after} after reset"
        );
    }
}
