//! The Rust half of the PyTorch oracle (`bench/oracle.py` runs it): load weights and a batch written by
//! PyTorch, run one training forward pass and one optimizer step with the engine the spec's `backend`
//! names (Candle, or tch when built with `--features torch`), and write the logits and the updated state
//! back as safetensors for comparison.
//!
//! usage: oracle_step '<model and optimizer YAML>' weights.safetensors batch.safetensors out.safetensors

use std::collections::HashMap;
use std::path::Path;
use trainyard::backend::candle::CandleEngine;
#[cfg(feature = "torch")]
use trainyard::backend::torch::TchEngine;
use trainyard::backend::Engine;
use trainyard::data::loader::Batch;
use trainyard::storage::checkpoint::{self, TrainingState};
use trainyard::tensor::HostTensor;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [spec, weights, batch, out] = &args[..] else {
        anyhow::bail!(
            "usage: oracle_step '<yaml>' weights.safetensors batch.safetensors out.safetensors"
        );
    };
    let node = trainyard::config::yaml::parse(spec, "<oracle spec>")?
        .ok_or_else(|| anyhow::anyhow!("empty spec"))?;
    let exp = trainyard::schema::extract(&node)?;
    let mut engine = OracleEngine::new(&exp)?;
    let published = checkpoint::load(Path::new(weights))?.state;
    let head =
        trainyard::model::Architecture::new(&exp.model, exp.data.channels, exp.data.image_size)?
            .head();
    let kept = trainyard::backend::load_pretrained(&mut *engine, &published, &head)?;
    anyhow::ensure!(
        kept.is_empty(),
        "the oracle's weights must cover the head too (missing {kept:?})"
    );

    let inputs = checkpoint::load(Path::new(batch))?.state;
    let x = &inputs["x"];
    let batch = Batch {
        images: x.data.clone(),
        labels: inputs["y"].data.iter().map(|v| *v as u32).collect(),
        channels: x.shape[1],
        height: x.shape[2],
        width: x.shape[3],
        staged: None,
        tensors: None,
    };
    engine.forward_backward(&batch, 1.0)?;
    engine.optimizer_step(exp.optimizer.lr, None, None)?;

    let mut state = engine.state_dict()?;
    state.retain(|k, _| !k.starts_with("optimizer."));
    let logits = engine
        .last_logits()?
        .ok_or_else(|| anyhow::anyhow!("no logits recorded"))?;
    state.insert("logits".into(), logits);
    let training = TrainingState {
        epoch: 0,
        global_step: 1,
        metrics: HashMap::new(),
        best: None,
        epochs_without_improvement: 0,
        stop_best: None,
        batches_done: 0,
        plateau: None,
        best_checkpoint: None,
        running: None,
    };
    checkpoint::save(Path::new(out), &state, &training, spec)
}

/// The engine under test, keeping access to its last training logits.
enum OracleEngine {
    Candle(CandleEngine),
    #[cfg(feature = "torch")]
    Tch(TchEngine),
}

impl OracleEngine {
    fn new(exp: &trainyard::schema::Experiment) -> anyhow::Result<Self> {
        match exp.backend {
            trainyard::schema::Backend::Candle => Ok(Self::Candle(CandleEngine::new(exp)?)),
            #[cfg(feature = "torch")]
            trainyard::schema::Backend::Tch => Ok(Self::Tch(TchEngine::new(exp)?)),
            #[cfg(not(feature = "torch"))]
            trainyard::schema::Backend::Tch => {
                anyhow::bail!("backend: tch needs this example built with --features torch")
            }
        }
    }

    fn last_logits(&self) -> anyhow::Result<Option<HostTensor>> {
        match self {
            Self::Candle(e) => e.last_logits(),
            #[cfg(feature = "torch")]
            Self::Tch(e) => e.last_logits(),
        }
    }
}

impl std::ops::Deref for OracleEngine {
    type Target = dyn Engine;
    fn deref(&self) -> &Self::Target {
        match self {
            Self::Candle(e) => e,
            #[cfg(feature = "torch")]
            Self::Tch(e) => e,
        }
    }
}

impl std::ops::DerefMut for OracleEngine {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self {
            Self::Candle(e) => e,
            #[cfg(feature = "torch")]
            Self::Tch(e) => e,
        }
    }
}
