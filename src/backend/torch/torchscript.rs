//! A TorchScript module exported from PyTorch (`torch.jit.script(net).save("net.pt")`, or `trace`),
//! trained as it is: `model=torchscript model.path=net.pt`. libtorch loads it; its parameters and
//! buffers keep their `state_dict()` names (so checkpoints load back into the same `nn.Module`), the
//! engine trains them in place, and `train/eval` mode is switched on the module as PyTorch does. Its
//! `forward` gets the batch's inputs (and the targets, when the config names a loss output) and returns
//! the logits, or a tuple/dict the config picks the logits (and the loss) from.

use crate::registry::{ModelContext, TchModel, TchModelEntry, TchOutput};
use anyhow::Context;
use std::ffi::{c_char, c_void, CStr};
use tch::{CModule, Device, IValue, Tensor};

use crate::registry::TORCHSCRIPT;

/// Where an output is in what `forward` returns: a dict key or a tuple index.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(untagged)]
pub enum OutputKey {
    Index(usize),
    Name(String),
}

impl std::fmt::Display for OutputKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OutputKey::Index(i) => write!(f, "{i}"),
            OutputKey::Name(n) => write!(f, "'{n}'"),
        }
    }
}

/// The model node's arguments.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// The TorchScript file: a path, or `s3://bucket/key` (feature `s3`).
    pub path: String,
    /// Which output holds the logits when `forward` returns a tuple or a dict.
    #[serde(default)]
    pub logits: Option<OutputKey>,
    /// Which output holds the module's own loss: `forward(inputs, targets)` is called, and that loss is
    /// trained.
    #[serde(default)]
    pub loss: Option<OutputKey>,
}

/// A loaded TorchScript module and how to read its outputs.
pub struct TorchScript {
    module: CModule,
    path: String,
    logits: Option<OutputKey>,
    loss: Option<OutputKey>,
    /// The mode the module was last put in (switched only when it changes).
    training: Option<bool>,
}

/// Load `path` (downloaded first when it is an `s3://` URL) onto `device`.
pub fn load(path: &str, device: Device) -> anyhow::Result<CModule> {
    let local;
    let file = if crate::storage::s3::is_s3(path) {
        let url = crate::storage::s3::S3Url::parse(path)?;
        local = tempfile_for(url.file_name());
        crate::storage::s3::download(&url, &local)?;
        local.as_path()
    } else {
        std::path::Path::new(path)
    };
    anyhow::ensure!(
        file.exists(),
        "model.path={path}: no such file; export the module with torch.jit.script(net).save(\"net.pt\") \
         (or torch.jit.trace), and give its path"
    );
    let loaded = CModule::load_on_device(file, device).map_err(|e| refused(path, &e.to_string()));
    if crate::storage::s3::is_s3(path) {
        let _ = std::fs::remove_file(file);
    }
    loaded
}

/// A unique local file name for a download.
fn tempfile_for(name: &str) -> std::path::PathBuf {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    std::env::temp_dir().join(format!("trainyard-{}-{stamp}-{name}", std::process::id()))
}

/// libtorch's refusal to load `path`, said as what it means.
fn refused(path: &str, libtorch: &str) -> anyhow::Error {
    let first = libtorch.lines().next().unwrap_or(libtorch);
    if libtorch.contains("version") && libtorch.contains("support") {
        anyhow::anyhow!(
            "model.path={path}: written by a newer PyTorch than this libtorch (2.11) reads; export it again \
             with PyTorch 2.11 or older (torch.jit.save), or upgrade trainyard's libtorch\n    libtorch: {first}"
        )
    } else if libtorch.contains("zip archive") || libtorch.contains("central directory") {
        anyhow::anyhow!(
            "model.path={path} is not a TorchScript file (a zip archive torch.jit.save writes); a state_dict \
             saved with torch.save is not one: script the module first, \
             torch.jit.script(net).save(\"net.pt\")\n    libtorch: {first}"
        )
    } else {
        anyhow::anyhow!("model.path={path}: libtorch could not load it: {first}")
    }
}

