//! Checkpoints are safetensors files: weights under their model names, optimizer state under
//! `optimizer.*`, and the training state (epoch, step, metrics, config) as JSON in the metadata.
//! Written to a temporary file and renamed, so a crash never leaves a torn checkpoint.

use crate::tensor::{HostTensor, StateDict};
use anyhow::Context;
use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;
use std::path::Path;

/// Training progress stored beside the tensors.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrainingState {
    /// Epochs fully completed.
    pub epoch: u64,
    pub global_step: u64,
    #[serde(deserialize_with = "crate::json_nan::map")]
    pub metrics: HashMap<String, f64>,
    /// The best monitored value so far and its epoch, for ModelCheckpoint/EarlyStopping after resume.
    #[serde(deserialize_with = "crate::json_nan::best")]
    pub best: Option<(f64, u64)>,
    /// Validation checks without improvement (EarlyStopping's patience counts these).
    pub epochs_without_improvement: u64,
    /// Batches of epoch `epoch` already trained when the checkpoint was taken mid-epoch (after a
    /// `val_check_interval` validation); resuming skips exactly these. 0 at an epoch's end.
    #[serde(default)]
    pub batches_done: u64,
    /// ReduceLROnPlateau's rate, best value and counters (`scheduler.name: plateau`).
    #[serde(default)]
    pub plateau: Option<crate::optim::plateau::PlateauState>,
    /// The best checkpoint's path (Lightning's `best_model_path`), so a resumed run tests the best
    /// checkpoint even when no later epoch beats it.
    #[serde(default)]
    pub best_checkpoint: Option<String>,
}

pub fn save(
    path: &Path,
    state: &StateDict,
    training: &TrainingState,
    config_yaml: &str,
) -> anyhow::Result<()> {
    let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = state
        .iter()
        .map(|(k, t)| {
            (
                k.clone(),
                t.data.iter().flat_map(|v| v.to_le_bytes()).collect(),
                t.shape.clone(),
            )
        })
        .collect();
    let views: Vec<(String, TensorView)> = bytes
        .iter()
        .map(|(k, b, s)| Ok((k.clone(), TensorView::new(Dtype::F32, s.clone(), b)?)))
        .collect::<Result<_, safetensors::SafeTensorError>>()?;
    let mut metadata = HashMap::new();
    metadata.insert(
        "training_state".to_string(),
        serde_json::to_string(training)?,
    );
    metadata.insert("config".to_string(), config_yaml.to_string());
    metadata.insert("format".to_string(), "trainyard-1".to_string());
    let data = safetensors::serialize(views, Some(metadata))?;
    crate::records::write_atomic(path, &data)
        .with_context(|| format!("writing checkpoint {}", path.display()))
}

pub struct Loaded {
    pub state: StateDict,
    pub training: Option<TrainingState>,
    /// The run's resolved config (YAML) the checkpoint was written with.
    pub config: Option<String>,
}

pub fn load(path: &Path) -> anyhow::Result<Loaded> {
    let data =
        std::fs::read(path).with_context(|| format!("reading checkpoint {}", path.display()))?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(&data)
        .with_context(|| format!("{} is not a safetensors file", path.display()))?;
    let tensors = safetensors::SafeTensors::deserialize(&data)?;
    let mut state = StateDict::new();
    for (name, view) in tensors.tensors() {
        let bytes = view.data();
        let values: Vec<f32> = match view.dtype() {
            Dtype::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            Dtype::F64 => bytes
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32)
                .collect(),
            // torchvision's BatchNorm `num_batches_tracked` is int64.
            Dtype::I64 => bytes
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32)
                .collect(),
            other => anyhow::bail!(
                "{}: tensor '{name}' is {other:?}; convert the file to float32 (F32, F64 and I64 are read)",
                path.display()
            ),
        };
        state.insert(
            name.to_string(),
            HostTensor {
                shape: view.shape().to_vec(),
                data: values,
            },
        );
    }
    let training = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get("training_state"))
        .map(|s| serde_json::from_str(s))
        .transpose()?;
    let config = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get("config"))
        .cloned();
    Ok(Loaded {
        state,
        training,
        config,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_tensors_and_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.safetensors");
        let mut state = StateDict::new();
        state.insert(
            "w".into(),
            HostTensor {
                shape: vec![2, 2],
                data: vec![1.0, 2.0, 3.0, -4.5],
            },
        );
        state.insert(
            "optimizer.step".into(),
            HostTensor {
                shape: vec![1],
                data: vec![7.0],
            },
        );
        let training = TrainingState {
            epoch: 3,
            global_step: 70,
            metrics: [("val/acc1".to_string(), 0.5)].into(),
            best: Some((0.5, 2)),
            epochs_without_improvement: 1,
            batches_done: 0,
            plateau: None,
            best_checkpoint: None,
        };
        save(&path, &state, &training, "a: 1\n").unwrap();
        let back = load(&path).unwrap();
        assert_eq!(back.state, state);
        assert_eq!(back.training, Some(training));
    }
}
