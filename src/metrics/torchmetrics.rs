//! torchmetrics' classes by their `_target_` names, built from the node's other keys as their
//! constructors take them (the task wrappers `torchmetrics.Accuracy(task=...)` with their own defaults,
//! and the `Binary*`/`Multiclass*` classes with theirs: the wrappers average `micro`, the multiclass
//! classes `macro`). A keyword torchmetrics does not take is refused by name, and so is one it takes
//! that trainyard does not support (multilabel tasks, samplewise averages, binned thresholds), never
//! ignored.

use super::classification::{
    Average, Confusion, ConfusionMatrix, JaccardIndex, Normalize, StatScore, Statistic, Task,
};
use super::curves::Auroc;
use super::regression::{MeanError, MultiOutput, R2Score};
use super::segmentation::{Aggregation, DiceScore};
use super::Metric;
use serde::Deserialize;
use serde_json::Value;

type Built = anyhow::Result<Box<dyn Metric>>;

/// Builds a metric from its node's keyword arguments.
pub type Builder = fn(&Value) -> Built;

/// Every `_target_` this module builds, with its builder.
pub const TARGETS: &[(&str, Builder)] = &[
    ("torchmetrics.Accuracy", |a| {
        stat(a, Statistic::Accuracy, Form::Wrapper)
    }),
    ("torchmetrics.classification.Accuracy", |a| {
        stat(a, Statistic::Accuracy, Form::Wrapper)
    }),
    ("torchmetrics.classification.BinaryAccuracy", |a| {
        stat(a, Statistic::Accuracy, Form::Binary)
    }),
    ("torchmetrics.classification.MulticlassAccuracy", |a| {
        stat(a, Statistic::Accuracy, Form::Multiclass)
    }),
    ("torchmetrics.Precision", |a| {
        stat(a, Statistic::Precision, Form::Wrapper)
    }),
    ("torchmetrics.classification.Precision", |a| {
        stat(a, Statistic::Precision, Form::Wrapper)
    }),
    ("torchmetrics.classification.BinaryPrecision", |a| {
        stat(a, Statistic::Precision, Form::Binary)
    }),
    ("torchmetrics.classification.MulticlassPrecision", |a| {
        stat(a, Statistic::Precision, Form::Multiclass)
    }),
    ("torchmetrics.Recall", |a| {
        stat(a, Statistic::Recall, Form::Wrapper)
    }),
    ("torchmetrics.classification.Recall", |a| {
        stat(a, Statistic::Recall, Form::Wrapper)
    }),
    ("torchmetrics.classification.BinaryRecall", |a| {
        stat(a, Statistic::Recall, Form::Binary)
    }),
    ("torchmetrics.classification.MulticlassRecall", |a| {
        stat(a, Statistic::Recall, Form::Multiclass)
    }),
    ("torchmetrics.F1Score", |a| {
        stat(a, Statistic::FBeta(1.0), Form::Wrapper)
    }),
    ("torchmetrics.classification.F1Score", |a| {
        stat(a, Statistic::FBeta(1.0), Form::Wrapper)
    }),
    ("torchmetrics.classification.BinaryF1Score", |a| {
        stat(a, Statistic::FBeta(1.0), Form::Binary)
    }),
    ("torchmetrics.classification.MulticlassF1Score", |a| {
        stat(a, Statistic::FBeta(1.0), Form::Multiclass)
    }),
    ("torchmetrics.FBetaScore", |a| fbeta(a, Form::Wrapper)),
    ("torchmetrics.classification.FBetaScore", |a| {
        fbeta(a, Form::Wrapper)
    }),
    ("torchmetrics.classification.BinaryFBetaScore", |a| {
        fbeta(a, Form::Binary)
    }),
    ("torchmetrics.classification.MulticlassFBetaScore", |a| {
        fbeta(a, Form::Multiclass)
    }),
    ("torchmetrics.AUROC", |a| auroc(a, Form::Wrapper)),
    ("torchmetrics.classification.AUROC", |a| {
        auroc(a, Form::Wrapper)
    }),
    ("torchmetrics.classification.BinaryAUROC", |a| {
        auroc(a, Form::Binary)
    }),
    ("torchmetrics.classification.MulticlassAUROC", |a| {
        auroc(a, Form::Multiclass)
    }),
    ("torchmetrics.ConfusionMatrix", |a| {
        confusion(a, Form::Wrapper)
    }),
    ("torchmetrics.classification.ConfusionMatrix", |a| {
        confusion(a, Form::Wrapper)
    }),
    ("torchmetrics.classification.BinaryConfusionMatrix", |a| {
        confusion(a, Form::Binary)
    }),
    (
        "torchmetrics.classification.MulticlassConfusionMatrix",
        |a| confusion(a, Form::Multiclass),
    ),
    ("torchmetrics.JaccardIndex", |a| jaccard(a, Form::Wrapper)),
    ("torchmetrics.classification.JaccardIndex", |a| {
        jaccard(a, Form::Wrapper)
    }),
    ("torchmetrics.classification.BinaryJaccardIndex", |a| {
        jaccard(a, Form::Binary)
    }),
    ("torchmetrics.classification.MulticlassJaccardIndex", |a| {
        jaccard(a, Form::Multiclass)
    }),
    ("torchmetrics.MeanSquaredError", mse),
    ("torchmetrics.regression.MeanSquaredError", mse),
    ("torchmetrics.MeanAbsoluteError", mae),
    ("torchmetrics.regression.MeanAbsoluteError", mae),
    ("torchmetrics.R2Score", r2),
    ("torchmetrics.regression.R2Score", r2),
    ("torchmetrics.segmentation.DiceScore", dice),
];

