//! The metrics a run records, named once for the loop, the loggers, the callbacks' `monitor` and a
//! search's `optimized_metric`: classification's `loss`/`acc1`/`acc5`, or a registered loss's `loss` and
//! its own metrics, each as `train/<name>` and `val/<name>`, with `val/<name>_best` kept as the run goes.

use super::Experiment;

/// What one validation or one training window measured, named.
#[derive(Debug, Clone, PartialEq)]
pub struct RunMetrics {
    /// (name, higher is better) besides `loss`; `None`: classification (acc1, acc5).
    custom: Option<Vec<(String, bool)>>,
}

impl RunMetrics {
    pub fn of(exp: &Experiment) -> RunMetrics {
        Self::for_loss(exp.loss.as_deref())
    }

    /// What a run with this loss records (`None`: classification).
    pub fn for_loss(loss: Option<&super::LossSpec>) -> RunMetrics {
        RunMetrics {
            custom: loss.map(|l| {
                l.metrics
                    .iter()
                    .map(|m| (m.name.clone(), m.higher_is_better))
                    .collect()
            }),
        }
    }

    /// Classification, as a run without `loss:` records.
    pub fn classification() -> RunMetrics {
        RunMetrics { custom: None }
    }

    /// The metrics of a validation besides `loss`, with their direction.
    fn val_metrics(&self) -> Vec<(String, bool)> {
        match &self.custom {
            Some(m) => m.clone(),
            None => vec![("acc1".into(), true), ("acc5".into(), true)],
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
            None => row.push(("train/acc1".into(), acc1)),
        }
        row
    }

    /// A validation's row: `val/loss` and the metrics (`val/acc1`, `val/acc5` for classification).
    pub fn val_row(
        &self,
        loss: f64,
        metrics: impl Fn(usize) -> f64,
        acc: (f64, f64),
    ) -> Vec<(String, f64)> {
        let mut row = vec![("val/loss".to_string(), loss)];
        match &self.custom {
            Some(m) => row.extend(
                m.iter()
                    .enumerate()
                    .map(|(i, (name, _))| (format!("val/{name}"), metrics(i))),
            ),
            None => row.extend([("val/acc1".into(), acc.0), ("val/acc5".into(), acc.1)]),
        }
        row
    }

    /// Validation metrics with their direction (`val/loss` lower, ...): what `_best` is kept for.
    pub fn val_directions(&self) -> Vec<(String, bool)> {
        std::iter::once(("val/loss".to_string(), false))
            .chain(
                self.val_metrics()
                    .into_iter()
                    .map(|(n, h)| (format!("val/{n}"), h)),
            )
            .collect()
    }

    /// The names of a training row, then a validation row (a CSV header's metric columns).
    pub fn row_names(&self) -> Vec<String> {
        let train = self.train_row(0.0, |_| 0.0, 0.0);
        let val = self.val_row(0.0, |_| 0.0, (0.0, 0.0));
        train.into_iter().chain(val).map(|(n, _)| n).collect()
    }

    /// Every name a run records per epoch: train and val rows and the `_best` of each val metric.
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

    /// The metrics beyond classification's fixed columns (a CSV logger's extra columns), in order.
    pub fn extra_columns(&self) -> Vec<String> {
        match &self.custom {
            Some(m) => m
                .iter()
                .flat_map(|(n, _)| [format!("train/{n}"), format!("val/{n}")])
                .collect(),
            None => Vec::new(),
        }
    }

    /// Is this classification (top-1/top-5)?
    pub fn is_classification(&self) -> bool {
        self.custom.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registered_loss_names_its_metrics_for_both_phases_and_their_best() {
        let m = RunMetrics {
            custom: Some(vec![("mae".into(), false), ("iou".into(), true)]),
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
}
