//! `train export ckpt=CHECKPOINT out=FILE`: a checkpoint's network for PyTorch.
//! - `out=weights.safetensors`: the model's own tensors only (parameters and buffers, under their
//!   torchvision/timm/`nn.Sequential` names; no optimizer state, no training metadata), which
//!   `model.load_state_dict(safetensors.torch.load_file(...), strict=True)` takes as it is.
//! - `out=trained.pt [module=SOURCE.pt]`: a run that trained a TorchScript module (`model=torchscript`)
//!   gives its network back — the checkpoint's weights written into the module it started from, so
//!   `torch.jit.load("trained.pt")` is the trained network. The source module is the run's own
//!   `model.path` (from the resolved config the checkpoint keeps) unless `module=` names one.

use anyhow::Context;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const KEYS: [&str; 3] = ["ckpt", "out", "module"];

/// Parse `key=value` arguments and export.
pub fn run(args: &[OsString]) -> anyhow::Result<ExitCode> {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "Write a checkpoint's network for PyTorch: its weights alone (out=*.safetensors, for \
             load_state_dict(strict=True)), or a TorchScript run's trained module (out=*.pt, for \
             torch.jit.load).\n\nUsage: {}\n\n  ckpt=FILE    the run's checkpoint\n  out=FILE     \
             weights.safetensors (the model's tensors, no optimizer state) or trained.pt (TorchScript)\n  \
             module=FILE  with out=*.pt: the module to write the weights into (default: the run's \
             model.path)",
            usage()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let (mut ckpt, mut out, mut module) = (None, None, None);
    for arg in args {
        let arg = arg.to_string_lossy();
        let Some((key, value)) = arg.split_once('=') else {
            anyhow::bail!("train export: '{arg}' is not key=value; usage: {}", usage());
        };
        match key {
            "ckpt" => ckpt = Some(PathBuf::from(value)),
            "out" => out = Some(PathBuf::from(value)),
            "module" => module = Some(value.to_string()),
            other => {
                let hint = crate::config::errors::did_you_mean(other, KEYS.iter().copied())
                    .map(|s| format!("; did you mean '{s}'?"))
                    .unwrap_or_default();
                anyhow::bail!(
                    "train export: unknown argument '{other}'{hint}; usage: {}",
                    usage()
                )
            }
        }
    }
    let ckpt = ckpt.with_context(|| format!("train export needs ckpt=; usage: {}", usage()))?;
    let out = out.with_context(|| format!("train export needs out=; usage: {}", usage()))?;
    let loaded = crate::storage::checkpoint::load(&ckpt)
        .with_context(|| format!("ckpt={}", ckpt.display()))?;
    if out.extension().is_some_and(|e| e == "safetensors") {
        anyhow::ensure!(
            module.is_none(),
            "train export: module= names a TorchScript module to write into; out={} is a weights file",
            out.display()
        );
        let written = weights_only(&loaded.state, &out)?;
        println!(
            "Exported the model's {written} tensors of {} (no optimizer state): {}\n    In PyTorch: \
             model.load_state_dict(safetensors.torch.load_file(\"{}\"), strict=True)",
            ckpt.display(),
            out.display(),
            out.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let module = match module {
        Some(m) => m,
        None => source_module(&ckpt, loaded.config.as_deref())?,
    };
    let written = export(&loaded.state, &module, &out)?;
    println!(
        "Exported {written} tensors of {} into {module}'s module: {}",
        ckpt.display(),
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn usage() -> &'static str {
    "train export ckpt=<run>/checkpoints/last.safetensors out=weights.safetensors \
     (or out=trained.pt [module=net.pt] for a TorchScript run)"
}

/// The model's tensors of a checkpoint as PyTorch's `state_dict()` holds them, written atomically to
/// `out`: the training state (`optimizer.*`) left out, BatchNorm's `num_batches_tracked` as int64 (its
/// dtype in PyTorch). Returns how many tensors were written.
pub fn weights_only(state: &crate::tensor::StateDict, out: &Path) -> anyhow::Result<usize> {
    use safetensors::tensor::{Dtype, TensorView};
    anyhow::ensure!(
        !state.keys().any(|k| k.starts_with("fsdp.")),
        "a sharded FSDP checkpoint (one file per rank) holds slices of flattened units, not the model's \
         tensors: export the full one (trainer.fsdp.state_dict_type=full writes it)"
    );
    let bytes: Vec<(&String, Vec<u8>, Dtype, &Vec<usize>)> = state
        .iter()
        .filter(|(k, _)| !k.starts_with("optimizer."))
        .map(|(k, t)| match k.ends_with("num_batches_tracked") {
            true => (
                k,
                t.data
                    .iter()
                    .flat_map(|v| (*v as i64).to_le_bytes())
                    .collect(),
                Dtype::I64,
                &t.shape,
            ),
            false => (
                k,
                t.data.iter().flat_map(|v| v.to_le_bytes()).collect(),
                Dtype::F32,
                &t.shape,
            ),
        })
        .collect();
    let views = bytes
        .iter()
        .map(|(k, b, dtype, shape)| {
            Ok((k.to_string(), TensorView::new(*dtype, shape.to_vec(), b)?))
        })
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    let metadata = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    let data = safetensors::serialize(views, Some(metadata))?;
    crate::storage::records::write_atomic(out, &data)
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(bytes.len())
}

#[cfg(feature = "torch")]
fn export(state: &crate::tensor::StateDict, module: &str, out: &Path) -> anyhow::Result<usize> {
    crate::backend::torch::torchscript::export(module, state, out)
}

#[cfg(not(feature = "torch"))]
fn export(_: &crate::tensor::StateDict, _: &str, _: &Path) -> anyhow::Result<usize> {
    anyhow::bail!(
        "train export writes a TorchScript module with libtorch, which this build lacks: \
         eval \"$(scripts/install-libtorch.sh)\" and rebuild with --features torch"
    )
}

/// The TorchScript file the checkpoint's run trained: `model.path` of the resolved config the checkpoint
/// keeps (a relative path is the launch directory's, as the run read it).
fn source_module(ckpt: &Path, config: Option<&str>) -> anyhow::Result<String> {
    let text = config.with_context(|| {
        format!(
            "ckpt={}: the checkpoint keeps no config to read model.path from; name the source module \
             with module=net.pt",
            ckpt.display()
        )
    })?;
    let name = format!("{} (its config)", ckpt.display());
    let tree = crate::config::yaml::parse(text, &name)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .with_context(|| format!("{name} is empty"))?;
    let target = tree.get("model._target_").and_then(|n| n.as_str());
    anyhow::ensure!(
        target == Some(crate::registry::TORCHSCRIPT),
        "ckpt={}: its run did not train a TorchScript module (model._target_ is {}); only model=torchscript \
         runs export",
        ckpt.display(),
        target.unwrap_or("not set")
    );
    tree.get("model.path")
        .and_then(|n| n.as_str())
        .map(String::from)
        .with_context(|| format!("{name} has no model.path"))
}