/// Which class a name is: the task wrapper (`task=` says which) or a task's own class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Wrapper,
    Binary,
    Multiclass,
}

/// The keys torchmetrics' classification classes take (the wrapper's superset); each metric refuses
/// those it does not.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ClassArgs {
    task: Option<String>,
    num_classes: Option<usize>,
    num_labels: Option<usize>,
    threshold: Option<f64>,
    top_k: Option<usize>,
    #[serde(default = "unset")]
    average: Value,
    ignore_index: Option<i64>,
    multidim_average: Option<String>,
    zero_division: Option<f64>,
    /// torchmetrics' checks of its inputs: trainyard's are always on, so the value changes nothing.
    #[serde(rename = "validate_args")]
    _validate_args: Option<bool>,
    beta: Option<f64>,
    #[serde(default = "unset")]
    normalize: Value,
    thresholds: Option<Value>,
    max_fpr: Option<f64>,
}

/// A key that was not given (`null` is a value: torchmetrics' `average=None`).
fn unset() -> Value {
    Value::String("\u{0}unset".into())
}

fn is_unset(v: &Value) -> bool {
    v == &unset()
}

fn parse_args<A: serde::de::DeserializeOwned>(args: &Value) -> anyhow::Result<A> {
    crate::registry::typed_args(args)
}

impl ClassArgs {
    /// The task and its classes: the wrapper's `task=`, or the class's own.
    fn task(&self, form: Form) -> anyhow::Result<Task> {
        let name = match form {
            Form::Binary => "binary",
            Form::Multiclass => "multiclass",
            Form::Wrapper => self.task.as_deref().ok_or_else(|| {
                anyhow::anyhow!(
                    "task is required: task: binary or task: multiclass (as torchmetrics asks)"
                )
            })?,
        };
        if form != Form::Wrapper && self.task.is_some() {
            anyhow::bail!("task: this class is its task's own; `task` is the wrapper's keyword");
        }
        match name {
            "binary" => {
                if self.top_k.is_some_and(|k| k != 1) {
                    anyhow::bail!("top_k applies to multiclass tasks");
                }
                Ok(Task::Binary {
                    threshold: self.threshold.unwrap_or(0.5),
                })
            }
            "multiclass" => {
                let num_classes = self.num_classes.ok_or_else(|| {
                    anyhow::anyhow!("num_classes is required for task multiclass (the data's classes: ${{data.num_classes}})")
                })?;
                if num_classes < 2 {
                    anyhow::bail!("num_classes={num_classes}: a multiclass task has at least 2 classes");
                }
                let top_k = self.top_k.unwrap_or(1);
                if top_k == 0 || top_k > num_classes {
                    anyhow::bail!("top_k={top_k}: between 1 and num_classes={num_classes}");
                }
                Ok(Task::Multiclass { num_classes, top_k })
            }
            "multilabel" => anyhow::bail!(
                "task: multilabel is not supported yet (binary and multiclass are); one binary metric per label \
                 is the workaround"
            ),
            other => anyhow::bail!("task: '{other}' is none of binary, multiclass, multilabel"),
        }
    }

    fn common(&self) -> anyhow::Result<()> {
        if let Some(m) = self.multidim_average.as_deref().filter(|m| *m != "global") {
            anyhow::bail!("multidim_average: '{m}' is not supported (global is)");
        }
        if self.num_labels.is_some() {
            anyhow::bail!("num_labels: multilabel tasks are not supported yet");
        }
        Ok(())
    }

