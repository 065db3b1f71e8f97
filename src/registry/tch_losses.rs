//! trainyard's own losses on libtorch, under the same torch.nn names and with the same metrics as their
//! Candle versions (`losses`): `MSELoss` (+`mae`), `L1Loss`, `CrossEntropyLoss` (+`acc`, per pixel too).

use super::losses::{CrossEntropyArgs, NoArgs};
use super::{Metric, TchLoss, TchLossValue};
use tch::{Kind, Reduction, Tensor};

struct MseLoss;

impl TchLoss for MseLoss {
    fn metrics(&self) -> Vec<Metric> {
        vec![Metric::lower("mae")]
    }
    fn compute(&self, output: &Tensor, target: &Tensor) -> anyhow::Result<TchLossValue> {
        let diff = output.f_sub(&same_shape(target, output)?)?;
        Ok(TchLossValue {
            loss: diff.f_square()?.f_mean(Kind::Float)?,
            metrics: vec![diff.f_detach()?.f_abs()?.f_mean(Kind::Float)?],
        })
    }
}

fn mse(_: NoArgs) -> anyhow::Result<MseLoss> {
    Ok(MseLoss)
}
crate::register_tch_loss!("torch.nn.MSELoss", mse);

struct L1Loss;

impl TchLoss for L1Loss {
    fn compute(&self, output: &Tensor, target: &Tensor) -> anyhow::Result<TchLossValue> {
        let diff = output.f_sub(&same_shape(target, output)?)?;
        Ok(TchLossValue {
            loss: diff.f_abs()?.f_mean(Kind::Float)?,
            metrics: Vec::new(),
        })
    }
}

fn l1(_: NoArgs) -> anyhow::Result<L1Loss> {
    Ok(L1Loss)
}
crate::register_tch_loss!("torch.nn.L1Loss", l1);

/// Logits `[N, C, ...]` against class indices `[N, ...]` (libtorch's own cross-entropy takes both).
struct CrossEntropy {
    label_smoothing: f64,
}

impl TchLoss for CrossEntropy {
    fn metrics(&self) -> Vec<Metric> {
        vec![Metric::higher("acc")]
    }
    fn compute(&self, output: &Tensor, target: &Tensor) -> anyhow::Result<TchLossValue> {
        let mut want: Vec<i64> = output.size();
        if want.len() >= 2 {
            want.remove(1);
        }
        let labels = target.f_to_kind(Kind::Int64)?;
        anyhow::ensure!(
            labels.numel() as i64 == want.iter().product::<i64>(),
            "CrossEntropyLoss: output {:?} holds {want:?} rows of classes, the target is {:?}",
            output.size(),
            target.size()
        );
        let labels = labels.f_reshape(&want)?;
        let loss = output.f_cross_entropy_loss::<Tensor>(
            &labels,
            None,
            Reduction::Mean,
            -100,
            self.label_smoothing,
        )?;
        let hits = output
            .f_detach()?
            .f_argmax(1, false)?
            .f_eq_tensor(&labels)?
            .f_to_kind(Kind::Float)?
            .f_mean(Kind::Float)?;
        Ok(TchLossValue {
            loss,
            metrics: vec![hits],
        })
    }
}

fn cross_entropy(args: CrossEntropyArgs) -> anyhow::Result<CrossEntropy> {
    Ok(CrossEntropy {
        label_smoothing: args.checked()?,
    })
}
crate::register_tch_loss!("torch.nn.CrossEntropyLoss", cross_entropy);

/// The target as the output's shape, or an error that shows both shapes.
fn same_shape(target: &Tensor, output: &Tensor) -> anyhow::Result<Tensor> {
    let target = target.f_to_kind(output.kind())?;
    if target.size() == output.size() {
        return Ok(target);
    }
    anyhow::ensure!(
        target.numel() == output.numel(),
        "the model's output {:?} and the target {:?} differ in shape",
        output.size(),
        target.size()
    );
    Ok(target.f_reshape(output.size())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::CandleLoss;

    fn candle(t: &Tensor) -> candle_core::Tensor {
        let dims: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
        let v = Vec::<f32>::try_from(&t.flatten(0, -1).to_kind(Kind::Float)).unwrap();
        candle_core::Tensor::from_vec(v, dims, &candle_core::Device::Cpu).unwrap()
    }

    /// The same loss and metrics as the Candle versions on the same values (which are checked against
    /// torch's numbers in `losses`): a regression and a per-pixel segmentation with label smoothing.
    #[rstest::rstest]
    #[case::mse("torch.nn.MSELoss", serde_json::json!({}), vec![4, 1], vec![4], false)]
    #[case::l1("torch.nn.L1Loss", serde_json::json!({}), vec![4, 3], vec![4, 3], false)]
    #[case::per_pixel("torch.nn.CrossEntropyLoss", serde_json::json!({"label_smoothing": 0.1}),
                      vec![2, 3, 4, 4], vec![2, 4, 4], true)]
    fn each_loss_agrees_with_its_candle_version(
        #[case] target: &str,
        #[case] args: serde_json::Value,
        #[case] out_shape: Vec<i64>,
        #[case] target_shape: Vec<i64>,
        #[case] classes: bool,
    ) {
        tch::manual_seed(3);
        let out = Tensor::randn(&out_shape, (Kind::Float, tch::Device::Cpu));
        let y = match classes {
            true => Tensor::randint(out_shape[1], &target_shape, (Kind::Int64, tch::Device::Cpu)),
            false => Tensor::randn(&target_shape, (Kind::Float, tch::Device::Cpu)),
        };
        let ours = (crate::registry::tch_loss(target).unwrap().build)(&args)
            .unwrap()
            .compute(&out, &y)
            .unwrap();
        let theirs: Box<dyn CandleLoss> =
            (crate::registry::loss(target).unwrap().build)(&args).unwrap();
        let value = theirs.compute(&candle(&out), &candle(&y)).unwrap();
        let close = |a: &Tensor, b: &candle_core::Tensor| {
            let a = a.double_value(&[]);
            let b = b.to_scalar::<f32>().unwrap() as f64;
            assert!((a - b).abs() < 1e-5, "{target}: {a} vs {b}");
        };
        close(&ours.loss, &value.loss);
        assert_eq!(ours.metrics.len(), value.metrics.len());
        for (a, b) in ours.metrics.iter().zip(&value.metrics) {
            close(a, b);
        }
    }
}
