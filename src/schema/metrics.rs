//! The metrics a run records, named once for the loop, the loggers, the callbacks' `monitor` and a
//! search's `optimized_metric`: classification's `loss`/`acc1`/`acc5` (or `loss`/`acc` with
//! `accuracy_names: acc`), or a registered loss's `loss` and its own metrics, each as `train/<name>` and
//! `val/<name>`, with `val/<name>_best` kept as the run goes, and `test/<name>` after it with `test: true`.

use super::Experiment;
use serde::{Deserialize, Serialize};

/// How classification's accuracies are named.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum AccuracyNames {
    /// Top-1 and top-5: `val/acc1`, `val/acc5`.
    #[default]
    Acc1Acc5,
    /// Top-1 alone as `acc` (`train/acc`, `val/acc`, `test/acc`): what lightning-hydra-template's
    /// module logs (torchmetrics' Accuracy).
    Acc,
}

/// What one validation or one training window measured, named.
#[derive(Debug, Clone, PartialEq)]
pub struct RunMetrics {
    /// (name, higher is better) besides `loss`; `None`: classification.
    custom: Option<Vec<(String, bool)>>,
    accuracy: AccuracyNames,
    /// `test: true`: the test row's names are columns too.
    tests: bool,
    /// The configured stateful metrics that compute one number (`metrics:`), with their direction:
    /// `train/<name>`, `val/<name>` and `test/<name>` besides the loss's.
    stateful: Vec<(String, bool)>,
    /// Those also logged each training step (`on_step`): `train/<name>_step`.
    stepwise: Vec<String>,
}

impl RunMetrics {
    pub fn of(exp: &Experiment) -> RunMetrics {
        RunMetrics {
            tests: exp.test,
            ..Self::named(exp.loss.as_deref(), exp.accuracy_names).with_stateful(&exp.metrics)
        }
    }

    /// These metrics and the configured stateful ones that compute one number.
    pub fn with_stateful(mut self, specs: &[super::MetricSpec]) -> RunMetrics {
        self.stateful = specs
            .iter()
            .filter(|m| m.scalar)
            .map(|m| (m.name.clone(), m.higher_is_better))
            .collect();
        self.stepwise = specs
            .iter()
            .filter(|m| m.scalar && m.on_step)
            .map(|m| m.name.clone())
            .collect();
        self
    }

    /// What a run with this loss records (`None`: classification, its accuracies named `accuracy`).
    pub fn named(loss: Option<&super::LossSpec>, accuracy: AccuracyNames) -> RunMetrics {
        RunMetrics {
            custom: loss.map(|l| {
                l.metrics
                    .iter()
                    .map(|m| (m.name.clone(), m.higher_is_better))
                    .collect()
            }),
            accuracy,
            tests: false,
            stateful: Vec::new(),
            stepwise: Vec::new(),
        }
    }

    /// Classification, as a run without `loss:` records.
    pub fn classification() -> RunMetrics {
        Self::named(None, AccuracyNames::Acc1Acc5)
    }

    /// The metrics of a validation besides `loss`, with their direction.
    fn val_metrics(&self) -> Vec<(String, bool)> {
        match (&self.custom, self.accuracy) {
            (Some(m), _) => m.clone(),
            (None, AccuracyNames::Acc) => vec![("acc".into(), true)],
            (None, AccuracyNames::Acc1Acc5) => vec![("acc1".into(), true), ("acc5".into(), true)],
        }
    }

