//! The fit loop: epochs of training batches in accumulation windows, an optimizer step at each window's
//! end, validation mid-epoch and at epoch ends, ModelCheckpoint and EarlyStopping after every validation,
//! the Timer, and a row of metrics to every sink. It executes the `LoopPlan`; what a step does on the
//! devices is the strategy's.

use super::checkpointing::{Keeper, Storage};
use super::profiler::Profiler;
use super::running_sums;
use super::stateful::{complete, Phase};
use super::summary::{median, peak_rss_bytes, BestMetric, InputWait, RunStatus, Summary};
use super::{DataSets, Job};
use crate::backend::{StateBytes, StepStats};
use crate::callbacks::batch_size_finder::Finding;
use crate::callbacks::device_stats::DeviceStatsMonitor;
use crate::callbacks::timer::Timer;
use crate::data::loader::EpochLoader;
use crate::loggers::{MetricSink, Row, RowKind};
use crate::optim::plateau::Plateau;
use crate::optim::schedule::{Point, Schedule};
use crate::optim::GradClip;
use crate::plan::LoopPlan;
use crate::schema::{Accelerator, Experiment, Interval, Precision, RunMetrics, SchedulerName};
use crate::storage::checkpoint::TrainingState;
use crate::strategy::{Ranks, Strategy};
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

mod run_summary;

pub struct FitLoop<'a> {
    exp: &'a Experiment,
    /// What the run records: classification's or a registered loss's metrics.
    metrics: RunMetrics,
    output_dir: &'a std::path::Path,
    plan: &'a LoopPlan,
    data: &'a DataSets,
    strategy: Box<dyn Strategy>,
    ranks: Ranks,
    schedule: Schedule,
    /// ReduceLROnPlateau (`scheduler.name: plateau`): its rate replaces the schedule's.
    plateau: Option<Plateau>,
    sinks: Vec<Box<dyn MetricSink>>,
    /// The callbacks a crate registered (`callbacks.<name>` with their `_target_`).
    user_callbacks: super::user_callbacks::UserCallbacks,
    keeper: Keeper<'a>,
    timer: Option<Timer>,
    device_stats: Option<DeviceStatsMonitor>,
    /// LearningRateMonitor: `lr` on epoch rows always, on step rows with `logging_interval: step`.
    lr_each_step: bool,
    lr_each_epoch: bool,
    /// A search's pruner, shown each validation's metrics (rank 0 asks it; every rank agrees).
    judge: Option<&'a dyn super::ValidationJudge>,
    /// The learning rate of the last optimizer step (an epoch row's `lr`).
    lr_now: f64,
    pub state: TrainingState,
    pub status: RunStatus,
    /// A mid-epoch validation stopped the run (EarlyStopping): the epoch ends without another.
    stopped_mid_epoch: Option<RunStatus>,
    /// EarlyStopping's stop, held by `trainer.min_epochs` until enough epochs have run.
    held_stop: Option<RunStatus>,
    /// Seconds spent in training epochs (validation included, as Lightning's epoch time).
    train_time: f64,
    /// Samples this rank trained on.
    train_samples: u64,
    /// Each optimizer step's compute (forward, backward, update), without data loading.
    step_times: Vec<f64>,
    /// Seconds the training steps waited for the loader's next batch, and spent computing.
    input_wait: InputWait,
    last_train: StepStats,
    last_val: Option<StepStats>,
    /// `trainer.profiler`: each action's time (does nothing when off).
    pub profiler: Profiler,
    /// The strategy's actions as the profiler names them (`[Strategy]ddp.forward_backward`).
    actions: StrategyActions,
    /// `gradient_clip_val` with its algorithm.
    clip: Option<GradClip>,
    /// The step of the checkpoint the run resumed from.
    resumed_at: Option<u64>,
    /// Samples the test split measured (over every rank), once it ran.
    tested_samples: u64,
    /// `train predict`: the file written and its rows (rank 0's count).
    predicted: Option<(String, u64)>,
    /// The configured stateful metrics (`metrics:`), per phase.
    stateful: Option<super::stateful::StatefulMetrics>,
    /// The `on_step` metrics' values over the last training batch, for the next step row.
    step_metrics: Vec<(String, f64)>,
    /// The stateful metrics' values of the last validation, for its rows.
    val_metrics: Vec<(String, f64)>,
}

