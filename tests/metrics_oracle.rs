//! The built-in metrics against torchmetrics 1.9 itself (tests/fixtures/metrics_oracle.py, in the PyTorch
//! venv CI already has): every case builds the same class with the same keyword arguments, updates it
//! with the same batches (uneven ones, so the state is what is compared, not one batch's value) and
//! compares `compute()`, or both refuse the input. Random inputs and the edge cases torchmetrics handles
//! specially: a class never predicted, a class absent from the targets, a single sample, tied AUROC
//! scores, an ignored index, logits and probabilities.

mod common;

use serde_json::{json, Value as J};
use trainyard::metrics::Value;
use trainyard::tensor::HostTensor;

struct Case {
    name: String,
    target: &'static str,
    kwargs: J,
    batches: Vec<(HostTensor, HostTensor)>,
    preds_int: bool,
    target_int: bool,
}

/// A seeded generator (xorshift), so the cases are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    fn uniform(&mut self, lo: f64, hi: f64) -> f32 {
        (lo + (hi - lo) * self.next()) as f32
    }
    fn below(&mut self, n: usize) -> f32 {
        ((self.next() * n as f64) as usize).min(n - 1) as f32
    }
}

fn t(shape: &[usize], data: Vec<f32>) -> HostTensor {
    HostTensor {
        shape: shape.to_vec(),
        data,
    }
}

/// `n` samples split into three uneven batches; `sample(rng, i)` gives one sample's preds and target.
fn batches(
    n: usize,
    preds_shape: &[usize],
    target_shape: &[usize],
    rng: &mut Rng,
    mut sample: impl FnMut(&mut Rng) -> (Vec<f32>, Vec<f32>),
) -> Vec<(HostTensor, HostTensor)> {
    let cuts = [0, n / 5, n / 5 + n / 2, n];
    let mut out = Vec::new();
    for w in cuts.windows(2) {
        let m = w[1] - w[0];
        if m == 0 {
            continue;
        }
        let (mut p, mut g) = (Vec::new(), Vec::new());
        for _ in 0..m {
            let (a, b) = sample(rng);
            p.extend(a);
            g.extend(b);
        }
        let ps: Vec<usize> = std::iter::once(m)
            .chain(preds_shape.iter().copied())
            .collect();
        let ts: Vec<usize> = std::iter::once(m)
            .chain(target_shape.iter().copied())
            .collect();
        out.push((t(&ps, p), t(&ts, g)));
    }
    out
}

/// Logits over `c` classes (the last `never` classes never the largest), and a label.
fn multiclass(c: usize, never: usize, n: usize, rng: &mut Rng) -> Vec<(HostTensor, HostTensor)> {
    batches(n, &[c], &[], rng, |r| {
        let logits: Vec<f32> = (0..c)
            .map(|k| {
                if k >= c - never {
                    -9.0
                } else {
                    r.uniform(-3.0, 3.0)
                }
            })
            .collect();
        (logits, vec![r.below(c)])
    })
}

fn binary(
    n: usize,
    probabilities: bool,
    ties: bool,
    rng: &mut Rng,
) -> Vec<(HostTensor, HostTensor)> {
    batches(n, &[], &[], rng, |r| {
        let mut s = if probabilities {
            r.uniform(0.0, 1.0)
        } else {
            r.uniform(-4.0, 4.0)
        };
        if ties {
            s = (s * 4.0).round() / 4.0;
        }
        (vec![s], vec![r.below(2)])
    })
}

