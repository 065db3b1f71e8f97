//! A dataset a crate registered (`registry::MapDataset`), opened from its `data:` node for one split and
//! read by the loader as tensors: its samples skip decoding and transforms.

use super::{DataError, Dataset, Image, Split};
use crate::registry::{DataContext, DataSplit, MapDataset, Sample};
use crate::schema::DataConfig;
use std::sync::Arc;

pub struct Registered {
    inner: Arc<dyn MapDataset>,
    classes: usize,
    target: String,
}

impl Registered {
    pub fn open(cfg: &DataConfig, split: Split, seed: u64) -> Result<Self, DataError> {
        let spec = cfg.registered.as_ref().ok_or_else(|| {
            DataError::Unsupported(
                "data.name=registered is set by a registered dataset's _target_".into(),
            )
        })?;
        // The training split was opened when the config was checked: the same one is read here.
        let inner = match split {
            Split::Train => spec.train.0.clone(),
            Split::Val | Split::Test => {
                let entry = crate::registry::dataset(&spec.spec.target).ok_or_else(|| {
                    DataError::Unsupported(format!(
                        "data: _target_ {} is not registered",
                        spec.spec.target
                    ))
                })?;
                let ctx = DataContext {
                    split: match split {
                        Split::Test => DataSplit::Test,
                        _ => DataSplit::Val,
                    },
                    seed,
                };
                let built = (entry.build)(&spec.spec.args, &ctx)
                    .map_err(|e| DataError::Unsupported(spec.spec.refused(&e)))?;
                Arc::from(built)
            }
        };
        Ok(Registered {
            inner,
            classes: cfg.num_classes,
            target: spec.spec.target.clone(),
        })
    }
}

impl Dataset for Registered {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn get(&self, _: usize) -> Result<Image, DataError> {
        Err(DataError::Unsupported(format!(
            "data: _target_ {} yields tensors, not images",
            self.target
        )))
    }

    fn num_classes(&self) -> usize {
        self.classes
    }

    fn yields_tensors(&self) -> bool {
        true
    }

    fn tensor(&self, index: usize) -> Result<Sample, DataError> {
        let sample = self.inner.get(index).map_err(|e| {
            DataError::Unsupported(format!(
                "data: _target_ {}: sample {index}: {e:#}",
                self.target
            ))
        })?;
        let numel: usize = sample.shape.iter().product();
        if numel != sample.input.len() {
            return Err(DataError::Unsupported(format!(
                "data: _target_ {}: sample {index} has {} input values but its shape {:?} holds {numel}",
                self.target,
                sample.input.len(),
                sample.shape
            )));
        }
        Ok(sample)
    }
}