/// The profiler's names for the loop's own actions (Lightning's where it has one).
const TRAIN_EPOCH: &str = "run_training_epoch";
const TRAIN_BATCH: &str = "run_training_batch";
const TRAIN_NEXT: &str = "train_dataloader_next";
const VALIDATION: &str = "run_validation";
const VAL_NEXT: &str = "val_dataloader_next";
const TEST: &str = "run_test";
const LOG: &str = "log_metrics";
/// Reading a batch's loss and hits: on a GPU, the wait for the step's queued work.
const READ_STATS: &str = "read_batch_stats";
const CHECKPOINT: &str = "[Callback]ModelCheckpoint+EarlyStopping.on_validation_end";
const CHECKPOINT_TRAIN_END: &str = "[Callback]ModelCheckpoint.on_train_epoch_end";

struct StrategyActions {
    forward_backward: String,
    optimizer_step: String,
    validation_step: String,
}

impl StrategyActions {
    fn of(strategy: &str) -> Self {
        let name = |what: &str| format!("[Strategy]{strategy}.{what}");
        StrategyActions {
            forward_backward: name("forward_backward"),
            optimizer_step: name("optimizer_step"),
            validation_step: name("validation_step"),
        }
    }
}

/// How an epoch's batch loop ended.
enum EpochEnd {
    /// Every batch of the epoch was trained (or the Timer cut it short: the epoch still ends normally).
    Batches(StepStats),
    /// `max_steps` reached: training ends here, without the epoch's validation.
    MaxSteps,
    /// The cluster's warning signal: a checkpoint of this point was written; the run stops here.
    Preempted(RunStatus),
}

impl<'a> FitLoop<'a> {
    pub fn new(
        exp: &'a Experiment,
        job: &Job<'a>,
        plan: &'a LoopPlan,
        data: &'a DataSets,
        strategy: Box<dyn Strategy>,
        resumed: Option<TrainingState>,
        profiler: Profiler,
    ) -> anyhow::Result<Self> {
        let ranks = strategy.ranks().clone();
        let lead = ranks.is_global_zero();
        let resumed_at = resumed.as_ref().map(|t| t.global_step);
        let callbacks = &exp.callbacks;
        let ckpt_cfg = callbacks
            .model_checkpoint
            .as_ref()
            .filter(|_| plan.callbacks_on);
        let storage = Storage::of(exp)?;
        if ckpt_cfg.is_some() && lead {
            storage.check_reachable()?;
        }
        let lr_each_step = matches!(
            &callbacks.lr_monitor,
            Some(m) if m.logging_interval == Interval::Step
        );
        let mut timer = Timer::from_config(callbacks.timer.as_ref())?;
        if let Some(t) = timer.as_mut() {
            t.start();
        }
        let plateau = match exp.scheduler.name {
            SchedulerName::Plateau => {
                let mut p = Plateau::new(&exp.scheduler, exp.optimizer.lr)?;
                if let Some(state) = resumed.as_ref().and_then(|r| r.plateau.clone()) {
                    p.state = state;
                }
                Some(p)
            }
            _ => None,
        };
        Ok(FitLoop {
            plateau,
            schedule: Schedule::new(
                &exp.scheduler,
                exp.optimizer.lr,
                plan.total_steps,
                plan.steps_per_epoch,
            ),
            sinks: super::sinks::sinks(exp, job, plan, lead, resumed_at, lr_each_step)?,
            user_callbacks: super::user_callbacks::UserCallbacks::build(
                exp,
                job.output_dir,
                &ranks,
            )?,
            keeper: Keeper {
                dir: ckpt_cfg.map(|c| storage.local_dir(c, job.output_dir)),
                ckpt_cfg,
                stop_cfg: callbacks
                    .early_stopping
                    .as_ref()
                    .filter(|_| plan.callbacks_on),
                config_yaml: job.config_yaml,
                storage,
                best: None,
                best_path: resumed
                    .as_ref()
                    .and_then(|r| r.best_checkpoint.as_deref())
                    .map(std::path::PathBuf::from),
                last: None,
            },
            // DeviceStatsMonitor: the GPU is sampled only when the run is on one (NVML index 0 of the
            // visible set).
            device_stats: callbacks.device_stats.as_ref().filter(|_| lead).map(|d| {
                DeviceStatsMonitor::start(
                    std::time::Duration::from_millis(d.sample_every_ms.max(1)),
                    matches!(
                        exp.trainer.accelerator,
                        Accelerator::Gpu | Accelerator::Cuda
                    )
                    .then_some(0),
                )
            }),
            timer,
            lr_each_step,
            lr_each_epoch: callbacks.lr_monitor.is_some(),
            judge: job.judge,
            state: resumed.unwrap_or(TrainingState {
                epoch: 0,
                global_step: 0,
                metrics: HashMap::new(),
                best: None,
                epochs_without_improvement: 0,
                stop_best: None,
                batches_done: 0,
                plateau: None,
                best_checkpoint: None,
                running: None,
            }),
            status: RunStatus::Completed,
            stopped_mid_epoch: None,
            held_stop: None,
            train_time: 0.0,
            train_samples: 0,
            step_times: Vec::new(),
            input_wait: InputWait::default(),
            last_train: StepStats::default(),
            last_val: None,
            profiler,
            actions: StrategyActions::of(&exp.trainer.strategy.to_string()),
            clip: GradClip::of(
                exp.trainer.gradient_clip_val,
                exp.trainer.gradient_clip_algorithm,
            ),
            lr_now: exp.optimizer.lr,
            resumed_at,
            tested_samples: 0,
            predicted: None,
            stateful: super::stateful::StatefulMetrics::of(exp)?,
            step_metrics: Vec::new(),
            val_metrics: Vec::new(),
            output_dir: job.output_dir,
            metrics: RunMetrics::of(exp),
            exp,
            plan,
            data,
            strategy,
            ranks,
        })
    }