fn cases() -> Vec<Case> {
    let mut rng = Rng(0x5eed_1234_abcd);
    let mut out = Vec::new();
    let mut add = |name: &str,
                   target: &'static str,
                   kwargs: J,
                   b: Vec<(HostTensor, HostTensor)>,
                   int: (bool, bool)| {
        out.push(Case {
            name: name.into(),
            target,
            kwargs,
            batches: b,
            preds_int: int.0,
            target_int: int.1,
        })
    };
    let class = (false, true);
    // Accuracy, precision, recall, F-scores over logits: every average, the wrappers' and the classes' defaults.
    for (stat, t) in [
        ("acc", "torchmetrics.Accuracy"),
        ("prec", "torchmetrics.Precision"),
        ("rec", "torchmetrics.Recall"),
        ("f1", "torchmetrics.F1Score"),
    ] {
        add(
            &format!("{stat}_wrapper_default"),
            t,
            json!({"task": "multiclass", "num_classes": 5}),
            multiclass(5, 0, 37, &mut rng),
            class,
        );
        for avg in ["macro", "weighted", "none"] {
            add(
                &format!("{stat}_{avg}_never_predicted"),
                t,
                json!({"task": "multiclass", "num_classes": 6, "average": avg}),
                multiclass(6, 2, 29, &mut rng),
                class,
            );
        }
        add(
            &format!("{stat}_top2_macro"),
            t,
            json!({"task": "multiclass", "num_classes": 5, "top_k": 2, "average": "macro"}),
            multiclass(5, 0, 31, &mut rng),
            class,
        );
        add(
            &format!("{stat}_binary_logits"),
            t,
            json!({"task": "binary"}),
            binary(41, false, false, &mut rng),
            class,
        );
        add(
            &format!("{stat}_binary_probs_threshold"),
            t,
            json!({"task": "binary", "threshold": 0.3}),
            binary(23, true, false, &mut rng),
            class,
        );
        add(
            &format!("{stat}_single_sample"),
            t,
            json!({"task": "multiclass", "num_classes": 4}),
            multiclass(4, 0, 1, &mut rng),
            class,
        );
    }
    // A class neither predicted nor in the targets: left out of macro averages (and of mean IoU).
    let neither = |rng: &mut Rng| {
        batches(28, &[5], &[], rng, |r| {
            let logits = (0..5)
                .map(|k| if k == 4 { -9.0 } else { r.uniform(-3.0, 3.0) })
                .collect();
            (logits, vec![r.below(4)])
        })
    };
    for (stat, t) in [
        ("acc", "torchmetrics.Accuracy"),
        ("prec", "torchmetrics.Precision"),
        ("f1", "torchmetrics.F1Score"),
        ("jaccard", "torchmetrics.JaccardIndex"),
    ] {
        add(
            &format!("{stat}_macro_class_in_neither"),
            t,
            json!({"task": "multiclass", "num_classes": 5, "average": "macro"}),
            neither(&mut rng),
            class,
        );
    }
    add(
        "acc_multiclass_class_default_macro",
        "torchmetrics.classification.MulticlassAccuracy",
        json!({"num_classes": 5}),
        multiclass(5, 1, 33, &mut rng),
        class,
    );
    add(
        "f1_multiclass_class_default_macro",
        "torchmetrics.classification.MulticlassF1Score",
        json!({"num_classes": 5}),
        multiclass(5, 1, 33, &mut rng),
        class,
    );
    add(
        "acc_top3_micro",
        "torchmetrics.Accuracy",
        json!({"task": "multiclass", "num_classes": 6, "top_k": 3}),
        multiclass(6, 0, 40, &mut rng),
        class,
    );
    add(
        "fbeta_half_weighted",
        "torchmetrics.FBetaScore",
        json!({"task": "multiclass", "num_classes": 4, "beta": 0.5, "average": "weighted"}),
        multiclass(4, 0, 30, &mut rng),
        class,
    );
    add(
        "acc_ignore_index",
        "torchmetrics.Accuracy",
        json!({"task": "multiclass", "num_classes": 4, "ignore_index": 0, "average": "macro"}),
        multiclass(4, 0, 30, &mut rng),
        class,
    );
    // From labels rather than scores.
    let labels = batches(25, &[], &[], &mut rng, |r| {
        (vec![r.below(3)], vec![r.below(3)])
    });
    add(
        "recall_from_labels",
        "torchmetrics.Recall",
        json!({"task": "multiclass", "num_classes": 3, "average": "macro"}),
        labels,
        (true, true),
    );
    // AUROC: binary with logits, probabilities and ties; multiclass, also with a class absent from the targets.
    add(
        "auroc_binary_logits",
        "torchmetrics.AUROC",
        json!({"task": "binary"}),
        binary(50, false, false, &mut rng),
        class,
    );
    add(
        "auroc_binary_ties",
        "torchmetrics.AUROC",
        json!({"task": "binary"}),
        binary(40, true, true, &mut rng),
        class,
    );
    for avg in ["macro", "weighted", "none"] {
        add(
            &format!("auroc_multiclass_{avg}"),
            "torchmetrics.AUROC",
            json!({"task": "multiclass", "num_classes": 4, "average": avg}),
            multiclass(4, 0, 45, &mut rng),
            class,
        );
    }
    let absent = batches(30, &[4], &[], &mut rng, |r| {
        (
            (0..4).map(|_| r.uniform(-2.0, 2.0)).collect(),
            vec![r.below(3)],
        )
    });
    add(
        "auroc_class_absent_from_targets",
        "torchmetrics.AUROC",
        json!({"task": "multiclass", "num_classes": 4}),
        absent,
        class,
    );
    // Confusion matrices and the Jaccard index.
    for norm in [J::Null, json!("true"), json!("pred"), json!("all")] {
        add(
            &format!("confmat_{}", norm.as_str().unwrap_or("none")),
            "torchmetrics.ConfusionMatrix",
            json!({"task": "multiclass", "num_classes": 4, "normalize": norm}),
            multiclass(4, 1, 27, &mut rng),
            class,
        );
    }
    add(
        "confmat_binary",
        "torchmetrics.ConfusionMatrix",
        json!({"task": "binary"}),
        binary(20, false, false, &mut rng),
        class,
    );
    for avg in ["macro", "micro", "weighted", "none"] {
        add(
            &format!("jaccard_{avg}"),
            "torchmetrics.JaccardIndex",
            json!({"task": "multiclass", "num_classes": 5, "average": avg}),
            multiclass(5, 1, 33, &mut rng),
            class,
        );
    }
    add(
        "jaccard_binary",
        "torchmetrics.JaccardIndex",
        json!({"task": "binary"}),
        binary(30, true, false, &mut rng),
        class,
    );
    // Segmentation masks: (N, C, H, W) logits against (N, H, W) labels.
    let masks = |rng: &mut Rng, c: usize, n: usize| {
        batches(n, &[c, 3, 4], &[3, 4], rng, |r| {
            (
                (0..c * 12).map(|_| r.uniform(-2.0, 2.0)).collect(),
                (0..12).map(|_| r.below(c)).collect(),
            )
        })
    };
    add(
        "mean_iou_masks",
        "torchmetrics.JaccardIndex",
        json!({"task": "multiclass", "num_classes": 3}),
        masks(&mut rng, 3, 7),
        class,
    );
    for (name, kwargs) in [
        (
            "dice_macro",
            json!({"num_classes": 3, "input_format": "mixed"}),
        ),
        (
            "dice_micro",
            json!({"num_classes": 3, "input_format": "mixed", "average": "micro"}),
        ),
        (
            "dice_weighted",
            json!({"num_classes": 3, "input_format": "mixed", "average": "weighted"}),
        ),
        (
            "dice_none",
            json!({"num_classes": 3, "input_format": "mixed", "average": "none"}),
        ),
        (
            "dice_no_background",
            json!({"num_classes": 3, "input_format": "mixed", "include_background": false}),
        ),
        (
            "dice_global",
            json!({"num_classes": 3, "input_format": "mixed", "aggregation_level": "global"}),
        ),
    ] {
        add(
            name,
            "torchmetrics.segmentation.DiceScore",
            kwargs,
            masks(&mut rng, 3, 6),
            class,
        );
    }
    // Regression.
    let reg = |rng: &mut Rng, n: usize, outputs: usize| {
        let shape: Vec<usize> = if outputs == 1 { vec![] } else { vec![outputs] };
        batches(n, &shape, &shape, rng, |r| {
            let y: Vec<f32> = (0..outputs).map(|_| r.uniform(-5.0, 5.0)).collect();
            let p = y.iter().map(|v| v + r.uniform(-1.0, 1.0)).collect();
            (p, y)
        })
    };
    let value = (false, false);
    add(
        "mse",
        "torchmetrics.MeanSquaredError",
        json!({}),
        reg(&mut rng, 31, 1),
        value,
    );
    add(
        "rmse",
        "torchmetrics.MeanSquaredError",
        json!({"squared": false}),
        reg(&mut rng, 31, 1),
        value,
    );
    add(
        "mae",
        "torchmetrics.MeanAbsoluteError",
        json!({}),
        reg(&mut rng, 31, 1),
        value,
    );
    add(
        "r2",
        "torchmetrics.R2Score",
        json!({}),
        reg(&mut rng, 31, 1),
        value,
    );
    add(
        "r2_adjusted",
        "torchmetrics.R2Score",
        json!({"adjusted": 2}),
        reg(&mut rng, 31, 1),
        value,
    );
    for m in ["raw_values", "uniform_average", "variance_weighted"] {
        add(
            &format!("r2_{m}"),
            "torchmetrics.R2Score",
            json!({"multioutput": m}),
            reg(&mut rng, 25, 3),
            value,
        );
    }
    add(
        "r2_single_sample",
        "torchmetrics.R2Score",
        json!({}),
        reg(&mut rng, 1, 1),
        value,
    );
    out
}

