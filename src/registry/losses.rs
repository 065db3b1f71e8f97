//! trainyard's own losses, registered like a user's under torch.nn's names, so `loss:
//! {_target_: torch.nn.MSELoss}` reads as it does in a PyTorch project.

use super::{CandleLoss, LossValue, Metric};
use candle_core::{DType, Result, Tensor, D};

/// No arguments (torch's `reduction` is always `mean` here).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NoArgs {}

/// `torch.nn.MSELoss`: mean squared error; also reports the mean absolute error as `mae`.
struct MseLoss;

impl CandleLoss for MseLoss {
    fn metrics(&self) -> Vec<Metric> {
        vec![Metric::lower("mae")]
    }
    fn compute(&self, output: &Tensor, target: &Tensor) -> Result<LossValue> {
        let diff = output.broadcast_sub(&same_shape(target, output)?)?;
        Ok(LossValue {
            loss: diff.sqr()?.mean_all()?,
            metrics: vec![diff.detach().abs()?.mean_all()?],
        })
    }
}

fn mse(_: NoArgs) -> anyhow::Result<MseLoss> {
    Ok(MseLoss)
}
crate::register_candle_loss!("torch.nn.MSELoss", mse);

/// `torch.nn.L1Loss`: mean absolute error.
struct L1Loss;

impl CandleLoss for L1Loss {
    fn compute(&self, output: &Tensor, target: &Tensor) -> Result<LossValue> {
        let diff = output.broadcast_sub(&same_shape(target, output)?)?;
        Ok(LossValue {
            loss: diff.abs()?.mean_all()?,
            metrics: Vec::new(),
        })
    }
}

fn l1(_: NoArgs) -> anyhow::Result<L1Loss> {
    Ok(L1Loss)
}
crate::register_candle_loss!("torch.nn.L1Loss", l1);

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CrossEntropyArgs {
    #[serde(default)]
    pub(super) label_smoothing: f64,
}

impl CrossEntropyArgs {
    /// torch's own check of `label_smoothing`.
    pub(super) fn checked(self) -> anyhow::Result<f64> {
        anyhow::ensure!(
            (0.0..1.0).contains(&self.label_smoothing),
            "field `label_smoothing`: {} is not in [0, 1)",
            self.label_smoothing
        );
        Ok(self.label_smoothing)
    }
}

/// `torch.nn.CrossEntropyLoss` over logits `[N, C, ...]` and class indices `[N, ...]` (a class per
/// sample, or per pixel for segmentation); reports the share of correct argmaxes as `acc`.
struct CrossEntropy {
    label_smoothing: f64,
}

impl CandleLoss for CrossEntropy {
    fn metrics(&self) -> Vec<Metric> {
        vec![Metric::higher("acc")]
    }
    fn compute(&self, output: &Tensor, target: &Tensor) -> Result<LossValue> {
        let classes = output.dim(1)?;
        // Classes last, one row per sample (or pixel), as torch does for [N, C, d1, ...].
        let logits = match output.rank() {
            2 => output.clone(),
            r => {
                let mut order: Vec<usize> = (0..r).filter(|&d| d != 1).collect();
                order.push(1);
                output.permute(order)?.reshape(((), classes))?
            }
        };
        let labels = target.to_dtype(DType::U32)?.flatten_all()?;
        if labels.dim(0)? != logits.dim(0)? {
            candle_core::bail!(
                "CrossEntropyLoss: output {:?} has {} rows of {classes} classes, the target {:?} has {}",
                output.dims(),
                logits.dim(0)?,
                target.dims(),
                labels.dim(0)?
            );
        }
        let logp = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let nll = candle_nn::loss::nll(&logp, &labels)?;
        let loss = match self.label_smoothing {
            e if e > 0.0 => {
                let uniform = logp.mean(D::Minus1)?.mean_all()?.neg()?;
                (nll.affine(1.0 - e, 0.0)? + uniform.affine(e, 0.0)?)?
            }
            _ => nll,
        };
        let hits = logits
            .detach()
            .argmax(D::Minus1)?
            .eq(&labels)?
            .to_dtype(DType::F32)?;
        Ok(LossValue {
            loss,
            metrics: vec![hits.mean_all()?],
        })
    }
}

fn cross_entropy(args: CrossEntropyArgs) -> anyhow::Result<CrossEntropy> {
    Ok(CrossEntropy {
        label_smoothing: args.checked()?,
    })
}
crate::register_candle_loss!("torch.nn.CrossEntropyLoss", cross_entropy);

/// The target as the output's shape (a regression's `[N]` target for an `[N, 1]` output), or an error
/// that shows both shapes.
fn same_shape(target: &Tensor, output: &Tensor) -> Result<Tensor> {
    let target = target.to_dtype(output.dtype())?;
    if target.dims() == output.dims() {
        return Ok(target);
    }
    if target.elem_count() == output.elem_count() {
        return target.reshape(output.dims());
    }
    candle_core::bail!(
        "the model's output {:?} and the target {:?} differ in shape",
        output.dims(),
        target.dims()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn value(loss: &dyn CandleLoss, out: Tensor, target: Tensor) -> (f32, Vec<f32>) {
        let v = loss.compute(&out, &target).unwrap();
        let metrics = v.metrics.iter().map(|m| m.to_scalar::<f32>().unwrap());
        (v.loss.to_scalar::<f32>().unwrap(), metrics.collect())
    }

    #[test]
    fn mse_and_mae_as_torch_computes_them() {
        let out = Tensor::new(&[[1f32], [2.0], [4.0]], &Device::Cpu).unwrap();
        let target = Tensor::new(&[1f32, 3.0, 2.0], &Device::Cpu).unwrap();
        // torch: F.mse_loss([1,2,4], [1,3,2]) = (0 + 1 + 4) / 3; l1 = (0 + 1 + 2) / 3.
        let (loss, metrics) = value(&MseLoss, out, target);
        assert!((loss - 5.0 / 3.0).abs() < 1e-6);
        assert!((metrics[0] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn per_pixel_cross_entropy_puts_classes_last() {
        // One 1x2 image, 2 classes: pixel 0 says class 1, pixel 1 says class 0; the mask says [1, 1].
        let out = Tensor::new(&[[[[0f32, 3.0]], [[2.0, 0.0]]]], &Device::Cpu).unwrap();
        let mask = Tensor::new(&[[[1f32, 1.0]]], &Device::Cpu).unwrap();
        let (loss, metrics) = value(
            &CrossEntropy {
                label_smoothing: 0.0,
            },
            out,
            mask,
        );
        let lse = |a: f32, b: f32| (a.exp() + b.exp()).ln();
        let want = ((lse(0.0, 2.0) - 2.0) + (lse(3.0, 0.0) - 0.0)) / 2.0;
        assert!((loss - want).abs() < 1e-5, "{loss} vs {want}");
        assert_eq!(metrics, vec![0.5]);
    }

    #[test]
    fn a_target_of_another_size_names_both_shapes() {
        let out = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
        let target = Tensor::zeros(4, DType::F32, &Device::Cpu).unwrap();
        let err = MseLoss.compute(&out, &target).err().unwrap().to_string();
        assert!(err.contains("[2, 3]") && err.contains("[4]"), "{err}");
    }
}