    /// torchmetrics' `average`, with the class's own default.
    fn average(
        &self,
        default: Average,
        task: Task,
        allowed: &[Average],
    ) -> anyhow::Result<Average> {
        if let Task::Binary { .. } = task {
            return Ok(Average::Binary);
        }
        let average = match &self.average {
            v if is_unset(v) => default,
            Value::Null => Average::None,
            Value::String(s) => match s.as_str() {
                "micro" => Average::Micro,
                "macro" => Average::Macro,
                "weighted" => Average::Weighted,
                "none" => Average::None,
                other => {
                    anyhow::bail!("average: '{other}' is none of micro, macro, weighted, none")
                }
            },
            other => anyhow::bail!("average: {other} is not a string"),
        };
        if !allowed.contains(&average) {
            anyhow::bail!("average: {average:?} is not one this metric takes ({allowed:?})");
        }
        Ok(average)
    }

    fn refuse(&self, names: &[&str]) -> anyhow::Result<()> {
        let given = |n: &str| match n {
            "beta" => self.beta.is_some(),
            "normalize" => !is_unset(&self.normalize),
            "thresholds" => self.thresholds.as_ref().is_some_and(|t| !t.is_null()),
            "max_fpr" => self.max_fpr.is_some(),
            "top_k" => self.top_k.is_some(),
            "zero_division" => self.zero_division.is_some(),
            _ => false,
        };
        match names.iter().find(|n| given(n)) {
            Some(n) => anyhow::bail!("this metric takes no `{n}`"),
            None => Ok(()),
        }
    }
}

const ALL: &[Average] = &[
    Average::Micro,
    Average::Macro,
    Average::Weighted,
    Average::None,
];

fn stat(args: &Value, statistic: Statistic, form: Form) -> Built {
    let a: ClassArgs = parse_args(args)?;
    a.common()?;
    a.refuse(&["beta", "normalize", "thresholds", "max_fpr"])?;
    if statistic == Statistic::Accuracy && a.zero_division.is_some() {
        anyhow::bail!("Accuracy takes no `zero_division`");
    }
    stat_with(a, statistic, form)
}

fn fbeta(args: &Value, form: Form) -> Built {
    let a: ClassArgs = parse_args(args)?;
    a.common()?;
    a.refuse(&["normalize", "thresholds", "max_fpr"])?;
    let beta = a
        .beta
        .ok_or_else(|| anyhow::anyhow!("beta is required (F-beta's weight of recall)"))?;
    if beta <= 0.0 {
        anyhow::bail!("beta={beta}: must be larger than 0");
    }
    stat_with(a, Statistic::FBeta(beta), form)
}

fn stat_with(a: ClassArgs, statistic: Statistic, form: Form) -> Built {
    let task = a.task(form)?;
    let default = match form {
        Form::Wrapper => Average::Micro,
        _ => Average::Macro,
    };
    let average = a.average(default, task, ALL)?;
    Ok(Box::new(StatScore {
        statistic,
        average,
        zero_division: a.zero_division.unwrap_or(0.0),
        confusion: Confusion::new(task, a.ignore_index),
    }))
}

fn auroc(args: &Value, form: Form) -> Built {
    let a: ClassArgs = parse_args(args)?;
    a.common()?;
    a.refuse(&["beta", "normalize", "top_k", "zero_division", "max_fpr"])?;
    if a.thresholds.as_ref().is_some_and(|t| !t.is_null()) {
        anyhow::bail!("thresholds: only the exact curve (thresholds: null) is supported");
    }
    let task = a.task(form)?;
    let average = a.average(
        Average::Macro,
        task,
        &[Average::Macro, Average::Weighted, Average::None],
    )?;
    let classes = match task {
        Task::Binary { .. } => None,
        Task::Multiclass { num_classes, .. } => Some(num_classes),
    };
    Ok(Box::new(Auroc::new(classes, average, a.ignore_index)))
}

fn confusion(args: &Value, form: Form) -> Built {
    let a: ClassArgs = parse_args(args)?;
    a.common()?;
    a.refuse(&["beta", "thresholds", "max_fpr", "top_k", "zero_division"])?;
    if !is_unset(&a.average) {
        anyhow::bail!("ConfusionMatrix takes no `average`");
    }
    let normalize = match &a.normalize {
        v if is_unset(v) || v.is_null() => Normalize::None,
        Value::String(s) => match s.as_str() {
            "none" => Normalize::None,
            "true" => Normalize::True,
            "pred" => Normalize::Pred,
            "all" => Normalize::All,
            other => anyhow::bail!("normalize: '{other}' is none of true, pred, all, none"),
        },
        other => anyhow::bail!("normalize: {other} is not one of true, pred, all, none"),
    };
    let task = a.task(form)?;
    Ok(Box::new(ConfusionMatrix {
        normalize,
        confusion: Confusion::new(task, a.ignore_index),
    }))
}