fn flat(v: &J) -> Vec<f64> {
    match v {
        J::Array(items) => items.iter().flat_map(flat).collect(),
        J::Number(n) => vec![n.as_f64().unwrap()],
        J::Null => vec![f64::NAN],
        other => panic!("not a number: {other}"),
    }
}

fn ours(case: &Case) -> Result<Vec<f64>, String> {
    let build = trainyard::registry::metric(case.target).expect("a built-in metric");
    let mut m = build(&case.kwargs).map_err(|e| e.to_string())?;
    for (p, g) in &case.batches {
        m.update(p, g).map_err(|e| e.to_string())?;
    }
    Ok(match m.compute().map_err(|e| e.to_string())? {
        Value::Scalar(v) => vec![v],
        Value::Vector(v) => v,
        Value::Matrix { values, .. } => values,
    })
}

#[test]
fn the_built_in_metrics_equal_torchmetrics() {
    let cases = cases();
    // Ours first: a case must build and run here whatever Python says.
    let mine: Vec<(String, Result<Vec<f64>, String>)> =
        cases.iter().map(|c| (c.name.clone(), ours(c))).collect();
    let Some(python) = common::torch_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let input: Vec<J> = cases
        .iter()
        .map(|c| {
            json!({
                "name": c.name, "target": c.target, "kwargs": c.kwargs,
                "preds_int": c.preds_int, "target_int": c.target_int,
                "batches": c.batches.iter().map(|(p, g)| json!([nested(p), nested(g)])).collect::<Vec<_>>(),
            })
        })
        .collect();
    let cases_file = dir.path().join("cases.json");
    let results_file = dir.path().join("results.json");
    std::fs::write(&cases_file, serde_json::to_string(&input).unwrap()).unwrap();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/metrics_oracle.py");
    let out = std::process::Command::new(python)
        .args([
            script.as_os_str(),
            cases_file.as_os_str(),
            results_file.as_os_str(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the torchmetrics side failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: J = serde_json::from_str(&std::fs::read_to_string(&results_file).unwrap()).unwrap();
    let mut failures = Vec::new();
    for (name, mine) in mine {
        let reference = &theirs[&name];
        match (mine, reference.get("value")) {
            (Ok(v), Some(r)) => {
                let r = flat(r);
                let close = v.len() == r.len()
                    && v.iter().zip(&r).all(|(a, b)| {
                        (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-5 * b.abs().max(1.0)
                    });
                if !close {
                    failures.push(format!("{name}: ours {v:?}, torchmetrics {r:?}"));
                }
            }
            (Err(_), None) => {} // both refuse
            (Ok(v), None) => failures.push(format!(
                "{name}: ours {v:?}, torchmetrics raised {}",
                reference["error"]
            )),
            (Err(e), Some(r)) => {
                failures.push(format!("{name}: ours refused ({e}), torchmetrics gave {r}"))
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    assert!(cases.len() >= 70, "{} cases", cases.len());
}

/// A tensor as nested JSON lists (a 1-D tensor of one element per sample stays 1-D).
fn nested(t: &HostTensor) -> J {
    fn build(data: &[f32], shape: &[usize]) -> J {
        match shape {
            [] => json!(data[0]),
            [n] => json!(data[..*n].to_vec()),
            [n, rest @ ..] => {
                let step: usize = rest.iter().product();
                J::Array(
                    (0..*n)
                        .map(|i| build(&data[i * step..(i + 1) * step], rest))
                        .collect(),
                )
            }
        }
    }
    build(&t.data, &t.shape)
}
