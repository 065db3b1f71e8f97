//! Names → constructors for what a user's crate plugs into trainyard, registered where each is defined
//! (`inventory`), so nothing in trainyard lists them: a model, a dataset or a loss written in Rust is its
//! file plus one `register_*!` line, and `model: {_target_: my_project.models.Net, ...}` builds it, the
//! node's other keys deserialized (serde) into the type its constructor takes, as Hydra's `instantiate`
//! passes them as keyword arguments. trainyard's own losses register the same way (`losses`).
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
//! trainyard::main!();
//! ```

/// `inventory` collects `$entry` (a struct with a `target` field) and `find`/`all` read it.
macro_rules! entry {
    ($entry:ty) => {
        inventory::collect!($entry);
        impl super::Entry for $entry {
            fn target(&self) -> &'static str {
                self.target
            }
        }
    };
}

mod callback;
mod data;
mod logger;
mod loss;
pub mod losses;
mod metric;
mod model;
mod optimizer;
mod schedule;
#[cfg(feature = "torch")]
mod tch_loss;
#[cfg(feature = "torch")]
mod tch_losses;
#[cfg(feature = "torch")]
mod tch_model;
mod zoo;

pub use anyhow::Result;
pub use callback::*;
pub use candle_core::Tensor;
pub use candle_nn::VarBuilder;
pub use data::*;
pub use inventory;
pub use logger::*;
pub use loss::*;
pub use metric::*;
pub use model::*;
pub use optimizer::*;
pub use schedule::*;
pub use serde_json::Value;
#[cfg(feature = "torch")]
pub use tch;
#[cfg(feature = "torch")]
pub use tch_loss::*;
#[cfg(feature = "torch")]
pub use tch_model::*;
pub use zoo::*;

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

/// Deserialize `args` as the type `_build` takes first (for checking a registered logger's or callback's
/// arguments before the run starts, without building it).
pub fn checked_args<A: serde::de::DeserializeOwned, X, R>(
    args: &Value,
    _build: impl FnOnce(A, X) -> R,
) -> Result<()> {
    typed_args::<A>(args).map(|_| ())
}

/// One kind of registered thing (a model, a dataset, a loss...), found by its `_target_`.
trait Entry: inventory::Collect {
    fn target(&self) -> &'static str;
}

/// The entry of kind `E` registered under `target`.
fn find<E: Entry>(target: &str) -> Option<&'static E> {
    inventory::iter::<E>
        .into_iter()
        .find(|e| e.target() == target)
}

/// Every `_target_` of kind `E`, in registration order.
fn all<E: Entry>() -> Vec<&'static str> {
    inventory::iter::<E>
        .into_iter()
        .map(Entry::target)
        .collect()
}

/// Registered names in sorted order (for `--help` and "did you mean").
fn sorted(mut names: Vec<&'static str>) -> Vec<&'static str> {
    names.sort_unstable();
    names
}

/// Candle's and libtorch's names of one kind, sorted, each once (a `_target_` registered for both
/// backends is one name).
#[allow(unused_variables)]
fn merged(candle: Vec<&'static str>, tch: impl FnOnce() -> Vec<&'static str>) -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut names = candle;
    #[cfg(feature = "torch")]
    names.extend(tch());
    let mut names = sorted(names);
    names.dedup();
    names
}