    /// Top-1's name (`acc1`, or `acc`).
    fn top1(&self) -> &'static str {
        match self.accuracy {
            AccuracyNames::Acc => "acc",
            AccuracyNames::Acc1Acc5 => "acc1",
        }
    }

    /// A training window's row: `train/loss` and the metrics (`train/acc1` for classification).
    pub fn train_row(
        &self,
        loss: f64,
        metrics: impl Fn(usize) -> f64,
        acc1: f64,
    ) -> Vec<(String, f64)> {
        let mut row = vec![("train/loss".to_string(), loss)];
        match &self.custom {
            Some(m) => row.extend(
                m.iter()
                    .enumerate()
                    .map(|(i, (name, _))| (format!("train/{name}"), metrics(i))),
            ),
            None => row.push((format!("train/{}", self.top1()), acc1)),
        }
        row.extend(
            self.stateful
                .iter()
                .map(|(n, _)| (format!("train/{n}"), f64::NAN)),
        );
        row
    }

    /// A validation's row: `val/loss` and the metrics (`val/acc1`, `val/acc5` for classification).
    pub fn val_row(
        &self,
        loss: f64,
        metrics: impl Fn(usize) -> f64,
        acc: (f64, f64),
    ) -> Vec<(String, f64)> {
        self.evaluation_row("val", loss, metrics, acc)
    }

    /// The test's row (`test: true`): as a validation's, under `test/`.
    pub fn test_row(
        &self,
        loss: f64,
        metrics: impl Fn(usize) -> f64,
        acc: (f64, f64),
    ) -> Vec<(String, f64)> {
        self.evaluation_row("test", loss, metrics, acc)
    }

    fn evaluation_row(
        &self,
        phase: &str,
        loss: f64,
        metrics: impl Fn(usize) -> f64,
        acc: (f64, f64),
    ) -> Vec<(String, f64)> {
        let mut row = vec![(format!("{phase}/loss"), loss)];
        row.extend(
            self.val_metrics()
                .into_iter()
                .enumerate()
                .map(|(i, (name, _))| {
                    let value = match (&self.custom, i) {
                        (Some(_), _) => metrics(i),
                        (None, 0) => acc.0,
                        (None, _) => acc.1,
                    };
                    (format!("{phase}/{name}"), value)
                }),
        );
        row.extend(
            self.stateful
                .iter()
                .map(|(n, _)| (format!("{phase}/{n}"), f64::NAN)),
        );
        row
    }

    /// Validation metrics with their direction (`val/loss` lower, ...): what `_best` is kept for.
    pub fn val_directions(&self) -> Vec<(String, bool)> {
        std::iter::once(("val/loss".to_string(), false))
            .chain(
                self.val_metrics()
                    .into_iter()
                    .chain(self.stateful.iter().cloned())
                    .map(|(n, h)| (format!("val/{n}"), h)),
            )
            .collect()
    }

    /// The stateful metrics' names and directions (`metrics:`), scalar ones.
    pub fn stateful(&self) -> &[(String, bool)] {
        &self.stateful
    }

    /// The names of a training row, a validation row and, with `test: true`, the test row (a CSV
    /// header's metric columns).
    pub fn row_names(&self) -> Vec<String> {
        let train = self.train_row(0.0, |_| 0.0, 0.0);
        let val = self.val_row(0.0, |_| 0.0, (0.0, 0.0));
        let test = match self.tests {
            true => self.test_row(0.0, |_| 0.0, (0.0, 0.0)),
            false => Vec::new(),
        };
        let steps = self
            .stepwise
            .iter()
            .map(|n| (format!("train/{n}_step"), 0.0));
        train
            .into_iter()
            .chain(steps)
            .chain(val)
            .chain(test)
            .map(|(n, _)| n)
            .collect()
    }

    /// Every name a run records per epoch: train and val rows and the `_best` of each val metric (what a
    /// callback may monitor; the test comes after training).
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .train_row(0.0, |_| 0.0, 0.0)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        for (name, _) in self.val_directions() {
            names.push(format!("{name}_best"));
            names.push(name);
        }
        names
    }

    /// Is this classification with top-1 and top-5 under trainyard's names (`acc1`, `acc5`), where
    /// lightning-hydra-template's `val/acc` means `val/acc1`?
    pub fn is_topk_classification(&self) -> bool {
        self.custom.is_none() && self.accuracy == AccuracyNames::Acc1Acc5
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registered_loss_names_its_metrics_for_both_phases_and_their_best() {
        let m = RunMetrics {
            custom: Some(vec![("mae".into(), false), ("iou".into(), true)]),
            accuracy: AccuracyNames::Acc1Acc5,
            tests: false,
            stateful: Vec::new(),
            stepwise: Vec::new(),
        };
        assert_eq!(
            m.names(),
            [
                "train/loss",
                "train/mae",
                "train/iou",
                "val/loss_best",
                "val/loss",
                "val/mae_best",
                "val/mae",
                "val/iou_best",
                "val/iou"
            ]
        );
        let row = m.val_row(0.5, |i| [0.25, 0.75][i], (0.0, 0.0));
        assert_eq!(
            row,
            [
                ("val/loss".into(), 0.5),
                ("val/mae".into(), 0.25),
                ("val/iou".into(), 0.75)
            ]
        );
        assert_eq!(m.val_directions()[2], ("val/iou".to_string(), true));
    }

    #[test]
    fn classification_records_top1_and_top5() {
        let names = RunMetrics::classification().names();
        assert!(names.contains(&"val/acc5_best".to_string()));
        assert!(names.contains(&"train/acc1".to_string()));
    }

    /// `accuracy_names: acc` with `test: true`: the template's names, each phase's top-1 as `acc`.
    #[test]
    fn the_templates_names_have_top1_as_acc_in_every_phase() {
        let m = RunMetrics {
            tests: true,
            ..RunMetrics::named(None, AccuracyNames::Acc)
        };
        assert_eq!(
            m.row_names(),
            [
                "train/loss",
                "train/acc",
                "val/loss",
                "val/acc",
                "test/loss",
                "test/acc"
            ]
        );
        assert!(m.names().contains(&"val/acc_best".to_string()));
        assert_eq!(
            m.test_row(0.5, |_| 0.0, (0.75, 0.9)),
            [("test/loss".into(), 0.5), ("test/acc".into(), 0.75)]
        );
    }
}
