//! The cells of an experiment's table: each run's measured numbers, read from its `summary.json` and
//! `metrics.csv`, formatted as the logbook shows them ("–" where a run has none).

use super::runs::Run;
use serde_json::Value;

/// The highest validation top-1 the run logged (its metrics.csv curve), whatever the checkpoint callback
/// monitored (summary.json's `best` may be a loss); the final value when no curve was logged.
pub(super) fn best_top1(r: &Run) -> Option<f64> {
    r.curve
        .iter()
        .filter_map(|p| p.val_acc1)
        .reduce(f64::max)
        .or_else(|| r.final_metric("val/acc1"))
}

/// The highest validation top-5 the run logged, like `best_top1`.
pub(super) fn best_top5(r: &Run) -> Option<f64> {
    r.curve
        .iter()
        .filter_map(|p| p.val_acc5)
        .reduce(f64::max)
        .or_else(|| r.final_metric("val/acc5"))
}

/// Training images per second; none for runs that trained nothing.
pub(super) fn throughput(r: &Run) -> Option<f64> {
    r.summary
        .as_ref()
        .map(|s| s.train_samples_per_s)
        .filter(|t| *t > 0.0)
}

/// The run's GPU figures, when DeviceStatsMonitor sampled a GPU.
pub(super) fn gpu(r: &Run) -> Option<&crate::callbacks::device_stats::GpuSummary> {
    r.summary.as_ref()?.device_stats.as_ref()?.gpu.as_ref()
}

/// Parameters + gradients + optimizer state kept by the largest rank (what FSDP's sharding divides).
pub(super) fn state_per_rank(r: &Run) -> Option<f64> {
    r.summary
        .as_ref()?
        .state_bytes_per_rank
        .iter()
        .map(|b| b.total() as f64)
        .reduce(f64::max)
}

/// GPU peak when the run had a GPU, else the process's peak RSS.
pub(super) fn peak_memory(r: &Run) -> String {
    match gpu(r) {
        Some(g) => format!("{} (GPU)", bytes(Some(g.memory_used_bytes_peak as f64))),
        None => match r.summary.as_ref().and_then(|s| s.peak_rss_bytes) {
            Some(b) => format!("{} (RSS)", bytes(Some(b as f64))),
            None => "–".into(),
        },
    }
}

/// The run's `tags` (the config's list, as the experiment and `tags=[...]` / `+tags=...` set it).
pub(super) fn tags(r: &Run) -> String {
    match r.config_at("tags") {
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .map(|t| match t {
                Value::String(s) => s.replace('|', "\\|"),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(", "),
        _ => "–".into(),
    }
}

pub(super) fn text(v: Option<String>) -> String {
    v.unwrap_or_else(|| "–".into())
}

pub(super) fn num(v: Option<f64>, digits: usize) -> String {
    v.map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "–".into())
}

pub(super) fn bytes(v: Option<f64>) -> String {
    match v {
        Some(b) if b >= 1024.0 * 1024.0 * 1024.0 => format!("{:.2} GiB", b / (1u64 << 30) as f64),
        Some(b) if b >= 1024.0 * 1024.0 => format!("{:.0} MiB", b / (1u64 << 20) as f64),
        Some(b) => format!("{:.0} KiB", b / 1024.0),
        None => "–".into(),
    }
}

pub(super) fn duration(seconds: f64) -> String {
    if seconds < 60.0 {
        format!("{seconds:.1} s")
    } else if seconds < 3600.0 {
        format!("{}m{:02.0}s", (seconds / 60.0) as u64, seconds % 60.0)
    } else {
        format!(
            "{}h{:02}m",
            (seconds / 3600.0) as u64,
            ((seconds % 3600.0) / 60.0) as u64
        )
    }
}

/// What `test: true` measured after training (`test/*`, with the best checkpoint's weights):
/// `acc 0.9812, loss 0.0612`.
pub(super) fn test_metrics(r: &Run) -> String {
    let cells: Vec<String> = r
        .summary
        .iter()
        .flat_map(|s| &s.final_metrics)
        .filter_map(|(key, value)| Some(format!("{} {value:.4}", key.strip_prefix("test/")?)))
        .collect();
    match cells.is_empty() {
        true => "–".into(),
        false => cells.join(", "),
    }
}

/// A registered loss's validation metrics (`val/<name>`, not classification's), each with its best:
/// `mae 0.1234 (best 0.1100)`.
pub(super) fn own_metrics(r: &Run) -> String {
    let Some(summary) = r.summary.as_ref() else {
        return "–".into();
    };
    let cells: Vec<String> = summary
        .final_metrics
        .iter()
        .filter_map(|(key, value)| {
            let name = key.strip_prefix("val/")?;
            if name.ends_with("_best") || matches!(name, "loss" | "acc" | "acc1" | "acc5") {
                return None;
            }
            let best = summary
                .final_metrics
                .get(&format!("{key}_best"))
                .map(|b| format!(" (best {b:.4})"))
                .unwrap_or_default();
            Some(format!("{name} {value:.4}{best}"))
        })
        .collect();
    match cells.is_empty() {
        true => "–".into(),
        false => cells.join(", "),
    }
}

/// The share of its steps' time a run waited for data, shown where it was input-bound (else "–", so the
/// column appears only when some run was).
pub(super) fn input_bound(r: &Run) -> String {
    r.summary
        .as_ref()
        .and_then(|s| s.input)
        .filter(|i| i.input_bound())
        .and_then(|i| i.fraction())
        .map(|f| format!("{:.0}% (input-bound)", f * 100.0))
        .unwrap_or_else(|| "–".into())
}
