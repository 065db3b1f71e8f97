//! Models that run on libtorch (`backend=tch`, cargo feature `torch`), registered under a `_target_`:
//! a crate's tch model (`register_tch_model!`: `nn::ModuleT` layers on a `VarStore` path, as tch users
//! write them) and trainyard's own TorchScript loader (a module exported from PyTorch). Such a model holds
//! its own tensors; the engine trains them in place (the optimizer's step, gradients, DDP's reducer and
//! checkpoints all reach the same tensors the model computes with).

use super::{ModelContext, Result, Value};
use tch::Tensor;

/// What one forward pass gives: the logits (or whatever the loss reads), and the model's own loss when
/// it computes one from the targets it was given.
pub struct TchOutput {
    pub logits: Tensor,
    pub loss: Option<Tensor>,
}

/// A model on libtorch that owns its tensors.
pub trait TchModel: Send {
    /// One forward pass in training (`train`: dropout on, BatchNorm batch statistics) or evaluation mode.
    /// `targets` is given when `wants_targets` says the model computes its own loss.
    fn forward(
        &mut self,
        inputs: &Tensor,
        targets: Option<&Tensor>,
        train: bool,
    ) -> Result<TchOutput>;
    /// Trainable tensors under their `state_dict()` names, in the order the model defines them.
    fn parameters(&self) -> Result<Vec<(String, Tensor)>>;
    /// Tensors that are saved but not trained (BatchNorm running statistics), by `state_dict()` name.
    fn buffers(&self) -> Result<Vec<(String, Tensor)>>;
    /// Does `forward` need the batch's targets (it returns its own loss)?
    fn wants_targets(&self) -> bool {
        false
    }
}

/// Builds a libtorch model from its `_target_` node's arguments, on `device`.
pub type TchBuild = fn(&Value, tch::Device, &ModelContext) -> Result<Box<dyn TchModel>>;

/// One model registered for libtorch.
pub struct TchModelEntry {
    pub target: &'static str,
    pub build: TchBuild,
}

entry!(TchModelEntry);

/// The libtorch model registered under `target`.
pub fn tch_model(target: &str) -> Option<&'static TchModelEntry> {
    super::find(target)
}

/// The `_target_`s registered for libtorch.
pub(super) fn tch_model_targets() -> Vec<&'static str> {
    super::all::<TchModelEntry>()
}

/// A tch `nn::ModuleT` over the `VarStore` its constructor was given.
pub struct VarStoreModel<M> {
    pub store: tch::nn::VarStore,
    pub module: M,
}

impl<M: tch::nn::ModuleT> TchModel for VarStoreModel<M> {
    fn forward(&mut self, inputs: &Tensor, _: Option<&Tensor>, train: bool) -> Result<TchOutput> {
        Ok(TchOutput {
            logits: self.module.forward_t(inputs, train),
            loss: None,
        })
    }

    /// The store's trainable variables in creation order (`nn::linear` then the next layer...), named.
    fn parameters(&self) -> Result<Vec<(String, Tensor)>> {
        let vars = self
            .store
            .variables_
            .lock()
            .map_err(|_| anyhow::anyhow!("the VarStore's lock was poisoned"))?;
        let name_of = |t: &Tensor| {
            vars.named_variables
                .iter()
                .find(|(_, v)| v.data_ptr() == t.data_ptr())
                .map(|(name, _)| name.clone())
        };
        vars.trainable_variables
            .iter()
            .map(|var| {
                let name = name_of(&var.tensor).ok_or_else(|| {
                    anyhow::anyhow!(
                        "a trainable variable of the VarStore has no name (or no elements)"
                    )
                })?;
                Ok((name, var.tensor.shallow_clone()))
            })
            .collect()
    }

    /// Variables that do not require gradients (`vs.zeros_no_train`, as tch's BatchNorm keeps its running
    /// statistics), sorted by name.
    fn buffers(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out: Vec<(String, Tensor)> = self
            .store
            .variables()
            .into_iter()
            .filter(|(_, t)| !t.requires_grad())
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

/// Register a tch model under a `_target_` name: `build(args, &nn::Path, ctx) -> Result<M>` where `args`
/// deserializes from the config node and `M: tch::nn::ModuleT`. Its variables start from libtorch's
/// initialisation seeded with the run's `seed` (on the CPU, then moved: the same on every rank).
/// A model registered for both backends uses the same `_target_` with `register_candle_model!`.
#[macro_export]
macro_rules! register_tch_model {
    ($target:literal, $build:path) => {
        const _: () = {
            fn __trainyard_build_tch(
                args: &$crate::registry::Value,
                device: $crate::registry::tch::Device,
                ctx: &$crate::registry::ModelContext,
            ) -> $crate::registry::Result<::std::boxed::Box<dyn $crate::registry::TchModel>> {
                let args = $crate::registry::typed_args(args)?;
                let mut store =
                    $crate::registry::tch::nn::VarStore::new($crate::registry::tch::Device::Cpu);
                let module = $build(args, &store.root(), ctx)?;
                store.set_device(device);
                ::std::result::Result::Ok(::std::boxed::Box::new($crate::registry::VarStoreModel {
                    store,
                    module,
                }))
            }
            $crate::registry::inventory::submit! {
                $crate::registry::TchModelEntry { target: $target, build: __trainyard_build_tch }
            }
        };
    };
}
