//! `train export ckpt=CHECKPOINT out=TRAINED.pt [module=SOURCE.pt]`: a run that trained a TorchScript
//! module (`model=torchscript`) gives its network back to PyTorch — the checkpoint's weights written into
//! the module it started from, so `torch.jit.load("trained.pt")` is the trained network. The source
//! module is the run's own `model.path` (from the resolved config the checkpoint keeps) unless `module=`
//! names one.

use anyhow::Context;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const KEYS: [&str; 3] = ["ckpt", "out", "module"];

/// Parse `key=value` arguments and export.
pub fn run(args: &[OsString]) -> anyhow::Result<ExitCode> {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "Write a TorchScript run's trained network back into its module, for PyTorch \
             (torch.jit.load).\n\nUsage: {}\n\n  ckpt=FILE    the run's checkpoint (its config names \
             the source module)\n  out=FILE     the TorchScript file to write\n  module=FILE  the \
             module to write the weights into (default: the run's model.path)",
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
    "train export ckpt=<run>/checkpoints/last.safetensors out=trained.pt [module=net.pt]"
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
