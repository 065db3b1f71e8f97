//! The run's summary as the fit loop ends it: what it measured, with every rank's contribution (final
//! metrics, throughput, memory per rank, the best checkpoint).

use super::*;
use crate::trainer::summary::EvalOnly;

impl FitLoop<'_> {
    /// What the run measured, with every rank's contribution (a collective: every rank calls it).
    pub fn summary(
        &mut self,
        exp: &Experiment,
        ranks: &Ranks,
        status: RunStatus,
        started: Instant,
        resumed_from: Option<String>,
        finding: Option<Finding>,
    ) -> anyhow::Result<Summary> {
        let mut final_metrics: BTreeMap<String, f64> = self
            .state
            .metrics
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        if self.last_val.is_none() && self.last_train.count > 0 {
            final_metrics.insert("train/loss".into(), self.last_train.loss());
        }
        let monitor = self
            .keeper
            .ckpt_cfg
            .and_then(|c| c.monitor.clone())
            .or_else(|| self.keeper.stop_cfg.map(|s| s.monitor.clone()));
        let skipped = self.data.train_spec.skipped.clone();
        let mut samples = [
            self.train_samples as f64,
            skipped.as_ref().map_or(0, |s| s.count()) as f64,
        ];
        ranks.sum(&mut samples)?;
        let train_samples = samples[0] as u64;
        let skipped_samples = skipped.map(|s| crate::trainer::summary::SkippedSamples {
            count: samples[1] as u64,
            first: s.named(),
        });
        let state_bytes_per_rank = state_bytes_per_rank(ranks, self.strategy.state_bytes())?;
        let (best_checkpoint, last_checkpoint) = self.keeper.locations();
        let t = &exp.trainer;
        let accumulate = t.accumulate_grad_batches.max(1) as usize;
        // Read before the wall time: the timer started after the run did, so its training time can then
        // never exceed the wall time (read after it, it did by the microseconds between the reads).
        let timer = self.timer.take().map(|t| t.summary());
        Ok(Summary {
            state_bytes_per_rank,
            task_name: exp.task_name.clone(),
            status,
            backend: format!("{:?}", exp.backend).to_lowercase(),
            model: exp.model.name.to_string(),
            data: format!("{:?}", exp.data.name).to_lowercase(),
            strategy: t.strategy.to_string(),
            precision: serde_json::to_value(t.precision)?
                .as_str()
                .unwrap_or_default()
                .to_string(),
            num_nodes: ranks.num_nodes,
            devices: ranks.world_size / ranks.num_nodes.max(1) * self.strategy.replicas(),
            batch_size: exp.data.batch_size,
            global_batch_size: exp.data.batch_size * accumulate * ranks.world_size,
            num_parameters: self.strategy.num_parameters(),
            epochs_completed: self.state.epoch,
            global_step: self.state.global_step,
            best: match (monitor, self.state.best) {
                (Some(monitor), Some((value, epoch))) => Some(BestMetric {
                    monitor,
                    value,
                    epoch,
                }),
                _ => None,
            },
            lead: lead_metric(exp, &self.metrics, &final_metrics, self.keeper.ckpt_cfg),
            final_metrics,
            wall_time_s: started.elapsed().as_secs_f64(),
            train_time_s: self.train_time,
            train_samples_per_s: train_samples as f64 / self.train_time.max(1e-9),
            median_step_time_s: median(&self.step_times),
            input: (self.input_wait.computing > 0.0).then_some(self.input_wait),
            skipped_samples,
            peak_rss_bytes: peak_rss_bytes(),
            best_checkpoint,
            last_checkpoint,
            eval_only: (!exp.train).then(|| match (&exp.predict, &self.predicted) {
                (Some(p), Some((path, rows))) => EvalOnly {
                    split: p.split.name().into(),
                    samples: *rows,
                    checkpoint: resumed_from.clone(),
                    predictions: Some(path.clone()),
                },
                _ => EvalOnly {
                    split: "test".into(),
                    samples: self.tested_samples,
                    checkpoint: resumed_from.clone(),
                    predictions: None,
                },
            }),
            resumed_from,
            resumed_at_step: self.resumed_at,
            batch_size_finder: finding,
            timer,
            device_stats: self
                .device_stats
                .take()
                .and_then(|m| m.finish(self.output_dir)),
            profile: self.profiler.actions(),
        })
    }
}

/// The metric the run is judged by: a search's `optimized_metric`, else ModelCheckpoint's monitor, else
/// EarlyStopping's, else top-1, else the validation loss (the first the run has a final value of), with
/// its direction (the callback's `mode` where it names one, else the metric's own).
fn lead_metric(
    exp: &Experiment,
    metrics: &RunMetrics,
    finals: &BTreeMap<String, f64>,
    ckpt: Option<&crate::schema::ModelCheckpoint>,
) -> Option<crate::storage::records::LeadMetric> {
    let stop = exp.callbacks.early_stopping.as_ref();
    let candidates = exp
        .optimized_metric
        .iter()
        .cloned()
        .chain(ckpt.and_then(|c| c.monitor.clone()))
        .chain(stop.map(|s| s.monitor.clone()))
        .chain(["val/acc1", "val/acc", "val/loss"].map(String::from));
    let directions = metrics.val_directions();
    for name in candidates {
        let Some(value) = finals.get(&name) else {
            continue;
        };
        let base = name.strip_suffix("_best").unwrap_or(&name);
        let as_val = base
            .split_once('/')
            .map(|(_, n)| format!("val/{n}"))
            .unwrap_or_else(|| base.to_string());
        let mode = match (
            ckpt.and_then(|c| c.monitor.as_deref()),
            stop.map(|s| s.monitor.as_str()),
        ) {
            (Some(m), _) if m == name => ckpt.map(|c| c.mode == crate::schema::Mode::Max),
            (_, Some(m)) if m == name => stop.map(|s| s.mode == crate::schema::Mode::Max),
            _ => None,
        };
        let higher_is_better = mode
            .or_else(|| {
                directions
                    .iter()
                    .find(|(n, _)| *n == as_val)
                    .map(|(_, h)| *h)
            })
            .unwrap_or(!base.contains("loss"));
        return Some(crate::storage::records::LeadMetric {
            name,
            higher_is_better,
            value: *value,
        });
    }
    None
}

/// Each rank's training memory, every rank's row filled by its owner (the sum leaves each in place).
fn state_bytes_per_rank(ranks: &Ranks, mine: StateBytes) -> anyhow::Result<Vec<StateBytes>> {
    const FIELDS: usize = 4;
    let mut bytes = vec![0.0f64; FIELDS * ranks.world_size];
    bytes[FIELDS * ranks.rank..FIELDS * (ranks.rank + 1)].copy_from_slice(&[
        mine.parameters as f64,
        mine.gradients as f64,
        mine.optimizer_state as f64,
        mine.unsharded_peak as f64,
    ]);
    ranks.sum(&mut bytes)?;
    Ok(bytes
        .chunks(FIELDS)
        .map(|r| StateBytes {
            parameters: r[0] as u64,
            gradients: r[1] as u64,
            optimizer_state: r[2] as u64,
            unsharded_peak: r[3] as u64,
        })
        .collect())
}