    /// Train until `max_epochs`, `max_steps`, EarlyStopping or the Timer ends it.
    pub fn run(mut self) -> anyhow::Result<Self> {
        while self.state.epoch < self.plan.max_epochs {
            let epoch = self.state.epoch;
            // A stop signal during the last epoch's last step, validation or checkpoints: the resume
            // point is this epoch's start.
            if self.stop_requested()? {
                self.status = self.preempt(epoch, 0)?;
                break;
            }
            let epoch_start = Instant::now();
            let end = self.train_epoch(epoch, epoch_start)?;
            self.profiler.record(TRAIN_EPOCH, epoch_start);
            let epoch_time = epoch_start.elapsed().as_secs_f64();
            self.train_time += epoch_time;
            if let EpochEnd::Preempted(status) = end {
                self.status = status;
                break;
            }
            self.state.epoch += 1;
            let stats = match end {
                EpochEnd::Preempted(_) => unreachable!("handled above"),
                EpochEnd::MaxSteps => {
                    self.status = RunStatus::MaxStepsReached;
                    break;
                }
                EpochEnd::Batches(stats) => stats,
            };
            if let Some(status) = self.end_epoch(epoch, stats, epoch_time)? {
                self.status = status;
                break;
            }
            if self
                .plan
                .max_steps
                .is_some_and(|max| self.state.global_step >= max)
            {
                self.status = RunStatus::MaxStepsReached;
                break;
            }
        }
        Ok(self)
    }

