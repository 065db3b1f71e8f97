//! Callback helpers the trainer uses: checkpoint file naming (ModelCheckpoint's `filename` template).

pub mod batch_size_finder;
pub mod device_stats;
pub mod timer;

use std::collections::HashMap;

/// Expand Lightning's filename template: `{epoch}`, `{epoch:03d}`, `{step}`, `{val/acc1:.3f}` and the like.
pub fn checkpoint_name(
    template: &str,
    epoch: u64,
    step: u64,
    metrics: &HashMap<String, f64>,
) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        let field = &rest[open + 1..open + close];
        let (name, spec) = field.split_once(':').unwrap_or((field, ""));
        let value = match name {
            "epoch" => Some(epoch as f64),
            "step" => Some(step as f64),
            other => metrics.get(other).copied(),
        };
        let text = match value {
            None => format!("{{{field}}}"),
            Some(v) => format_spec(v, spec),
        };
        // Lightning writes `name=value` for metrics: `val/acc1=0.912` (slashes become underscores).
        if matches!(name, "epoch" | "step") {
            out.push_str(&text);
        } else {
            out.push_str(&format!("{}={text}", name.replace('/', "_")));
        }
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}

/// Python format specs that matter here: `03d`, `.3f`, `.4g`.
fn format_spec(v: f64, spec: &str) -> String {
    if let Some(width) = spec.strip_suffix('d') {
        let width: usize = width.trim_start_matches('0').parse().unwrap_or(0);
        return format!("{:0width$}", v as i64, width = width);
    }
    if let Some(prec) = spec.strip_prefix('.').and_then(|s| s.strip_suffix('f')) {
        let prec: usize = prec.parse().unwrap_or(6);
        return format!("{v:.prec$}");
    }
    if v.fract() == 0.0 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates() {
        let m: HashMap<String, f64> = [("val/acc1".to_string(), 0.91234)].into();
        assert_eq!(
            checkpoint_name("epoch_{epoch:03d}", 7, 100, &m),
            "epoch_007"
        );
        assert_eq!(
            checkpoint_name("{epoch}-{val/acc1:.3f}", 2, 0, &m),
            "2-val_acc1=0.912"
        );
        assert_eq!(checkpoint_name("s{step}", 0, 42, &m), "s42");
    }
}
