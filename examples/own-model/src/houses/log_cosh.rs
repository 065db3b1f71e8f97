//! The log-cosh loss (`own_model.losses.LogCosh`): quadratic near zero, linear far out, so a few odd
//! prices do not dominate. It reports the mean absolute error (`mae`, in the target's units) and the mean
//! absolute percentage error (`mape`), logged as `train/<name>` and `val/<name>`.

use candle_core::{Result, Tensor};
use trainyard::registry::{CandleLoss, LossValue, Metric};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LogCoshArgs {}

struct LogCosh;

impl CandleLoss for LogCosh {
    fn metrics(&self) -> Vec<Metric> {
        vec![Metric::lower("mae"), Metric::lower("mape")]
    }

    fn compute(&self, output: &Tensor, target: &Tensor) -> Result<LossValue> {
        let target = target.reshape(output.dims())?;
        let diff = (output - &target)?;
        // log(cosh(d)) = |d| + log(1 + exp(-2|d|)) - log 2, stable for large |d|.
        let abs = diff.abs()?;
        let loss =
            ((&abs + ((abs.affine(-2.0, 0.0)?.exp()? + 1.0)?.log()?))? - 2f64.ln())?.mean_all()?;
        let abs = abs.detach();
        let mape = (abs.broadcast_div(&target.abs()?)? * 100.0)?.mean_all()?;
        Ok(LossValue {
            loss,
            metrics: vec![abs.mean_all()?, mape],
        })
    }
}

fn log_cosh(_: LogCoshArgs) -> anyhow::Result<LogCosh> {
    Ok(LogCosh)
}

trainyard::register_candle_loss!("own_model.losses.LogCosh", log_cosh);