    /// The epoch's training batches. Resumed from a mid-epoch checkpoint, the epoch's first batches are
    /// trained already: the sampler's order and the augmentation (keyed by sample) are the same, so
    /// skipping them is exact.
    fn train_epoch(&mut self, epoch: u64, epoch_start: Instant) -> anyhow::Result<EpochEnd> {
        let plan = self.plan;
        let skip = std::mem::take(&mut self.state.batches_done) as usize;
        let order = self
            .data
            .train_sampler
            .order(epoch)
            .skip(skip * self.exp.data.batch_size);
        // Resumed mid-epoch: the sums so far over every rank continue on rank 0.
        let running = self.state.running.take().filter(|_| skip > 0);
        let (mut epoch_stats, mut window) = match running {
            Some(r) if self.ranks.is_global_zero() => (
                running_sums::from_sums(&r.epoch),
                running_sums::from_sums(&r.window),
            ),
            _ => (StepStats::default(), StepStats::default()),
        };
        let mut step_compute = 0.0;
        self.lr_now = self.point()?.lr;
        let bar = crate::loggers::console::progress_bar(
            self.exp,
            plan.train_batches,
            epoch,
            plan.max_epochs,
        )
        .filter(|_| self.ranks.is_global_zero());
        let mut batches = EpochLoader::new(&self.data.train_spec, epoch, &order)
            .take(plan.train_batches.saturating_sub(skip))
            .enumerate();
        loop {
            let fetch_start = Instant::now();
            let Some((i, batch)) = batches.next() else {
                break;
            };
            self.profiler.record(TRAIN_NEXT, fetch_start);
            self.input_wait.waiting += fetch_start.elapsed().as_secs_f64();
            let i = i + skip;
            let batch = batch?;
            let ends_window = plan.ends_window(i);
            let computed_before = step_compute;
            let step_start = Instant::now();
            // On a GPU the statistics are read (a wait for the device) after the optimizer step is
            // queued, so the device is not idle while the host queues the update.
            let pending = self.strategy.forward_backward_queued(
                &batch,
                1.0 / plan.accumulate as f64,
                ends_window,
            )?;
            step_compute += step_start.elapsed().as_secs_f64();
            self.profiler
                .record(&self.actions.forward_backward, step_start);
            if ends_window {
                let point = self.point()?;
                self.lr_now = point.lr;
                let update_start = Instant::now();
                let norm =
                    self.strategy
                        .optimizer_step(point.lr, point.momentum, self.step_clip())?;
                self.check_anomaly(norm, epoch)?;
                step_compute += update_start.elapsed().as_secs_f64();
                self.profiler
                    .record(&self.actions.optimizer_step, update_start);
            }
            let read_start = Instant::now();
            let stats = pending.resolve()?;
            step_compute += read_start.elapsed().as_secs_f64();
            self.profiler.record(READ_STATS, read_start);
            if let Some(m) = self.stateful.as_mut() {
                self.step_metrics = m.after_batch(Phase::Train, self.strategy.as_mut(), &batch)?;
            }
            // Per batch, so a window cut short at the epoch's end counts too.
            self.input_wait.computing += step_compute - computed_before;
            anyhow::ensure!(
                stats.loss().is_finite(),
                "the training loss became {} at epoch {epoch}, step {}; lower optimizer.lr or set trainer.gradient_clip_val",
                stats.loss(),
                self.state.global_step
            );
            epoch_stats.add(&stats);
            window.add(&stats);
            self.train_samples += batch.len() as u64;
            if let Some(bar) = &bar {
                bar.inc(1);
                bar.set_message(format!(
                    "loss {:.4}  {:.0} img/s",
                    stats.loss(),
                    epoch_stats.count as f64 / epoch_start.elapsed().as_secs_f64().max(1e-9)
                ));
            }
            if !ends_window {
                self.profiler.record(TRAIN_BATCH, step_start);
                continue;
            }
            self.step_times.push(step_compute);
            step_compute = 0.0;
            self.state.global_step += 1;
            if self
                .state
                .global_step
                .is_multiple_of(plan.log_every_n_steps)
            {
                self.log_step(epoch, std::mem::take(&mut window), self.lr_now)?;
            }
            self.profiler.record(TRAIN_BATCH, step_start);
            if plan.validates_after_batch(epoch, i) {
                self.state.running = Some(self.running_sums(epoch_stats, window)?);
                let stop = self.validate_mid_epoch(epoch, i + 1)?;
                self.state.running = None;
                if let Some(stop) = stop {
                    self.stopped_mid_epoch = Some(stop);
                    break;
                }
            }
            // `max_steps` on the epoch's last batch ends the epoch as usual (validation, checkpoints);
            // mid-epoch, ModelCheckpoint still writes what it writes at a training epoch's end, as
            // Lightning's does, so a stopped run keeps its weights.
            if plan
                .max_steps
                .is_some_and(|max| self.state.global_step >= max)
                && i + 1 < plan.train_batches
            {
                self.last_train = self.ranks.sum_stats(epoch_stats)?;
                self.state.running = Some(self.running_sums(epoch_stats, window)?);
                self.checkpoint_mid_epoch(epoch, i + 1)?;
                return Ok(EpochEnd::MaxSteps);
            }
            // On the epoch's last batch the epoch ends first (validation, checkpoints): the next check
            // is at the next epoch's start.
            if i + 1 < plan.train_batches && self.stop_requested()? {
                self.state.running = Some(self.running_sums(epoch_stats, window)?);
                return self.preempt(epoch, i + 1).map(EpochEnd::Preempted);
            }
            // Timer: out of time mid-epoch; the epoch ends here (validation, checkpoint, then stop).
            let ranks = &self.ranks;
            if let Some(t) = self.timer.as_mut() {
                if t.stop_after_step(|here| ranks.any(here))? {
                    break;
                }
            }
        }
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        Ok(EpochEnd::Batches(epoch_stats))
    }

