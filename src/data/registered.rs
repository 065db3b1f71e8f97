//! A dataset a crate registered (`registry::MapDataset` or `registry::ShardedDataset`), opened from its
//! `data:` node for one split and read by the loader as tensors: its samples skip decoding and transforms.

use super::{DataError, Dataset, Image, SampleIter, Split, Streamed};
use crate::registry::{DataContext, DataSplit, Sample, Shard, UserDataset};
use crate::schema::DataConfig;

pub struct Registered {
    inner: UserDataset,
    classes: usize,
    target: String,
    /// A sharded dataset's shards (names and lengths) and each one's first sample's index.
    shards: Vec<Shard>,
    starts: Vec<usize>,
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
                (entry.build)(&spec.spec.args, &ctx)
                    .map_err(|e| DataError::Unsupported(spec.spec.refused(&e)))?
            }
        };
        let shards = match &inner {
            UserDataset::Map(_) => Vec::new(),
            UserDataset::Sharded(d) => d.shards(),
        };
        let starts = shards
            .iter()
            .scan(0, |next, s| {
                let start = *next;
                *next += s.len;
                Some(start)
            })
            .collect();
        Ok(Registered {
            inner,
            classes: cfg.num_classes,
            target: spec.spec.target.clone(),
            shards,
            starts,
        })
    }

    /// The dataset's error while reading `what`.
    fn failed(&self, e: anyhow::Error, what: &str) -> DataError {
        DataError::Unsupported(format!("data: _target_ {}: {what}: {e:#}", self.target))
    }

    /// A sample's shapes checked against its values, its error named by the dataset and `what`.
    fn checked(&self, sample: anyhow::Result<Sample>, what: &str) -> Result<Sample, DataError> {
        let sample = sample.map_err(|e| self.failed(e, what))?;
        let numel: usize = sample.shape.iter().product();
        if numel != sample.input.len() {
            return Err(DataError::Unsupported(format!(
                "data: _target_ {}: {what} has {} input values but its shape {:?} holds {numel}",
                self.target,
                sample.input.len(),
                sample.shape
            )));
        }
        Ok(sample)
    }

    /// The shard sample `index` falls in, and its place there.
    fn locate(&self, index: usize) -> (usize, usize) {
        let shard = self.starts.partition_point(|&s| s <= index) - 1;
        (shard, index - self.starts[shard])
    }
}

impl Dataset for Registered {
    fn len(&self) -> usize {
        match &self.inner {
            UserDataset::Map(d) => d.len(),
            // The shard list read once at open, which `shard_lens` and `locate` use too.
            UserDataset::Sharded(_) => self.shards.iter().map(|s| s.len).sum(),
        }
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

    /// By index; for a sharded dataset this opens the shard at the sample (the loader streams instead).
    fn tensor(&self, index: usize) -> Result<Sample, DataError> {
        match &self.inner {
            UserDataset::Map(d) => self.checked(d.get(index), &format!("sample {index}")),
            UserDataset::Sharded(_) => {
                let (shard, at) = self.locate(index);
                let mut samples = self.open_shard(shard, at)?;
                samples
                    .next()
                    .unwrap_or_else(|| {
                        Err(DataError::Unsupported(format!(
                            "data: _target_ {}: shard '{}' ended before its sample {at}",
                            self.target, self.shards[shard].name
                        )))
                    })?
                    .into_tensor()
            }
        }
    }

    fn shard_lens(&self) -> Option<Vec<usize>> {
        match self.inner {
            UserDataset::Map(_) => None,
            UserDataset::Sharded(_) => Some(self.shards.iter().map(|s| s.len).collect()),
        }
    }

    /// The shard's samples, each checked and its error naming the shard and the sample's place; a
    /// shard that ends before the length it declared is an error, not a short epoch.
    fn open_shard(&self, shard: usize, start: usize) -> Result<SampleIter<'_>, DataError> {
        let UserDataset::Sharded(d) = &self.inner else {
            return Err(DataError::Unsupported(format!(
                "data: _target_ {} is read by index, not as shards",
                self.target
            )));
        };
        let info = &self.shards[shard];
        let mut samples = d.open(shard, start).map_err(|e| {
            self.failed(
                e,
                &format!("opening shard '{}' at sample {start}", info.name),
            )
        })?;
        let mut at = start;
        Ok(Box::new(std::iter::from_fn(move || {
            if at >= info.len {
                return None;
            }
            let what = format!("shard '{}' sample {at}", info.name);
            at += 1;
            Some(match samples.next() {
                Some(sample) => self.checked(sample, &what).map(Streamed::Tensor),
                None => Err(DataError::Unsupported(format!(
                    "data: _target_ {}: shard '{}' ended after {} samples, but its Shard says len {}",
                    self.target,
                    info.name,
                    at - 1,
                    info.len
                ))),
            })
        })))
    }
}
