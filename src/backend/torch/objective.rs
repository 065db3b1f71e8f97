//! What a step computes from the model's output: classification's cross-entropy (with top-1/top-5 hits),
//! a registered loss with its named metrics (`registry::TchLoss`: regression, segmentation...), or the
//! loss a registered model computed itself. A batch's statistics are packed into one f64 tensor on the
//! device, so reading them is one copy and one wait.

use crate::backend::StepStats;
use crate::registry::TchLoss;
use anyhow::Context;
use tch::{Device, Kind, Tensor};

/// The run's objective.
pub(super) struct Objective {
    loss: Option<Box<dyn TchLoss>>,
    /// Its metrics' count (`LossSpec::metrics`, asked once at compose time).
    metrics: usize,
    label_smoothing: f64,
}

/// One pass's loss (differentiable when the pass kept its graph) and its packed statistics.
pub(super) struct Computed {
    pub loss: Tensor,
    pub stats: Packed,
}

/// A batch's statistics on the device.
pub enum Packed {
    /// [loss, top-1 hits, top-5 hits].
    Classes(Tensor),
    /// [loss, each metric's batch mean].
    Values(Tensor),
}

impl Objective {
    pub fn new(exp: &crate::schema::Experiment) -> anyhow::Result<Objective> {
        let loss = match &exp.loss {
            Some(spec) => {
                let entry = crate::registry::tch_loss(&spec.spec.target).with_context(|| {
                    format!(
                        "loss: _target_ {} is registered for Candle only (register_candle_loss!); \
                         register its tch version with register_tch_loss!, or use backend=candle",
                        spec.spec.target
                    )
                })?;
                let built = (entry.build)(&spec.spec.args)
                    .map_err(|e| anyhow::anyhow!(spec.spec.refused(&e)))?;
                anyhow::ensure!(
                    built.metrics() == spec.metrics,
                    "loss: _target_ {}: its tch version reports {:?}, its Candle version {:?}: a loss \
                     registered for both backends reports the same metrics",
                    spec.spec.target,
                    names(&built.metrics()),
                    names(&spec.metrics)
                );
                Some(built)
            }
            None => None,
        };
        Ok(Objective {
            metrics: exp.loss.as_ref().map_or(0, |l| l.metrics.len()),
            loss,
            label_smoothing: exp.model.label_smoothing,
        })
    }

    /// The loss of `logits` against `y` (a model's own loss when it computed one) and its statistics.
    /// Label smoothing applies in training only, as Lightning computes validation's plain loss.
    pub fn compute(
        &self,
        logits: &Tensor,
        own_loss: Option<Tensor>,
        y: &Tensor,
        train: bool,
    ) -> anyhow::Result<Computed> {
        if let Some(loss) = &self.loss {
            let value = loss.compute(logits, y)?;
            anyhow::ensure!(
                value.metrics.len() == self.metrics && value.loss.numel() == 1,
                "the loss returned {} metric values and a loss of shape {:?}; its metrics() names {}, and \
                 the loss is a scalar",
                value.metrics.len(),
                value.loss.size(),
                self.metrics
            );
            let stats = tch::no_grad(|| -> anyhow::Result<Tensor> {
                let mut parts = vec![scalar(&value.loss)?];
                for m in &value.metrics {
                    parts.push(scalar(m)?);
                }
                Ok(Tensor::f_stack(&parts, 0)?)
            })?;
            return Ok(Computed {
                loss: value.loss,
                stats: Packed::Values(stats),
            });
        }
        let loss = match own_loss {
            Some(loss) => loss,
            None => logits.f_cross_entropy_loss::<Tensor>(
                y,
                None,
                tch::Reduction::Mean,
                -100,
                if train { self.label_smoothing } else { 0.0 },
            )?,
        };
        let stats = Packed::Classes(class_stats(logits, &loss, y)?);
        Ok(Computed { loss, stats })
    }
}