    /// The clipping the optimizer step does; with `detect_anomaly` and no norm clipping, a limit no norm
    /// reaches, so the step measures the norm without changing the gradients.
    fn step_clip(&self) -> Option<GradClip> {
        match (self.clip, self.exp.trainer.detect_anomaly) {
            (None, true) => Some(GradClip::Norm(f64::INFINITY)),
            (clip, _) => clip,
        }
    }

    /// `detect_anomaly`: a NaN or infinite gradient norm stops the run (under `16-mixed` an infinite one
    /// is the loss scaler's skipped step, not an anomaly; clipping by value measures no norm).
    fn check_anomaly(&self, norm: f64, epoch: u64) -> anyhow::Result<()> {
        let t = &self.exp.trainer;
        let measured = matches!(self.step_clip(), Some(GradClip::Norm(_)));
        let skipped = norm == f64::INFINITY && t.precision == Precision::Mixed16;
        anyhow::ensure!(
            !t.detect_anomaly || !measured || norm.is_finite() || skipped,
            "trainer.detect_anomaly: the gradients became {norm} (their norm) at epoch {epoch}, step {}; \
             lower optimizer.lr, set trainer.gradient_clip_val, or look for a log/sqrt/division of zero \
             in the model or loss",
            self.state.global_step
        );
        Ok(())
    }

    /// `max_steps` reached after `batches_done` batches of the epoch, with no validation due: the
    /// checkpoints ModelCheckpoint writes at a training epoch's end (`last`, and the latest when nothing
    /// is monitored), recording how far into the epoch they were taken, so a resume continues there.
    fn checkpoint_mid_epoch(&mut self, epoch: u64, batches_done: usize) -> anyhow::Result<()> {
        self.state.batches_done = batches_done as u64;
        let saving = Instant::now();
        self.keeper
            .on_train_epoch_end(self.strategy.as_mut(), &self.state, epoch)?;
        self.profiler.record(CHECKPOINT_TRAIN_END, saving);
        self.state.batches_done = 0;
        Ok(())
    }

    /// Did a stop signal reach any rank? (Every rank asks at the same step, so they agree.)
    fn stop_requested(&self) -> anyhow::Result<bool> {
        Ok(crate::platform::signals::preemption_armed()
            && self
                .ranks
                .any(crate::platform::signals::preemption_requested())?)
    }

    /// The epoch's and the window's sums over every rank, for a mid-epoch checkpoint.
    fn running_sums(
        &self,
        epoch: StepStats,
        window: StepStats,
    ) -> anyhow::Result<crate::storage::checkpoint::RunningSums> {
        Ok(crate::storage::checkpoint::RunningSums {
            epoch: running_sums::to_sums(&self.ranks.sum_stats(epoch)?),
            window: running_sums::to_sums(&self.ranks.sum_stats(window)?),
        })
    }

    /// The cluster warned that it stops the job: write the resume checkpoint of this point (every rank
    /// takes part: a sharded model is gathered) and stop.
    fn preempt(&mut self, epoch: u64, batches_done: usize) -> anyhow::Result<RunStatus> {
        let path = super::checkpointing::preemption_checkpoint(self.output_dir);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        self.state.batches_done = batches_done as u64;
        // `last` first, so the preemption checkpoint is the newest: a job requeued into this directory
        // resumes from it (the same point either way).
        self.keeper
            .on_preempt(self.strategy.as_mut(), &self.state)?;
        self.strategy
            .save_checkpoint(&path, &self.state, self.keeper.config_yaml)?;
        let signal = crate::platform::signals::received_signal().unwrap_or("a stop signal");
        let status = RunStatus::preempted(signal, epoch, self.state.global_step, &path);
        tracing::warn!("{status}");
        Ok(status)
    }

    /// A step row: the window's loss and accuracy over every rank, the learning rate and loss scale.
    fn log_step(&mut self, epoch: u64, window: StepStats, lr: f64) -> anyhow::Result<()> {
        let all = self.ranks.sum_stats(window)?;
        let mut values = self
            .metrics
            .train_row(all.loss(), |i| all.metric(i), all.acc1());
        complete(&mut values, &[], self.metrics.stateful());
        values.append(&mut self.step_metrics);
        if self.lr_each_step {
            values.push(("lr".into(), lr));
        }
        if let Some(scale) = self.strategy.loss_scale() {
            values.push(("loss_scale".into(), scale));
        }
        let values: Vec<(&str, f64)> = values.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        self.log(RowKind::Step, epoch, &values)
    }