fn build(
    args: &serde_json::Value,
    device: Device,
    _: &ModelContext,
) -> anyhow::Result<Box<dyn TchModel>> {
    let args: Args = crate::registry::typed_args(args)?;
    let module = load(&args.path, device)?;
    Ok(Box::new(TorchScript {
        module,
        path: args.path,
        logits: args.logits,
        loss: args.loss,
        training: None,
    }))
}

inventory::submit! {
    TchModelEntry { target: TORCHSCRIPT, build }
}

impl TorchScript {
    /// The output under `key` of what `forward` returned.
    fn pick(&self, out: &IValue, key: &OutputKey, what: &str) -> anyhow::Result<Tensor> {
        if let (IValue::TensorList(items), OutputKey::Index(i)) = (out, key) {
            if let Some(t) = items.get(*i) {
                return Ok(t.shallow_clone());
            }
        }
        let found = match (out, key) {
            (IValue::Tuple(items) | IValue::GenericList(items), OutputKey::Index(i)) => {
                items.get(*i)
            }
            (IValue::GenericDict(pairs), OutputKey::Name(name)) => pairs
                .iter()
                .find(|(k, _)| matches!(k, IValue::String(s) if s == name))
                .map(|(_, v)| v),
            _ => None,
        };
        match found {
            Some(IValue::Tensor(t)) => Ok(t.shallow_clone()),
            Some(other) => anyhow::bail!(
                "model.path={}: forward's output {key} ({what}) is {}, not a tensor",
                self.path,
                describe(other)
            ),
            None => anyhow::bail!(
                "model.path={}: forward returned {}, which has no output {key} for the {what}; set \
                 model.{what} to {}",
                self.path,
                describe(out),
                keys(out)
            ),
        }
    }
}

/// What an output is, in PyTorch's words.
fn describe(v: &IValue) -> String {
    match v {
        IValue::Tensor(t) => format!("a tensor of shape {:?}", t.size()),
        IValue::Tuple(items) => format!("a tuple of {}", items.len()),
        IValue::GenericList(items) => format!("a list of {}", items.len()),
        IValue::TensorList(items) => format!("a list of {} tensors", items.len()),
        IValue::GenericDict(pairs) => format!("a dict with keys [{}]", dict_keys(pairs).join(", ")),
        other => format!("{other:?}"),
    }
}

fn dict_keys(pairs: &[(IValue, IValue)]) -> Vec<String> {
    pairs
        .iter()
        .map(|(k, _)| match k {
            IValue::String(s) => s.clone(),
            other => format!("{other:?}"),
        })
        .collect()
}

/// How to name the outputs `out` has.
fn keys(out: &IValue) -> String {
    match out {
        IValue::Tuple(items) | IValue::GenericList(items) => {
            format!("an index in 0..{}", items.len())
        }
        IValue::TensorList(items) => format!("an index in 0..{}", items.len()),
        IValue::GenericDict(pairs) => format!("one of [{}]", dict_keys(pairs).join(", ")),
        _ => "null (forward returns the logits tensor itself)".into(),
    }
}

impl TchModel for TorchScript {
    fn forward(
        &mut self,
        inputs: &Tensor,
        targets: Option<&Tensor>,
        train: bool,
    ) -> anyhow::Result<TchOutput> {
        if self.training != Some(train) {
            match train {
                true => self.module.f_set_train()?,
                false => self.module.f_set_eval()?,
            }
            self.training = Some(train);
        }
        let mut args = vec![IValue::Tensor(inputs.shallow_clone())];
        if let (Some(_), Some(y)) = (&self.loss, targets) {
            args.push(IValue::Tensor(y.shallow_clone()));
        }
        let out = self.module.forward_is(&args).map_err(|e| {
            let msg = e.to_string();
            let first = msg.lines().next().unwrap_or(&msg).to_string();
            anyhow::anyhow!(
                "model.path={}: forward refused inputs of shape {:?}{}: {first}",
                self.path,
                inputs.size(),
                match args.len() {
                    2 => " (and the targets, model.loss being set)",
                    _ => "",
                }
            )
        })?;
        let logits = match (&self.logits, &out) {
            (None, IValue::Tensor(t)) => t.shallow_clone(),
            (None, other) => anyhow::bail!(
                "model.path={}: forward returned {}; say which output holds the logits: model.logits= {}",
                self.path,
                describe(other),
                keys(other)
            ),
            (Some(key), out) => self.pick(out, key, "logits")?,
        };
        let loss = match (&self.loss, targets) {
            (Some(key), Some(_)) => Some(self.pick(&out, key, "loss")?),
            _ => None,
        };
        Ok(TchOutput { logits, loss })
    }

