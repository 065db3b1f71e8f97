//! A model a crate registered (`registry`), described like the zoo's: its parameters (names, shapes and
//! starting rules) are learned by building it once over a recording `VarBuilder`, which notes every
//! variable the constructor asks for; the engines then create those variables from the seed (the same on
//! every rank and backend, as for the zoo) and build the model again over them for each forward pass.

use super::spec::{Init, ParamSpec};
use crate::registry::{ModelContext, ModelEntry};
use crate::schema::RegisteredSpec;
use candle_core::{DType, Device, Shape, Tensor};
use std::sync::Mutex;

/// A registered model sized for the data.
pub struct Registered {
    pub target: String,
    /// Its Candle constructor, when it has one (`register_candle_model!`).
    pub candle: Option<&'static ModelEntry>,
    pub args: serde_json::Value,
    pub ctx: ModelContext,
    specs: Vec<ParamSpec>,
    /// Buffers of a libtorch model (name, shape): its own, saved with it.
    buffers: Vec<(String, Vec<usize>)>,
}

impl Registered {
    pub fn new(spec: &RegisteredSpec, ctx: ModelContext) -> anyhow::Result<Self> {
        let Some(entry) = crate::registry::model(&spec.target) else {
            return Self::libtorch_only(spec, ctx);
        };
        let recorder = Recorder::default();
        let vb = candle_nn::VarBuilder::from_backend(
            Box::new(RecordingBackend(&recorder)),
            DType::F32,
            Device::Cpu,
        );
        (entry.candle)(&spec.args, vb, &ctx).map_err(|e| anyhow::anyhow!(spec.refused(&e)))?;
        let specs = recorder.0.into_inner().unwrap_or_else(|p| p.into_inner());
        anyhow::ensure!(
            !specs.is_empty(),
            "model: _target_ {} created no variables on its VarBuilder: nothing to train{}",
            spec.target,
            spec.origin
        );
        Ok(Registered {
            target: spec.target.clone(),
            candle: Some(entry),
            args: spec.args.clone(),
            ctx,
            specs,
            buffers: Vec::new(),
        })
    }

    /// A model registered for libtorch only: built once on the CPU to learn its tensors' names and shapes
    /// (its constructor's refusals surface here, before any engine starts). Its values are its own: the
    /// tch engine trains the tensors the model holds.
    #[cfg(feature = "torch")]
    fn libtorch_only(spec: &RegisteredSpec, ctx: ModelContext) -> anyhow::Result<Self> {
        let entry = crate::registry::tch_model(&spec.target).ok_or_else(|| {
            anyhow::anyhow!(
                "model: _target_ {} is not registered{}",
                spec.target,
                spec.origin
            )
        })?;
        let model = (entry.build)(&spec.args, tch::Device::Cpu, &ctx)
            .map_err(|e| anyhow::anyhow!(spec.refused(&e)))?;
        let shape = |t: &tch::Tensor| t.size().iter().map(|&d| d as usize).collect::<Vec<_>>();
        let specs: Vec<ParamSpec> = model
            .parameters()?
            .iter()
            .map(|(name, t)| ParamSpec {
                name: name.clone(),
                shape: shape(t),
                fan_in: 1,
                init: Init::Constant(0.0),
            })
            .collect();
        anyhow::ensure!(
            !specs.is_empty(),
            "model: _target_ {} has no trainable tensors: nothing to train{}",
            spec.target,
            spec.origin
        );
        let buffers = model
            .buffers()?
            .iter()
            .map(|(name, t)| (name.clone(), shape(t)))
            .collect();
        Ok(Registered {
            target: spec.target.clone(),
            candle: None,
            args: spec.args.clone(),
            ctx,
            specs,
            buffers,
        })
    }

    #[cfg(not(feature = "torch"))]
    fn libtorch_only(spec: &RegisteredSpec, _: ModelContext) -> anyhow::Result<Self> {
        anyhow::bail!(
            "model: _target_ {} is not registered{}",
            spec.target,
            spec.origin
        )
    }

    /// Its Candle constructor, or why Candle cannot build it.
    pub fn candle_entry(&self) -> anyhow::Result<&'static ModelEntry> {
        self.candle.ok_or_else(|| {
            anyhow::anyhow!(
                "model _target_ {} is registered for libtorch only (register_tch_model!, or a TorchScript \
                 module): use backend=tch",
                self.target
            )
        })
    }

    /// A libtorch model's buffers (name, shape); a Candle model keeps none of its own.
    pub fn buffer_shapes(&self) -> Vec<(String, Vec<usize>)> {
        self.buffers.clone()
    }

    /// Its variables in the order its constructor created them.
    pub fn specs(&self) -> Vec<ParamSpec> {
        self.specs.clone()
    }

    /// One stage: the model is one FSDP unit (trainyard cannot see inside its forward pass).
    pub fn stages(&self) -> Vec<Vec<String>> {
        let mut roots: Vec<String> = Vec::new();
        for s in &self.specs {
            let root = s.name.split('.').next().unwrap_or(&s.name).to_string();
            if !roots.contains(&root) {
                roots.push(root);
            }
        }
        vec![roots]
    }

    /// The module of its last variable: the classifier head, when it ends with one.
    pub fn head(&self) -> Vec<String> {
        self.specs
            .last()
            .and_then(|s| s.name.rsplit_once('.'))
            .map(|(module, _)| vec![module.to_string()])
            .unwrap_or_default()
    }
}

/// The variables a constructor asked for.
#[derive(Default)]
struct Recorder(Mutex<Vec<ParamSpec>>);

struct RecordingBackend<'a>(&'a Recorder);

impl candle_nn::var_builder::SimpleBackend for RecordingBackend<'_> {
    fn get(
        &self,
        s: Shape,
        name: &str,
        h: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let shape = s.dims().to_vec();
        let mut specs = self.0 .0.lock().unwrap_or_else(|p| p.into_inner());
        if specs.iter().any(|p| p.name == name) {
            candle_core::bail!(
                "the model asks for variable '{name}' twice: give each layer its own vb.pp(...)"
            );
        }
        let fan_in = candle_nn::init::FanInOut::FanIn.for_shape(&s);
        specs.push(ParamSpec {
            name: name.to_string(),
            shape,
            fan_in,
            init: init_of(h, &s),
        });
        Tensor::zeros(s, dtype, dev)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        candle_core::bail!(
            "the model asks for '{name}' without a shape: a registered model creates its variables with a \
             shape and an initialisation (candle_nn::linear, conv2d, vb.get_with_hints)"
        )
    }

    fn contains_tensor(&self, _: &str) -> bool {
        false
    }
}

/// candle-nn's initialisation rule as ours, drawn from the seed on the host.
fn init_of(h: candle_nn::Init, s: &Shape) -> Init {
    use candle_nn::init::NormalOrUniform;
    match h {
        candle_nn::Init::Const(v) => Init::Constant(v as f32),
        candle_nn::Init::Randn { mean, stdev } => Init::NormalMean(mean, stdev),
        candle_nn::Init::Uniform { lo, up } => Init::Uniform(lo, up),
        candle_nn::Init::Kaiming {
            dist,
            fan,
            non_linearity,
        } => {
            let std = non_linearity.gain() / (fan.for_shape(s).max(1) as f64).sqrt();
            match dist {
                NormalOrUniform::Normal => Init::Normal(std),
                NormalOrUniform::Uniform => {
                    let bound = 3f64.sqrt() * std;
                    Init::Uniform(-bound, bound)
                }
            }
        }
    }
}