    /// The schedule's point for the next optimizer step; ReduceLROnPlateau's rate replaces its rate.
    fn point(&self) -> anyhow::Result<Point> {
        let mut point = self.schedule.at(self.state.global_step)?;
        if let Some(plateau) = &self.plateau {
            point.lr = plateau.lr();
        }
        Ok(point)
    }

    /// ReduceLROnPlateau after an epoch's validation (Lightning's `interval: epoch`), on its monitored
    /// metric; its state goes into the training state the checkpoints save.
    fn step_plateau(&mut self) {
        let Some(plateau) = self.plateau.as_mut() else {
            return;
        };
        let value = self
            .state
            .metrics
            .get(&plateau.monitor)
            .copied()
            .unwrap_or(f64::NAN);
        if let Some(lr) = plateau.step(value) {
            tracing::info!(
                "ReduceLROnPlateau: {} has not improved for {} validation(s); lr is now {lr:.3e}",
                plateau.monitor,
                self.exp.scheduler.patience.unwrap_or(10) + 1
            );
        }
        self.state.plateau = Some(plateau.state.clone());
    }

    /// Lightning's `trainer.min_epochs`: EarlyStopping's stop is held until that many epochs have run
    /// (`epochs_done`: `epoch` mid-epoch, `epoch + 1` at its end), and kept (Lightning's `should_stop`
    /// stays set): the run then stops at the first epoch end that reaches `min_epochs`.
    fn hold_until_min_epochs(
        &mut self,
        stop: Option<RunStatus>,
        epochs_done: u64,
    ) -> Option<RunStatus> {
        let min = self.exp.trainer.min_epochs;
        match stop.or_else(|| self.held_stop.take()) {
            Some(RunStatus::EarlyStopped(why)) if epochs_done < min => {
                if self.held_stop.is_none() {
                    tracing::info!(
                        "EarlyStopping would stop ({why}), but trainer.min_epochs={min} holds the run"
                    );
                }
                self.held_stop = Some(RunStatus::EarlyStopped(why));
                None
            }
            other => other,
        }
    }

    /// Validation after `batches_done` batches of the epoch, then (Lightning's on_validation_end)
    /// checkpoints and early stopping, so a checkpoint here records how far into the epoch it was taken.
    fn validate_mid_epoch(
        &mut self,
        epoch: u64,
        batches_done: usize,
    ) -> anyhow::Result<Option<RunStatus>> {
        let v = self.validate()?;
        let mut owned = self
            .metrics
            .val_row(v.loss(), |i| v.metric(i), (v.acc1(), v.acc5()));
        complete(&mut owned, &self.val_metrics, self.metrics.stateful());
        let values: Vec<(&str, f64)> = owned.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        self.log(RowKind::MidEpochValidation { batches_done }, epoch, &values)?;
        for (name, value) in owned {
            self.state.metrics.insert(name, value);
        }
        self.state.batches_done = batches_done as u64;
        let saving = Instant::now();
        let stop = self
            .keeper
            .on_validation_end(self.strategy.as_mut(), &mut self.state, epoch)?;
        self.profiler.record(CHECKPOINT, saving);
        self.state.batches_done = 0;
        // A held stop waits for an epoch's end.
        Ok(match stop {
            Some(stop) => self.hold_until_min_epochs(Some(stop), epoch),
            None => None,
        })
    }

