//! The Rust half of `bench/metrics_bench.py`: trainyard's stateful metrics (`metrics::torchmetrics`) on the
//! inputs torchmetrics gets there (the same generator, the same numbers), a training step's pattern: for
//! `--steps` batches of `--batch` logits over `--classes` classes, `update` then `compute` each step
//! (`on_step`), and for AUROC `update` each step with one `compute` at the end (its cat states grow over
//! the epoch). One JSON line per metric: `{"metric", "us_per_step", "value"}` (the last compute).

use serde_json::json;
use std::time::Instant;
use trainyard::tensor::HostTensor;

/// The generator both halves share: 64-bit LCG (Knuth's MMIX constants), top 24 bits.
struct Lcg(u64);

impl Lcg {
    fn next24(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 40
    }
}

/// `steps` batches: logits in [-2, 2) as f32 (row-major, batch x classes) and targets below `classes`.
fn inputs(steps: usize, batch: usize, classes: usize) -> Vec<(HostTensor, HostTensor)> {
    let mut rng = Lcg(2024);
    (0..steps)
        .map(|_| {
            let logits = (0..batch * classes)
                .map(|_| (rng.next24() as f64 / (1u64 << 24) as f64 * 4.0 - 2.0) as f32)
                .collect();
            let targets = (0..batch)
                .map(|_| (rng.next24() % classes as u64) as f32)
                .collect();
            (
                HostTensor {
                    shape: vec![batch, classes],
                    data: logits,
                },
                HostTensor {
                    shape: vec![batch],
                    data: targets,
                },
            )
        })
        .collect()
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

fn main() -> anyhow::Result<()> {
    let (steps, batch, classes) = (
        arg("--steps", 200),
        arg("--batch", 256),
        arg("--classes", 10),
    );
    let data = inputs(steps, batch, classes);
    let cases = [
        (
            "accuracy",
            "torchmetrics.Accuracy",
            json!({"task": "multiclass", "num_classes": classes}),
            true,
        ),
        (
            "f1_macro",
            "torchmetrics.F1Score",
            json!({"task": "multiclass", "num_classes": classes, "average": "macro"}),
            true,
        ),
        (
            "confusion_matrix",
            "torchmetrics.ConfusionMatrix",
            json!({"task": "multiclass", "num_classes": classes}),
            true,
        ),
        (
            "auroc",
            "torchmetrics.AUROC",
            json!({"task": "multiclass", "num_classes": classes}),
            false,
        ),
    ];
    for (name, target, args, per_step) in cases {
        let build = trainyard::registry::metric(target).expect("a built-in metric");
        let mut best = f64::INFINITY;
        let mut value = serde_json::Value::Null;
        // The fastest of five passes: the machine's noise only ever adds time.
        for _ in 0..5 {
            let mut metric = build(&args)?;
            let started = Instant::now();
            let mut last = None;
            for (preds, target) in &data {
                metric.update(preds, target)?;
                if per_step {
                    last = Some(metric.compute()?);
                    metric.reset();
                }
            }
            if !per_step {
                last = Some(metric.compute()?);
            }
            best = best.min(started.elapsed().as_secs_f64());
            value = match last {
                Some(trainyard::metrics::Value::Scalar(v)) => json!(v),
                Some(trainyard::metrics::Value::Vector(v)) => json!(v),
                Some(trainyard::metrics::Value::Matrix { values, .. }) => json!(values),
                None => serde_json::Value::Null,
            };
        }
        println!(
            "{}",
            json!({"metric": name, "us_per_step": best / steps as f64 * 1e6, "value": value})
        );
    }
    Ok(())
}
