//! The run's metric sinks, as its `logger:` and `trainer` settings ask for them.

use super::Job;
use crate::loggers::MetricSink;
use crate::plan::LoopPlan;
use crate::schema::{Experiment, Precision, RunMetrics};
use anyhow::Context;

/// The run's metric sinks: `metrics.csv`, W&B, MLflow, the loggers a crate registered and TensorBoard on rank 0 (not under `fast_dev_run`), and the
/// console's lines on every rank (each into its own log).
pub(super) fn sinks(
    exp: &Experiment,
    job: &Job,
    plan: &LoopPlan,
    lead: bool,
    resumed_at: Option<u64>,
    lr_each_step: bool,
) -> anyhow::Result<Vec<Box<dyn MetricSink>>> {
    let mut sinks: Vec<Box<dyn MetricSink>> =
        vec![Box::new(crate::loggers::console::ConsoleLines {
            max_epochs: plan.max_epochs,
            train_batches: plan.train_batches,
        })];
    if !(plan.callbacks_on && lead) {
        return Ok(sinks);
    }
    if let Some(csv) = &exp.logger.csv {
        let mut extra: Vec<&'static str> = Vec::new();
        if exp.trainer.precision == Precision::Mixed16 {
            extra.push("loss_scale");
        }
        if exp.callbacks.device_stats.is_some() {
            extra.extend(crate::callbacks::device_stats::COLUMNS);
        }
        sinks.push(Box::new(
            crate::loggers::csv::CsvLogger::open(
                job.output_dir,
                resumed_at,
                crate::loggers::csv::columns(&RunMetrics::of(exp), &extra),
                csv.flush_every_n_steps,
            )
            .with_context(|| {
                format!(
                    "could not write {}",
                    job.output_dir.join("metrics.csv").display()
                )
            })?,
        ));
    }
    if let Some(settings) = &exp.logger.wandb {
        sinks.push(Box::new(crate::loggers::wandb::WandbSink::create(
            job.output_dir,
            &crate::loggers::wandb::WandbRun {
                settings,
                config: exp.hparams()?,
                config_yaml: job.config_yaml,
                task_name: &exp.task_name,
                sweep: job.sweep_name.as_deref(),
            },
        )?));
    }
    if let Some(settings) = &exp.logger.mlflow {
        let run_name = match &job.sweep_name {
            Some(_) => format!(
                "{}-{}",
                exp.task_name,
                job.output_dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            ),
            None => exp.task_name.clone(),
        };
        sinks.push(Box::new(crate::loggers::mlflow::MlflowSink::create(
            &crate::loggers::mlflow::MlflowRun {
                settings,
                config: exp.hparams()?,
                run_name,
                sweep: job.sweep_name.as_deref(),
                run_dir: job.output_dir,
            },
        )?));
    }
    if !exp.logger.registered.is_empty() {
        let config = exp.hparams()?;
        let run = crate::registry::LoggerRun {
            run_dir: job.output_dir,
            task_name: &exp.task_name,
            config: &config,
            sweep: job.sweep_name.as_deref(),
            resumed_at,
        };
        for spec in &exp.logger.registered {
            let entry = crate::registry::logger(&spec.target).ok_or_else(|| {
                anyhow::anyhow!(
                    "{}: _target_ {} is not registered",
                    spec.section,
                    spec.target
                )
            })?;
            sinks.push(
                (entry.build)(&spec.args, &run).map_err(|e| anyhow::anyhow!(spec.refused(&e)))?,
            );
        }
    }
    if let Some(tb) = &exp.logger.tensorboard {
        let tb_dir = job.output_dir.join(&tb.dir);
        sinks.push(Box::new(crate::loggers::tensorboard::TensorBoardSink {
            writer: crate::loggers::tensorboard::TensorBoardWriter::create(&tb_dir).with_context(
                || format!("could not write TensorBoard events in {}", tb_dir.display()),
            )?,
            lr_each_step,
        }));
    }
    Ok(sinks)
}