fn names(metrics: &[crate::registry::Metric]) -> Vec<&str> {
    metrics.iter().map(|m| m.name.as_str()).collect()
}

fn scalar(t: &Tensor) -> anyhow::Result<Tensor> {
    Ok(t.f_detach()?.f_to_kind(Kind::Double)?.f_reshape([])?)
}

/// The batch's loss and top-1/top-5 hits. A row's rank is how many classes score strictly higher than
/// the true one (ties go to the true class; a NaN scores higher; a NaN true class misses), as
/// `backend::topk_hits` counts on the host.
pub(super) fn class_stats(
    logits: &Tensor,
    loss: &Tensor,
    labels: &Tensor,
) -> anyhow::Result<Tensor> {
    tch::no_grad(|| -> anyhow::Result<Tensor> {
        let logits = logits.f_detach()?;
        let target = logits.f_gather(1, &labels.f_unsqueeze(1)?, false)?;
        let classes = logits.size().get(1).copied().unwrap_or(1).max(5);
        let missed = target
            .f_isnan()?
            .f_squeeze_dim(1)?
            .f_to_kind(Kind::Int64)?
            .f_mul_scalar(classes)?;
        let higher = logits
            .f_gt_tensor(&target)?
            .f_logical_or(&logits.f_isnan()?)?
            .f_sum_dim_intlist(Some([1i64].as_slice()), false, Kind::Int64)?
            .f_add(&missed)?;
        let top1 = higher.f_eq(0)?.f_sum(Kind::Double)?;
        let top5 = higher.f_lt(5)?.f_sum(Kind::Double)?;
        Ok(Tensor::f_stack(&[scalar(loss)?, top1, top5], 0)?)
    })
}

impl Packed {
    /// The statistics on the host: the host waits here for the device's queued work.
    pub fn read(&self, count: usize) -> anyhow::Result<StepStats> {
        let (Packed::Classes(t) | Packed::Values(t)) = self;
        let v =
            Vec::<f64>::try_from(&t.f_to(Device::Cpu)?).context("reading a batch's statistics")?;
        let n = count as f64;
        let mut stats = StepStats {
            loss_sum: v[0] * n,
            count: count as u64,
            ..StepStats::default()
        };
        match self {
            Packed::Classes(_) => {
                stats.correct1 = v[1] as u64;
                stats.correct5 = v[2] as u64;
            }
            Packed::Values(_) => {
                for (sum, mean) in stats.metric_sums.iter_mut().zip(&v[1..]) {
                    *sum = mean * n;
                }
            }
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device's count of hits is the host's (`topk_hits`), ties (to the true class) and fewer than
    /// five classes included, and the loss comes back as it was.
    #[rstest::rstest]
    #[case::ties(3, vec![0.5, 0.5, 0.1, 0.2, 0.2, 0.2], vec![1, 2])]
    #[case::six_classes(6, vec![6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 9.0], vec![5, 0])]
    #[case::nan_row(2, vec![f32::NAN, 1.0, 0.0, 1.0], vec![1, 0])]
    fn device_hits_match_the_host_rule(
        #[case] classes: usize,
        #[case] logits: Vec<f32>,
        #[case] labels: Vec<u32>,
    ) {
        let rows = labels.len() as i64;
        let t = Tensor::from_slice(&logits).reshape([rows, classes as i64]);
        let y = Tensor::from_slice(&labels.iter().map(|&l| i64::from(l)).collect::<Vec<_>>());
        let loss = Tensor::from_slice(&[0.75f32]).reshape([]);
        let stats = Packed::Classes(class_stats(&t, &loss, &y).unwrap())
            .read(labels.len())
            .unwrap();
        let (top1, top5) = crate::backend::topk_hits(&logits, classes, &labels);
        assert_eq!((stats.correct1, stats.correct5), (top1, top5));
        assert_eq!(stats.loss_sum, 0.75 * labels.len() as f64);
    }
}