    /// The epoch's end: validation (unless a mid-epoch one just stopped the run), the epoch row,
    /// ModelCheckpoint and EarlyStopping, the Timer. Returns why to stop, if the run stops here.
    fn end_epoch(
        &mut self,
        epoch: u64,
        stats: StepStats,
        epoch_time: f64,
    ) -> anyhow::Result<Option<RunStatus>> {
        let stats = self.ranks.sum_stats(stats)?;
        self.last_train = stats;
        let val = match self.stopped_mid_epoch.is_none()
            && self.plan.validates_at_epoch_end(self.state.epoch)
        {
            true => Some(self.validate()?),
            false => None,
        };
        let throughput = stats.count as f64 / epoch_time.max(1e-9);
        let mut measured = self
            .metrics
            .train_row(stats.loss(), |i| stats.metric(i), stats.acc1());
        let train_values = match self.stateful.as_mut() {
            Some(m) => m.end_phase(Phase::Train, &self.ranks, epoch, self.output_dir)?,
            None => Vec::new(),
        };
        complete(&mut measured, &train_values, self.metrics.stateful());
        if let Some(v) = val {
            let mut row = self
                .metrics
                .val_row(v.loss(), |i| v.metric(i), (v.acc1(), v.acc5()));
            complete(&mut row, &self.val_metrics, self.metrics.stateful());
            measured.extend(row);
        }
        for (key, value) in &measured {
            self.state.metrics.insert(key.clone(), *value);
        }
        if val.is_some() {
            super::summary::record_best_so_far(
                &mut self.state.metrics,
                &self.metrics.val_directions(),
            );
            self.step_plateau();
        }
        let mut row: BTreeMap<&str, f64> = measured.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        row.insert("epoch_time_s", epoch_time);
        row.insert("samples_per_s", throughput);
        if self.lr_each_epoch {
            row.insert("lr", self.lr_now);
        }
        if let Some(scale) = self.strategy.loss_scale() {
            row.insert("loss_scale", scale);
        }
        if let Some(monitor) = self.device_stats.as_mut() {
            row.extend(monitor.epoch_metrics());
        }
        let values: Vec<(&str, f64)> = row.into_iter().collect();
        self.log(RowKind::Epoch, epoch, &values)?;
        // ModelCheckpoint + EarlyStopping, unless they already ran on this point (a mid-epoch validation
        // that stopped the run).
        let early_stop = match self.stopped_mid_epoch.take() {
            Some(why) => Some(why),
            None => {
                let saving = Instant::now();
                let stop = self.keeper.on_validation_end(
                    self.strategy.as_mut(),
                    &mut self.state,
                    epoch,
                )?;
                self.profiler.record(CHECKPOINT, saving);
                self.hold_until_min_epochs(stop, epoch + 1)
            }
        };
        if let (Some(judge), true, None) = (self.judge, val.is_some(), &early_stop) {
            let verdict = match self.ranks.is_global_zero() {
                true => judge.judge(epoch, &self.state.metrics)?,
                false => None,
            };
            if self.ranks.any(verdict.is_some())? {
                return Ok(Some(RunStatus::Pruned(verdict.unwrap_or_else(|| {
                    format!("pruned at epoch {epoch} (decided on rank 0)")
                }))));
            }
        }
        let mut seen: BTreeMap<String, f64> = self.state.metrics.clone().into_iter().collect();
        seen.extend(values.iter().map(|(k, v)| (k.to_string(), *v)));
        let stop = self.user_callbacks.stop_after_epoch(
            epoch,
            self.state.global_step,
            &seen,
            &self.ranks,
        )?;
        if let (Some(why), None) = (stop, &early_stop) {
            return Ok(Some(RunStatus::stopped_by_callback(&why)));
        }
        let ranks = &self.ranks;
        if let Some(t) = self.timer.as_mut() {
            if let Some(why) = t.stop_at_epoch_end(|here| ranks.any(here))? {
                return Ok(Some(RunStatus::TimeLimit(why)));
            }
        }
        Ok(early_stop)
    }

    /// One pass over the validation set (the same batches every time): this rank's batches, then, while
    /// other ranks still have batches (the plan's rounds), its part in their collectives; the metrics are
    /// summed over ranks.
    fn validate(&mut self) -> anyhow::Result<StepStats> {
        let started = Instant::now();
        self.strategy.before_validation()?;
        let order = self.data.val_sampler.order(0);
        let mut v = StepStats::default();
        let mut batches =
            EpochLoader::new(&self.data.val_spec, 0, &order).take(self.plan.val_batches);
        let mut done = 0;
        loop {
            let fetch_start = Instant::now();
            let Some(batch) = batches.next() else {
                break;
            };
            self.profiler.record(VAL_NEXT, fetch_start);
            let step_start = Instant::now();
            let batch = batch?;
            v.add(&self.strategy.evaluate(&batch)?);
            if let Some(m) = self.stateful.as_mut() {
                m.after_batch(Phase::Val, self.strategy.as_mut(), &batch)?;
            }
            done += 1;
            self.profiler
                .record(&self.actions.validation_step, step_start);
        }
        // The rounds are counted from the batches this rank had: its share may hold fewer than the
        // plan's (an unpadded share under `overfit_batches`, where the plan counts training batches).
        for _ in done..self.plan.val_rounds {
            self.strategy.evaluate_idle()?;
        }
        let v = self.ranks.sum_stats(v)?;
        if let Some(m) = self.stateful.as_mut() {
            self.val_metrics =
                m.end_phase(Phase::Val, &self.ranks, self.state.epoch, self.output_dir)?;
        }
        self.last_val = Some(v);
        self.profiler.record(VALIDATION, started);
        Ok(v)
    }

