//! Names → constructors for what a user's crate plugs into trainyard, registered where each is defined
//! (`inventory`), so nothing in trainyard lists them: a model written in Rust is its file plus one
//! `register_candle_model!` line, and `model: {_target_: my_project.models.Net, ...}` builds it, the node's
//! other keys deserialized (serde) into the type its constructor takes, as Hydra's `instantiate` passes
//! them as keyword arguments.
//!
//! ```ignore
//! #[derive(serde::Deserialize)]
//! #[serde(deny_unknown_fields)]
//! struct NetArgs { hidden: usize }
//!
//! struct Net { fc1: candle_nn::Linear, fc2: candle_nn::Linear }
//!
//! impl trainyard::registry::CandleModel for Net {
//!     fn forward_t(&self, x: &Tensor, _train: bool) -> candle_core::Result<Tensor> {
//!         self.fc2.forward(&self.fc1.forward(&x.flatten_from(1)?)?.relu()?)
//!     }
//! }
//!
//! fn net(args: NetArgs, vb: VarBuilder, ctx: &ModelContext) -> anyhow::Result<Net> { ... }
//!
//! trainyard::register_candle_model!("my_project.models.Net", net);
//! fn main() -> std::process::ExitCode { trainyard::app::main_entry(std::env::args_os()) }
//! ```

pub use anyhow::Result;
pub use candle_core::Tensor;
pub use candle_nn::VarBuilder;
pub use inventory;
pub use serde_json::Value;

/// What a model is built for: the data's images and classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelContext {
    pub channels: usize,
    pub image_size: usize,
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

inventory::collect!(ModelEntry);

/// The model registered under `target`.
pub fn model(target: &str) -> Option<&'static ModelEntry> {
    inventory::iter::<ModelEntry>
        .into_iter()
        .find(|e| e.target == target)
}

/// Every registered model's `_target_`, sorted (for `--help` and "did you mean").
pub fn model_targets() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = inventory::iter::<ModelEntry>
        .into_iter()
        .map(|e| e.target)
        .collect();
    names.sort_unstable();
    names
}

/// A `_target_` node's arguments as the type its constructor takes (serde; unknown keys and wrong types
/// are errors when the type says `deny_unknown_fields`, as a Python constructor refuses them).
pub fn typed_args<A: serde::de::DeserializeOwned>(args: &Value) -> Result<A> {
    serde_path_to_error::deserialize(args.clone()).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match path.as_str() {
            "." | "?" => anyhow::anyhow!("{inner}"),
            field => anyhow::anyhow!("field `{field}`: {inner}"),
        }
    })
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
