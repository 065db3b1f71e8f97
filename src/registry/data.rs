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

/// Opens a registered dataset from its `_target_` node's arguments (see `register_dataset!`).
pub type DatasetBuild = fn(&Value, &DataContext) -> Result<Box<dyn MapDataset>>;

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
        const _: () = {
            fn __trainyard_build(
                args: &$crate::registry::Value,
                ctx: &$crate::registry::DataContext,
            ) -> $crate::registry::Result<::std::boxed::Box<dyn $crate::registry::MapDataset>> {
                let args = $crate::registry::typed_args(args)?;
                let data = $build(args, ctx)?;
                ::std::result::Result::Ok(::std::boxed::Box::new(data))
            }
            $crate::registry::inventory::submit! {
                $crate::registry::DatasetEntry { target: $target, build: __trainyard_build }
            }
        };
    };
}