    fn parameters(&self) -> anyhow::Result<Vec<(String, Tensor)>> {
        Ok(self.module.named_parameters()?)
    }

    fn buffers(&self) -> anyhow::Result<Vec<(String, Tensor)>> {
        named_buffers(&self.module)
    }

    fn wants_targets(&self) -> bool {
        self.loss.is_some()
    }
}

extern "C" {
    fn trainyard_jit_named_buffers(
        module: *mut c_void,
        data: *mut c_void,
        f: extern "C" fn(*mut c_void, *const c_char, *mut c_void),
    ) -> std::ffi::c_int;
}

extern "C" fn push_named(data: *mut c_void, name: *const c_char, tensor: *mut c_void) {
    // SAFETY: `data` is the `Vec` `named_buffers` passed; `name` a NUL-terminated string the shim owns for
    // the call; `tensor` a new `at::Tensor*` handed to us (owned by the tch Tensor made from it).
    unsafe {
        let out = &mut *(data as *mut Vec<(String, Tensor)>);
        let name = CStr::from_ptr(name).to_string_lossy().into_owned();
        out.push((name, Tensor::from_ptr(tensor.cast())));
    }
}

/// The module's buffers (recursively, `state_dict()` names), which tch does not list.
pub fn named_buffers(module: &CModule) -> anyhow::Result<Vec<(String, Tensor)>> {
    // tch keeps the `torch::jit::Module*` as a CModule's only field.
    const _: () = assert!(std::mem::size_of::<CModule>() == std::mem::size_of::<*mut c_void>());
    // SAFETY: CModule is a struct of exactly one raw pointer (checked above), so its bits are that
    // pointer; it stays owned by `module`, which outlives the call.
    let raw: *mut c_void = unsafe { std::mem::transmute_copy(module) };
    let mut out: Vec<(String, Tensor)> = Vec::new();
    // SAFETY: `raw` is a live module; the callback receives `out` back.
    let status = unsafe {
        trainyard_jit_named_buffers(
            raw,
            (&mut out as *mut Vec<(String, Tensor)>).cast(),
            push_named,
        )
    };
    anyhow::ensure!(status == 0, "libtorch could not list the module's buffers");
    Ok(out)
}

/// Write `module` with the weights of `state` (by `state_dict()` name) to `out`: the trained network,
/// for `torch.jit.load` in PyTorch.
pub fn export(
    source: &str,
    state: &crate::tensor::StateDict,
    out: &std::path::Path,
) -> anyhow::Result<usize> {
    let module = load(source, Device::Cpu)?;
    let mut named = module.named_parameters()?;
    named.extend(named_buffers(&module)?);
    for (name, t) in &named {
        let value = state.get(name).with_context(|| {
            format!("the checkpoint has no tensor '{name}' (the module has it)")
        })?;
        let shape: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
        anyhow::ensure!(
            value.shape == shape,
            "tensor '{name}': checkpoint shape {:?}, module shape {shape:?}",
            value.shape
        );
        let v = Tensor::f_from_slice(&value.data)?.f_reshape(t.size())?;
        tch::no_grad(|| t.detach().f_copy_(&v))?;
    }
    let tmp = out.with_extension("pt.tmp");
    module
        .save(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, out).with_context(|| format!("renaming to {}", out.display()))?;
    Ok(named.len())
}
