//! What a job did, and how the console and the exit status say it: a report for a finished job, a message
//! and exit status 75 for one a signal stopped at a resume checkpoint. Shared by the job runner and the
//! launchers that start its processes.

use crate::storage::records;
use crate::trainer::Summary;
use std::path::{Path, PathBuf};

/// What one job did.
pub struct JobOutcome {
    pub output_dir: PathBuf,
    pub message: String,
    /// Final `val/acc1`, shown in the sweep table.
    pub main_metric: Option<crate::storage::records::LeadMetric>,
    /// This process's rank in the run (0 for a run of one process): rank 0 reports the job.
    pub rank: usize,
    /// The cluster's warning signal stopped the job at a checkpoint; it was requeued to resume.
    pub preempted: bool,
}

/// How a process whose run a signal stopped exits: success when SLURM requeued the job (its next
/// attempt goes on), else [`crate::platform::signals::EXIT_PREEMPTED`].
pub fn preempted_exit_code() -> std::process::ExitCode {
    match crate::platform::signals::received_signal() == Some("SIGUSR1")
        && super::requeue::in_slurm_batch_job()
    {
        true => std::process::ExitCode::SUCCESS,
        false => std::process::ExitCode::from(crate::platform::signals::EXIT_PREEMPTED),
    }
}

/// What a run stopped by a signal tells its user.
pub fn preempted_message(signal: &str, output_dir: &Path) -> String {
    format!(
        "{signal}: the run stopped at a resume checkpoint and is recorded as preempted in {} \
         (exit status {}); run the same command with ckpt_path=auto to continue it",
        records::display(&output_dir.join("run.json")),
        crate::platform::signals::EXIT_PREEMPTED
    )
}

/// The console's report of a finished job (`processes`: how many trained it, when more than one).
pub fn report(summary: &Summary, output_dir: &Path, processes: Option<(usize, f64)>) -> String {
    let (on, seconds) = match processes {
        Some((n, s)) => (format!(" on {n} process(es)"), s),
        None => (String::new(), summary.wall_time_s),
    };
    let input = summary
        .input
        .filter(|i| i.input_bound())
        .and_then(|i| i.fraction())
        .map(|f| {
            format!(
                "\nInput-bound: the training steps waited for their batches {:.0}% of the time; more \
                 data.num_workers (or a faster input pipeline) would speed this run up",
                f * 100.0
            )
        })
        .unwrap_or_default();
    let skipped = summary
        .skipped_samples
        .as_ref()
        .filter(|s| s.count > 0)
        .map(|s| {
            format!(
                "\nSkipped {} damaged sample(s) (data.skip_corrupt), the first: {}",
                s.count,
                s.first.first().map_or("", String::as_str)
            )
        })
        .unwrap_or_default();
    if let Some(eval) = summary
        .eval_only
        .as_ref()
        .filter(|e| e.predictions.is_some())
    {
        return format!(
            "{}: predicted the {} inputs of the {} split with {}{on} in {seconds:.1}s\nPredictions: {}\nRun \
             directory: {}",
            summary.task_name,
            eval.samples,
            eval.split,
            eval.checkpoint.as_deref().unwrap_or("the model's initial weights (no ckpt_path)"),
            eval.predictions.as_deref().unwrap_or_default(),
            records::display(output_dir)
        );
    }
    if let Some(eval) = &summary.eval_only {
        // `train eval`: what was measured and on which weights; nothing about epochs trained.
        let metrics: Vec<String> = summary
            .final_metrics
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{}/", eval.split)))
            .map(|(k, v)| format!("{k} {v:.4}"))
            .collect();
        return format!(
            "{}: evaluated {} on the {} split ({} samples){on} in {seconds:.1}s; {}\nRun directory: {}",
            summary.task_name,
            eval.checkpoint.as_deref().unwrap_or("the model's initial weights (no ckpt_path)"),
            eval.split,
            eval.samples,
            if metrics.is_empty() { "no metrics".into() } else { metrics.join(", ") },
            records::display(output_dir)
        );
    }
    if summary.resumed_at_step == Some(summary.global_step) && summary.eval_only.is_none() {
        return format!(
            "{}: nothing to train: {} is at epoch {} (step {}), where this run's trainer.max_epochs / \
             max_steps end; raise them to train on\nRun directory: {}",
            summary.task_name,
            summary.resumed_from.as_deref().unwrap_or("the checkpoint"),
            summary.epochs_completed,
            summary.global_step,
            records::display(output_dir)
        );
    }
    format!(
        "{}: {} after {} epochs ({} steps){on} in {seconds:.1}s; {}{input}{skipped}\nRun directory: {}",
        summary.task_name,
        summary.status,
        summary.epochs_completed,
        summary.global_step,
        match summary.headline() {
            Some((name, value)) => format!("{name} {value:.4}"),
            None => "no validation".to_string(),
        },
        records::display(output_dir)
    )
}