    /// `test: true`: the test split measured once (`after_fit`: with the best checkpoint's weights);
    /// `test/*` join the run's metrics and go to every sink as a test row.
    pub fn test(&mut self, after_fit: bool) -> anyhow::Result<()> {
        let Some(set) = &self.data.test else {
            return Ok(());
        };
        if after_fit {
            // Rank 0 may still be writing the best checkpoint that every rank is about to read.
            self.ranks.barrier()?;
            super::test_loop::load_best(self.strategy.as_mut(), self.keeper.best_path.as_deref())?;
        }
        let (batches, rounds) =
            LoopPlan::test_batches(self.exp, set.sampler.share(), set.sampler.largest_share());
        let started = Instant::now();
        let mut stateful = self.stateful.as_mut();
        let stats = super::test_loop::evaluate(
            self.strategy.as_mut(),
            &self.ranks,
            set,
            (batches, rounds),
            |strategy, batch| match stateful.as_mut() {
                Some(m) => m.after_batch(Phase::Test, strategy, batch).map(|_| ()),
                None => Ok(()),
            },
        )?;
        let test_values = match self.stateful.as_mut() {
            Some(m) => m.end_phase(Phase::Test, &self.ranks, self.state.epoch, self.output_dir)?,
            None => Vec::new(),
        };
        self.profiler.record(TEST, started);
        self.tested_samples = stats.count;
        let mut row = self.metrics.test_row(
            stats.loss(),
            |i| stats.metric(i),
            (stats.acc1(), stats.acc5()),
        );
        complete(&mut row, &test_values, self.metrics.stateful());
        for (key, value) in &row {
            self.state.metrics.insert(key.clone(), *value);
        }
        let values: Vec<(&str, f64)> = row.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        self.log(RowKind::Test, self.state.epoch.saturating_sub(1), &values)
    }

    /// `train predict`: the split's rows, written by rank 0 (`predict.output`, inside the run directory
    /// unless absolute).
    pub fn predict(&mut self, cfg: &crate::schema::PredictConfig) -> anyhow::Result<()> {
        let Some(set) = &self.data.predict else {
            return Ok(());
        };
        let plan =
            LoopPlan::predict_batches(self.exp, set.sampler.share(), set.sampler.largest_share());
        let reducer = super::stateful::RanksReducer(&self.ranks);
        let table = super::predict_loop::predict(
            self.strategy.as_mut(),
            &reducer,
            set,
            plan,
            self.data.train.as_ref(),
        )?;
        let path = self.output_dir.join(&cfg.output);
        let rows = table.as_ref().map_or(0, |t| t.rows());
        if let Some(table) = table {
            table.write(&path)?;
        }
        self.predicted = Some((crate::storage::records::display(&path), rows as u64));
        Ok(())
    }

    fn log(&mut self, kind: RowKind, epoch: u64, values: &[(&str, f64)]) -> anyhow::Result<()> {
        let started = Instant::now();
        let row = Row {
            kind,
            epoch,
            step: self.state.global_step,
            values,
        };
        for sink in &mut self.sinks {
            sink.log(&row)?;
        }
        self.user_callbacks.on_row(&row)?;
        self.profiler.record(LOG, started);
        Ok(())
    }

    /// Does a sink of this process keep the run's logbook section?
    pub fn sinks_keep_run_report(&self) -> bool {
        self.sinks.iter().any(|s| s.keeps_run_report())
    }

    /// Tell the sinks the run ended as `summary` says (W&B writes its summary and exit record).
    pub fn finish_sinks(
        mut self,
        summary: &Summary,
        logbook: &[std::path::PathBuf],
    ) -> anyhow::Result<()> {
        fn local(p: &Option<String>) -> Option<&std::path::Path> {
            p.as_deref()
                .filter(|p| !p.contains("://"))
                .map(std::path::Path::new)
        }
        let end = crate::loggers::RunEnd {
            final_metrics: &summary.final_metrics,
            best_checkpoint: local(&summary.best_checkpoint),
            last_checkpoint: local(&summary.last_checkpoint),
            logbook,
        };
        for sink in &mut self.sinks {
            sink.finish(&end)?;
        }
        self.user_callbacks.on_fit_end(&end)
    }
}
