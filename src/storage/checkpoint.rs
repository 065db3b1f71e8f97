//! Checkpoints are safetensors files: weights under their model names, optimizer state under
//! `optimizer.*`, and the training state (epoch, step, metrics, config) as JSON in the metadata.
//! Written to a temporary file and renamed, so a crash never leaves a torn checkpoint; the metadata
//! carries a CRC-32C of the tensors (`tensors_crc32c`), so a file damaged afterwards (a bad disk, a copy
//! cut short) is refused on load instead of resuming from wrong weights.

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
    /// Validation checks without improvement of EarlyStopping's monitor (its patience counts these).
    pub epochs_without_improvement: u64,
    /// EarlyStopping's best value of its own monitor (which may differ from ModelCheckpoint's).
    #[serde(default)]
    pub stop_best: Option<f64>,
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
    /// Taken mid-epoch: the epoch's and the logging window's sums so far over every rank, so the resumed
    /// run's epoch means and next step row are the uninterrupted run's.
    #[serde(default)]
    pub running: Option<RunningSums>,
}

/// Training statistics summed since the epoch and since the last logged step (`TrainingState::running`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunningSums {
    pub epoch: StatSums,
    pub window: StatSums,
}

/// A step's statistics summed over samples (the trainer's `StepStats`, as the checkpoint stores them).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StatSums {
    pub loss_sum: f64,
    pub correct1: u64,
    pub correct5: u64,
    pub count: u64,
    pub metric_sums: Vec<f64>,
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
    let checksum = tensors_checksum(
        bytes
            .iter()
            .map(|(k, b, s)| (k.as_str(), s.as_slice(), b.as_slice())),
    );
    metadata.insert(CHECKSUM_KEY.to_string(), format!("{checksum:08x}"));
    let data = safetensors::serialize(views, Some(metadata))?;
    crate::storage::records::write_atomic(path, &data)
        .with_context(|| format!("writing checkpoint {}", path.display()))
}

/// The metadata key of the tensors' checksum.
const CHECKSUM_KEY: &str = "tensors_crc32c";

/// CRC-32C over every tensor in name order: its name, shape and bytes (independent of the file's layout).
fn tensors_checksum<'a>(tensors: impl Iterator<Item = (&'a str, &'a [usize], &'a [u8])>) -> u32 {
    let mut sorted: Vec<_> = tensors.collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut crc = 0u32;
    for (name, shape, bytes) in sorted {
        crc = crc32c::crc32c_append(crc, name.as_bytes());
        for dim in shape {
            crc = crc32c::crc32c_append(crc, &(*dim as u64).to_le_bytes());
        }
        crc = crc32c::crc32c_append(crc, bytes);
    }
    crc
}

/// A checkpoint that cannot be trusted: cut short, not a checkpoint, or its tensors changed since it was
/// written. Callers that have an older checkpoint fall back to it.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {why}")]
pub struct Damaged {
    pub path: String,
    pub why: String,
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
    let damaged = |why: String| Damaged {
        path: path.display().to_string(),
        why,
    };
    let (_, meta) = safetensors::SafeTensors::read_metadata(&data).map_err(|e| {
        damaged(format!(
            "not a complete safetensors file ({e}): cut short while written or copied?"
        ))
    })?;
    let tensors = safetensors::SafeTensors::deserialize(&data)
        .map_err(|e| damaged(format!("not a complete safetensors file ({e})")))?;
    if let Some(recorded) = meta.metadata().as_ref().and_then(|m| m.get(CHECKSUM_KEY)) {
        let views = tensors.tensors();
        let actual = tensors_checksum(views.iter().map(|(k, v)| (k.as_str(), v.shape(), v.data())));
        if format!("{actual:08x}") != *recorded {
            return Err(damaged(format!(
                "its tensors' checksum is {actual:08x}, the file records {recorded}: the file was damaged \
                 after it was written"
            ))
            .into());
        }
    }
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

/// The training state of a checkpoint, read from its header alone (a launcher reporting where a restart
/// resumes, without reading the tensors).
pub fn read_training_state(path: &Path) -> anyhow::Result<Option<TrainingState>> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)
        .with_context(|| format!("reading checkpoint {}", path.display()))?;
    let mut size = [0u8; 8];
    file.read_exact(&mut size)?;
    let size = u64::from_le_bytes(size);
    anyhow::ensure!(
        size < 100 << 20,
        "{}: not a safetensors header",
        path.display()
    );
    let mut header = vec![0u8; size as usize];
    file.read_exact(&mut header)?;
    let header: serde_json::Value = serde_json::from_slice(&header)
        .with_context(|| format!("{}: not a safetensors header", path.display()))?;
    header["__metadata__"]["training_state"]
        .as_str()
        .map(serde_json::from_str)
        .transpose()
        .with_context(|| format!("{}: its training state", path.display()))
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
            stop_best: None,
            batches_done: 0,
            plateau: None,
            best_checkpoint: None,
            running: None,
        };
        save(&path, &state, &training, "a: 1\n").unwrap();
        let back = load(&path).unwrap();
        assert_eq!(back.state, state);
        assert_eq!(
            read_training_state(&path).unwrap().as_ref(),
            Some(&training)
        );
        assert_eq!(back.training, Some(training));
    }

    /// A byte changed in a tensor, or the file cut short: refused as damaged, naming the file.
    #[test]
    fn a_damaged_or_truncated_checkpoint_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.safetensors");
        let state: StateDict = [(
            "w".to_string(),
            HostTensor {
                shape: vec![4],
                data: vec![1.0, 2.0, 3.0, 4.0],
            },
        )]
        .into_iter()
        .collect();
        let training = TrainingState {
            epoch: 0,
            global_step: 1,
            metrics: HashMap::new(),
            best: None,
            epochs_without_improvement: 0,
            stop_best: None,
            batches_done: 0,
            plateau: None,
            best_checkpoint: None,
            running: None,
        };
        save(&path, &state, &training, "a: 1\n").unwrap();
        let good = std::fs::read(&path).unwrap();
        let mut flipped = good.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0x40;
        std::fs::write(&path, &flipped).unwrap();
        let err = load(&path).err().unwrap();
        let damaged = err.downcast_ref::<Damaged>().expect("a Damaged error");
        assert!(damaged.why.contains("checksum"), "{err}");
        std::fs::write(&path, &good[..good.len() - 3]).unwrap();
        let err = load(&path).err().unwrap();
        assert!(err.downcast_ref::<Damaged>().is_some(), "{err}");
        assert!(err.to_string().contains("c.safetensors"), "{err}");
        std::fs::write(&path, &good).unwrap();
        assert_eq!(load(&path).unwrap().state, state);
    }
}
