//! Models written with Candle, registered under a `_target_` (`register_candle_model!`).

use super::{Result, Tensor, Value, VarBuilder};

/// What a model is built for: the data's samples and classes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelContext {
    /// Image data: channels and side (a registered dataset's samples of shape `[C, H, H]` give them too).
    pub channels: usize,
    pub image_size: usize,
    /// One sample's shape as the model receives it, less the batch dimension: `[C, H, W]` for images,
    /// a registered dataset's own shape (`[features]` for a table row).
    pub input_shape: Vec<usize>,
    /// Classes of a classification dataset; otherwise what `model.num_classes` says (outputs).
    pub num_classes: usize,
}

/// A model written with Candle (candle-nn modules over the `VarBuilder` it was built with): images in,
/// logits out. `train` is the training mode (dropout, BatchNorm statistics).
pub trait CandleModel: Send + Sync {
    fn forward_t(&self, x: &Tensor, train: bool) -> candle_core::Result<Tensor>;
}

/// Builds a Candle model from its `_target_` node's arguments (see `register_candle_model!`).
pub type CandleBuild = fn(&Value, VarBuilder<'_>, &ModelContext) -> Result<Box<dyn CandleModel>>;

/// One registered model: its `_target_` name and how each backend builds it.
pub struct ModelEntry {
    pub target: &'static str,
    pub candle: CandleBuild,
}

entry!(ModelEntry);

/// The model registered under `target`.
pub fn model(target: &str) -> Option<&'static ModelEntry> {
    super::find(target)
}

/// The `_target_` of a TorchScript module (`conf/model/torchscript.yaml`), registered in `torch` builds.
pub const TORCHSCRIPT: &str = "trainyard.TorchScript";

/// Is `target` registered for libtorch (`register_tch_model!`, TorchScript)? Never in a build without the
/// `torch` feature.
pub fn runs_on_tch(target: &str) -> bool {
    #[cfg(feature = "torch")]
    return super::tch_model(target).is_some();
    #[cfg(not(feature = "torch"))]
    return {
        let _ = target;
        false
    };
}

/// Is `target` registered for some backend (Candle, or libtorch in a `torch` build)?
pub fn is_model(target: &str) -> bool {
    model_targets().contains(&target)
}

/// Every registered model's `_target_` (Candle's and libtorch's), sorted, each once (for `--help` and
/// "did you mean").
pub fn model_targets() -> Vec<&'static str> {
    let candle = super::all::<ModelEntry>();
    #[cfg(feature = "torch")]
    return super::merged(candle, super::tch_model_targets);
    #[cfg(not(feature = "torch"))]
    return super::merged(candle, Vec::new);
}

/// Register a Candle model under a `_target_` name: `build(args, vb, ctx) -> Result<M>` where `args`
/// deserializes from the config node and `M: CandleModel`.
#[macro_export]
macro_rules! register_candle_model {
    ($target:literal, $build:path) => {
        const _: () = {
            fn __trainyard_build(
                args: &$crate::registry::Value,
                vb: $crate::registry::VarBuilder<'_>,
                ctx: &$crate::registry::ModelContext,
            ) -> $crate::registry::Result<::std::boxed::Box<dyn $crate::registry::CandleModel>>
            {
                let args = $crate::registry::typed_args(args)?;
                let model = $build(args, vb, ctx)?;
                ::std::result::Result::Ok(::std::boxed::Box::new(model))
            }
            $crate::registry::inventory::submit! {
                $crate::registry::ModelEntry { target: $target, candle: __trainyard_build }
            }
        };
    };
}
