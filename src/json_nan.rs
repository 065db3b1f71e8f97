//! JSON has no NaN or infinity: serde_json writes a non-finite `f64` as `null`. A run whose loss diverged
//! still records it (a checkpoint's metrics, `summary.json`); these read such a `null` back as NaN, so the
//! file stays readable (to resume, test, or list the run).

use serde::{Deserialize, Deserializer};

/// A metric map whose values may be `null`.
pub fn map<'de, D, M>(d: D) -> Result<M, D::Error>
where
    D: Deserializer<'de>,
    M: FromIterator<(String, f64)>,
{
    let raw = std::collections::BTreeMap::<String, Option<f64>>::deserialize(d)?;
    Ok(raw
        .into_iter()
        .map(|(k, v)| (k, v.unwrap_or(f64::NAN)))
        .collect())
}

/// One value that may be `null`.
pub fn value<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// ModelCheckpoint's best `(value, epoch)`, whose value may be `null`.
pub fn best<'de, D: Deserializer<'de>>(d: D) -> Result<Option<(f64, u64)>, D::Error> {
    Ok(Option::<(Option<f64>, u64)>::deserialize(d)?.map(|(v, e)| (v.unwrap_or(f64::NAN), e)))
}

#[cfg(test)]
mod tests {
    /// A diverged run's training state round-trips through JSON.
    #[test]
    fn non_finite_values_come_back_as_nan() {
        let state = crate::storage::checkpoint::TrainingState {
            epoch: 2,
            global_step: 4,
            metrics: [("val/loss".to_string(), f64::NAN)].into_iter().collect(),
            best: Some((f64::INFINITY, 1)),
            epochs_without_improvement: 0,
            stop_best: None,
            batches_done: 0,
            plateau: None,
            best_checkpoint: None,
            running: None,
        };
        let text = serde_json::to_string(&state).unwrap();
        let back: crate::storage::checkpoint::TrainingState = serde_json::from_str(&text).unwrap();
        assert!(back.metrics["val/loss"].is_nan());
        assert!(back.best.unwrap().0.is_nan());
    }
}