fn jaccard(args: &Value, form: Form) -> Built {
    let a: ClassArgs = parse_args(args)?;
    a.common()?;
    a.refuse(&["beta", "normalize", "thresholds", "max_fpr", "top_k"])?;
    let task = a.task(form)?;
    let average = a.average(Average::Macro, task, ALL)?;
    Ok(Box::new(JaccardIndex {
        average,
        zero_division: a.zero_division.unwrap_or(0.0),
        confusion: Confusion::new(task, a.ignore_index),
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ErrorArgs {
    #[serde(default = "yes")]
    squared: bool,
    #[serde(default = "one")]
    num_outputs: usize,
}

fn yes() -> bool {
    true
}

fn one() -> usize {
    1
}

fn mse(args: &Value) -> Built {
    let a: ErrorArgs = parse_args(args)?;
    if a.num_outputs != 1 {
        anyhow::bail!(
            "num_outputs={}: one output is supported (every element counts)",
            a.num_outputs
        );
    }
    Ok(Box::new(MeanError::mse(a.squared)))
}

fn mae(args: &Value) -> Built {
    let a: ErrorArgs = parse_args(args)?;
    if !a.squared {
        anyhow::bail!("MeanAbsoluteError takes no `squared`");
    }
    if a.num_outputs != 1 {
        anyhow::bail!(
            "num_outputs={}: one output is supported (every element counts)",
            a.num_outputs
        );
    }
    Ok(Box::new(MeanError::mae()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct R2Args {
    #[serde(default)]
    adjusted: usize,
    multioutput: Option<String>,
}

fn r2(args: &Value) -> Built {
    let a: R2Args = parse_args(args)?;
    let multioutput = match a.multioutput.as_deref().unwrap_or("uniform_average") {
        "raw_values" => MultiOutput::RawValues,
        "uniform_average" => MultiOutput::UniformAverage,
        "variance_weighted" => MultiOutput::VarianceWeighted,
        other => anyhow::bail!(
            "multioutput: '{other}' is none of raw_values, uniform_average, variance_weighted"
        ),
    };
    Ok(Box::new(R2Score::new(a.adjusted, multioutput)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DiceArgs {
    num_classes: usize,
    #[serde(default = "yes")]
    include_background: bool,
    average: Option<String>,
    aggregation_level: Option<String>,
    input_format: Option<String>,
}

fn dice(args: &Value) -> Built {
    let a: DiceArgs = parse_args(args)?;
    let average = match a.average.as_deref().unwrap_or("macro") {
        "micro" => Average::Micro,
        "macro" => Average::Macro,
        "weighted" => Average::Weighted,
        "none" => Average::None,
        other => anyhow::bail!("average: '{other}' is none of micro, macro, weighted, none"),
    };
    let aggregation = match a.aggregation_level.as_deref().unwrap_or("samplewise") {
        "samplewise" => Aggregation::Samplewise,
        "global" => Aggregation::Global,
        other => anyhow::bail!("aggregation_level: '{other}' is none of samplewise, global"),
    };
    // Every input format is read by shape (scores or one-hot `(N, C, ...)`, indices `(N, ...)`).
    if let Some(f) = a
        .input_format
        .as_deref()
        .filter(|f| !["one-hot", "index", "mixed"].contains(f))
    {
        anyhow::bail!("input_format: '{f}' is none of one-hot, index, mixed");
    }
    if a.num_classes < 1 + usize::from(!a.include_background) {
        anyhow::bail!("num_classes={} leaves no class to score", a.num_classes);
    }
    Ok(Box::new(DiceScore::new(
        a.num_classes,
        a.include_background,
        average,
        aggregation,
    )))
}

/// The builder of a torchmetrics `_target_`, if this module has one.
pub fn builder(target: &str) -> Option<Builder> {
    TARGETS.iter().find(|(t, _)| *t == target).map(|(_, b)| *b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wrong_keywords_are_refused_by_name() {
        let err = |t: &str, a: Value| builder(t).unwrap()(&a).err().unwrap().to_string();
        assert!(
            err("torchmetrics.Accuracy", json!({"num_classes": 3})).contains("task is required")
        );
        assert!(err("torchmetrics.Accuracy", json!({"task": "multiclass"}))
            .contains("num_classes is required"));
        assert!(err(
            "torchmetrics.Accuracy",
            json!({"task": "multiclass", "num_classes": 3, "averge": "macro"})
        )
        .contains("averge"));
        assert!(err(
            "torchmetrics.Accuracy",
            json!({"task": "multilabel", "num_labels": 3})
        )
        .contains("multilabel"));
        assert!(
            err("torchmetrics.FBetaScore", json!({"task": "binary"})).contains("beta is required")
        );
        assert!(err(
            "torchmetrics.AUROC",
            json!({"task": "binary", "thresholds": 10})
        )
        .contains("thresholds"));
        assert!(builder("torchmetrics.R2Score").unwrap()(&json!({})).is_ok());
        assert!(
            builder("torchmetrics.classification.MulticlassF1Score").unwrap()(
                &json!({"num_classes": 4, "average": null})
            )
            .is_ok()
        );
    }
}
