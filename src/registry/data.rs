//! Datasets written in Rust, registered under a `_target_` (`register_dataset!`): map-style, as PyTorch's
//! `Dataset` (a length and an item by index, callable from several loader threads at once). An item is a
//! float tensor and its target: a class (classification, as the built-in datasets) or values of any shape
//! (regression, a segmentation mask), which a loss (`loss:`) compares with the model's output.

use super::{Result, Value};

/// Which split a dataset is opened for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataSplit {
    Train,
    Val,
    /// What `test: true` measures after training (a data set without test data may give its
    /// validation data).
    Test,
}

/// What a dataset's constructor is told besides its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataContext {
    pub split: DataSplit,
    /// The run's seed (for generated data: the same on every rank).
    pub seed: u64,
}

/// One sample: its input (row-major, `shape`) and its target.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub input: Vec<f32>,
    pub shape: Vec<usize>,
    pub target: Target,
}

/// A sample's target.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// A class index: the built-in cross-entropy, top-1/top-5, any loss that takes class indices.
    Class(u32),
    /// Values of a fixed shape (a regression's numbers, a mask), for a loss that reads floats.
    Values { values: Vec<f32>, shape: Vec<usize> },
}

/// A random-access dataset a crate registered. `get` must be callable from several threads at once;
/// every sample has the same input shape and the same kind of target.
pub trait MapDataset: Send + Sync {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn get(&self, index: usize) -> Result<Sample>;
    /// Classes, when its targets are `Target::Class`.
    fn num_classes(&self) -> Option<usize> {
        None
    }
}

/// One shard of a `ShardedDataset`: its name (for errors: a file, an object key, a partition) and how
/// many samples it holds (so every rank's share of an epoch is known before reading).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub name: String,
    pub len: usize,
}

/// Samples read in order from one shard.
pub type Samples<'a> = Box<dyn Iterator<Item = Result<Sample>> + Send + 'a>;

/// A dataset read as a stream of shards, as PyTorch's `IterableDataset` over WebDataset tars or a
/// database's partitions: nothing is read by index. trainyard gives each rank whole shards (a new split
/// each epoch), reads each shard front to back on a reader thread ahead of the step, and mixes them in a
/// seeded shuffle buffer (`data.shuffle_buffer`); a resumed run opens each shard where it left off.
pub trait ShardedDataset: Send + Sync {
    /// The shards, in a fixed order (the same on every rank).
    fn shards(&self) -> Vec<Shard>;
    /// Shard `shard`'s samples from its `start`-th on (skip the first `start` as cheaply as the format
    /// allows: a seek, or reading past them). It must yield the `len` its `Shard` says.
    fn open(&self, shard: usize, start: usize) -> Result<Samples<'_>>;
    /// Classes, when its targets are `Target::Class`.
    fn num_classes(&self) -> Option<usize> {
        None
    }
}

/// What a registered dataset's constructor built: read by index, or as a stream of shards.
#[derive(Clone)]
pub enum UserDataset {
    Map(std::sync::Arc<dyn MapDataset>),
    Sharded(std::sync::Arc<dyn ShardedDataset>),
}

impl UserDataset {
    /// Samples in one epoch of the split.
    pub fn len(&self) -> usize {
        match self {
            UserDataset::Map(d) => d.len(),
            UserDataset::Sharded(d) => d.shards().iter().map(|s| s.len).sum(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn num_classes(&self) -> Option<usize> {
        match self {
            UserDataset::Map(d) => d.num_classes(),
            UserDataset::Sharded(d) => d.num_classes(),
        }
    }

    /// The first sample (of the first shard that has one), for its shapes.
    pub fn first(&self) -> Result<Sample> {
        match self {
            UserDataset::Map(d) => d.get(0),
            UserDataset::Sharded(d) => {
                let shards = d.shards();
                let (i, shard) = shards
                    .iter()
                    .enumerate()
                    .find(|(_, s)| s.len > 0)
                    .ok_or_else(|| anyhow::anyhow!("no shard holds a sample"))?;
                d.open(i, 0)?.next().unwrap_or_else(|| {
                    Err(anyhow::anyhow!(
                        "shard '{}' says it holds {} samples but yields none",
                        shard.name,
                        shard.len
                    ))
                })
            }
        }
    }
}

/// Opens a registered dataset from its `_target_` node's arguments (see `register_dataset!` and
/// `register_sharded_dataset!`).
pub type DatasetBuild = fn(&Value, &DataContext) -> Result<UserDataset>;

/// One registered dataset: its `_target_` name and constructor.
pub struct DatasetEntry {
    pub target: &'static str,
    pub build: DatasetBuild,
}

entry!(DatasetEntry);

/// The dataset registered under `target`.
pub fn dataset(target: &str) -> Option<&'static DatasetEntry> {
    super::find(target)
}

/// Every registered dataset's `_target_`, sorted.
pub fn dataset_targets() -> Vec<&'static str> {
    super::sorted(super::all::<DatasetEntry>())
}

/// Register a dataset under a `_target_` name: `build(args, ctx) -> Result<D>` where `args` deserializes
/// from the `data:` node (less trainyard's loader keys: `batch_size`, `num_workers`, ...) and
/// `D: MapDataset`.
#[macro_export]
macro_rules! register_dataset {
    ($target:literal, $build:path) => {
        $crate::__register_dataset!(Map, $target, $build);
    };
}

/// Register a dataset read as a stream of shards under a `_target_` name: `build(args, ctx) ->
/// Result<D>` where `D: ShardedDataset` (see `register_dataset!` for `args`).
#[macro_export]
macro_rules! register_sharded_dataset {
    ($target:literal, $build:path) => {
        $crate::__register_dataset!(Sharded, $target, $build);
    };
}

/// The two dataset registrations' shared body: `$kind` is the `UserDataset` variant the built dataset
/// is wrapped in.
#[doc(hidden)]
#[macro_export]
macro_rules! __register_dataset {
    ($kind:ident, $target:literal, $build:path) => {
        const _: () = {
            fn __trainyard_build(
                args: &$crate::registry::Value,
                ctx: &$crate::registry::DataContext,
            ) -> $crate::registry::Result<$crate::registry::UserDataset> {
                let args = $crate::registry::typed_args(args)?;
                let data = $build(args, ctx)?;
                ::std::result::Result::Ok($crate::registry::UserDataset::$kind(
                    ::std::sync::Arc::new(data),
                ))
            }
            $crate::registry::inventory::submit! {
                $crate::registry::DatasetEntry { target: $target, build: __trainyard_build }
            }
        };
    };
}
