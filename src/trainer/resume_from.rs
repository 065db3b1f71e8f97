//! Where a run resumes from, as a list of candidates tried newest first: this job's own earlier attempt
//! (the checkpoint a stop signal wrote, Lightning's `hpc_ckpt`; a resumed sweep job's `last`), then
//! `ckpt_path` — a file, an `s3://` URL, `last` (the newest `last.safetensors` of this task's runs, or
//! under an `s3://` dirpath) or `auto` (the newest checkpoint of an earlier run of the same config, none
//! meaning a fresh start, so one command serves a spot instance's every start). A damaged candidate
//! (cut short, checksum wrong) is passed over for the one behind it by `checkpointing::restore`.

use super::checkpointing::{preemption_checkpoint, remote_checkpoint_prefix, Storage};
use crate::schema::Experiment;
use crate::storage::checkpoint::{self, TrainingState};
use crate::storage::s3::S3Url;
use crate::strategy::Strategy;
use anyhow::Context;
use std::path::{Path, PathBuf};

/// `ckpt_path=auto`.
pub const AUTO: &str = "auto";

/// A checkpoint a run may resume from.
pub struct Candidate {
    source: Source,
    /// Where it came from, as the run records it (`resumed_from`).
    pub origin: String,
}

enum Source {
    Local(PathBuf),
    Remote(S3Url),
}

impl Candidate {
    fn local(path: PathBuf) -> Candidate {
        Candidate {
            origin: path.display().to_string(),
            source: Source::Local(path),
        }
    }

    fn remote(url: S3Url) -> Candidate {
        Candidate {
            origin: url.to_string(),
            source: Source::Remote(url),
        }
    }

    /// The file to load: itself, or downloaded into the run directory (`.resume/`).
    pub fn fetch(&self, output_dir: &Path) -> anyhow::Result<PathBuf> {
        match &self.source {
            Source::Local(path) => Ok(path.clone()),
            Source::Remote(url) => {
                let name = url
                    .key
                    .rsplit('/')
                    .next()
                    .unwrap_or("checkpoint.safetensors");
                let local = output_dir.join(".resume").join(name);
                tracing::info!("downloading {url}");
                crate::storage::s3::download(url, &local)
                    .with_context(|| format!("resuming from {url}"))?;
                Ok(local)
            }
        }
    }
}

/// The checkpoints this run may resume from, in the order to try them; empty for a fresh start.
/// `job_config` is this run's composed config (`.hydra/config.yaml`), which `auto` matches earlier runs
/// by; `part` names this rank's file of a checkpoint (`Strategy::checkpoint_file`).
pub fn candidates(
    exp: &Experiment,
    output_dir: &Path,
    resume_own: bool,
    job_config: &str,
    part: &dyn Fn(&str) -> String,
) -> anyhow::Result<Vec<Candidate>> {
    let mine = |path: PathBuf| {
        let name = file_name(&path);
        path.with_file_name(part(&name))
    };
    let mine_remote = |url: S3Url| {
        let name = part(url.file_name());
        url.with_file_name(&name)
    };
    // This job's own earlier attempt wins over `ckpt_path`, its newest checkpoint first: the one a stop
    // signal wrote, or (a resumed sweep job, a restarted run) ModelCheckpoint's `last`.
    let mut own = vec![mine(preemption_checkpoint(output_dir))];
    // `auto` rerun into the same directory (a fixed `hydra.run.dir`) continues it as a restart would.
    if resume_own || exp.ckpt_path.as_deref() == Some(AUTO) {
        own.extend(local_last(exp, output_dir, output_dir)?.map(mine));
    }
    let mut out: Vec<Candidate> = newest_first(own)
        .into_iter()
        .map(Candidate::local)
        .collect();
    let Some(ckpt) = exp.ckpt_path.as_deref() else {
        return Ok(out);
    };
    let remote_last = || -> anyhow::Result<Option<Candidate>> {
        match remote_checkpoint_prefix(exp)? {
            Some(prefix) => {
                let last = mine_remote(prefix.join("last.safetensors"));
                Ok(crate::storage::s3::exists(&last)?.then(|| Candidate::remote(last)))
            }
            None => Ok(None),
        }
    };
    match ckpt {
        url if crate::storage::s3::is_s3(url) => {
            out.push(Candidate::remote(mine_remote(S3Url::parse(url)?)))
        }
        "last" => {
            let remote = remote_last()?;
            let found_remote = remote.is_some();
            out.extend(remote);
            let lasts = newest_run_first(
                earlier_runs(output_dir)
                    .into_iter()
                    .map(|run| (run.join("checkpoints").join("last.safetensors"), run))
                    .filter(|(p, _)| p.is_file())
                    .collect(),
            );
            anyhow::ensure!(
                found_remote || !lasts.is_empty(),
                "ckpt_path=last: no checkpoints/last.safetensors in any earlier run of '{}' under {}",
                exp.task_name,
                runs_dir(output_dir)?.display()
            );
            out.extend(lasts.into_iter().map(mine).map(Candidate::local));
        }
        AUTO => {
            out.extend(
                same_config_checkpoints(exp, output_dir, job_config)?
                    .into_iter()
                    .map(mine)
                    .map(Candidate::local),
            );
            out.extend(remote_last()?);
        }
        file => {
            let p = PathBuf::from(file);
            anyhow::ensure!(p.is_file(), "ckpt_path={file}: no such checkpoint file");
            out.push(Candidate::local(mine(p)));
        }
    }
    Ok(out)
}

/// The run's own checkpoints a restart of its processes resumes from (the newest that exists).
pub fn own_checkpoints(exp: &Experiment, output_dir: &Path) -> Vec<PathBuf> {
    let mut files = vec![preemption_checkpoint(output_dir)];
    files.extend(local_last(exp, output_dir, output_dir).ok().flatten());
    files
}

/// Checkpoints of earlier runs (beside this one) whose config is this run's, `ckpt_path` aside: the stop
/// signal's and ModelCheckpoint's `last`, newest first.
fn same_config_checkpoints(
    exp: &Experiment,
    output_dir: &Path,
    job_config: &str,
) -> anyhow::Result<Vec<PathBuf>> {
    let ours = without_ckpt_path(job_config);
    let mut files = Vec::new();
    for run in earlier_runs(output_dir) {
        let Ok(theirs) = std::fs::read_to_string(run.join(".hydra").join("config.yaml")) else {
            continue;
        };
        if without_ckpt_path(&theirs) == ours {
            files.push(preemption_checkpoint(&run));
            files.extend(local_last(exp, output_dir, &run)?);
        }
    }
    Ok(newest_first(files))
}

/// The files that exist, the most recently written first.
pub fn newest_first(files: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
    for file in files {
        if let Ok(modified) = std::fs::metadata(&file).and_then(|m| m.modified()) {
            if !found.iter().any(|(_, f)| *f == file) {
                found.push((modified, file));
            }
        }
    }
    found.sort_by_key(|(modified, _)| std::cmp::Reverse(*modified));
    found.into_iter().map(|(_, f)| f).collect()
}

/// Checkpoints of earlier runs (each with its run directory), the newest run first: by the start time
/// its `run.json` records (the last start, after a resume), else by the checkpoint's own time. Never by
/// the directory's name: `hydra.run.dir` may name runs in any order.
fn newest_run_first(files: Vec<(PathBuf, PathBuf)>) -> Vec<PathBuf> {
    let mut keyed: Vec<_> = files
        .into_iter()
        .map(|(file, run)| {
            let started = crate::storage::records::RunState::read(&run)
                .and_then(|r| chrono::DateTime::parse_from_rfc3339(&r.started_at).ok())
                .map(|t| t.timestamp_micros());
            let modified = std::fs::metadata(&file).and_then(|m| m.modified()).ok();
            (started, modified, file)
        })
        .collect();
    keyed.sort_by(|a, b| (&b.0, &b.1).cmp(&(&a.0, &a.1)));
    keyed.into_iter().map(|(_, _, f)| f).collect()
}

/// A config's text without its top-level `ckpt_path` (a run started without `auto` is the same run).
fn without_ckpt_path(config: &str) -> Option<String> {
    let mut node = crate::config::yaml::parse(config, "config.yaml").ok()??;
    if let Some(map) = node.as_map_mut() {
        map.shift_remove("ckpt_path");
    }
    Some(crate::config::yaml::to_yaml(&node))
}

/// Where ModelCheckpoint keeps `last` for the run in `run_dir`, when it keeps one: this run's checkpoint
/// folder, moved to `run_dir` when it lies inside this run's directory (`${paths.output_dir}/checkpoints`).
fn local_last(
    exp: &Experiment,
    output_dir: &Path,
    run_dir: &Path,
) -> anyhow::Result<Option<PathBuf>> {
    let Some(cfg) = exp.callbacks.model_checkpoint.as_ref() else {
        return Ok(None);
    };
    let ours = Storage::of(exp)?.local_dir(cfg, output_dir);
    let dir = match ours.strip_prefix(output_dir) {
        Ok(inside) => run_dir.join(inside),
        Err(_) => ours,
    };
    Ok(Some(dir.join("last.safetensors")))
}

fn runs_dir(output_dir: &Path) -> anyhow::Result<&Path> {
    output_dir
        .parent()
        .context("the run directory has no parent")
}

/// The other run directories beside this one.
fn earlier_runs(output_dir: &Path) -> Vec<PathBuf> {
    let Some(runs) = output_dir.parent() else {
        return Vec::new();
    };
    std::fs::read_dir(runs)
        .map(|r| {
            r.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir() && p != output_dir)
                .collect()
        })
        .unwrap_or_default()
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Load what the run starts from: published weights (`model.pretrained`, every rank reads the file),
/// then a checkpoint to resume (`ckpt_path`: each rank its own part of it). Returns the training state
/// to resume at and where the checkpoint came from.
pub fn restore(
    exp: &Experiment,
    strategy: &mut dyn Strategy,
    output_dir: &Path,
    resume_own: bool,
    job_config: &str,
) -> anyhow::Result<(Option<TrainingState>, Option<String>)> {
    if let Some(file) = &exp.model.pretrained {
        let loaded = checkpoint::load(Path::new(file))
            .with_context(|| format!("model.pretrained={file}"))?;
        let head = crate::model::Architecture::of(exp)?.head();
        let kept = strategy
            .load_pretrained(&loaded.state, &head)
            .with_context(|| format!("model.pretrained={file}"))?;
        tracing::info!(
            "loaded pretrained weights from {file}; newly initialised: {}",
            if kept.is_empty() {
                "none".into()
            } else {
                kept.join(", ")
            }
        );
    }
    let part = |name: &str| strategy.checkpoint_file(name);
    let candidates = candidates(exp, output_dir, resume_own, job_config, &part)?;
    if candidates.is_empty() {
        if exp.ckpt_path.as_deref() == Some(AUTO) {
            tracing::info!(
                "ckpt_path=auto: no earlier run of this config left a checkpoint; starting fresh"
            );
        }
        return Ok((None, None));
    }
    let count = candidates.len();
    for (i, candidate) in candidates.into_iter().enumerate() {
        let path = candidate.fetch(output_dir)?;
        let loaded = match checkpoint::load(&path) {
            Ok(loaded) => loaded,
            // A damaged checkpoint (cut short, checksum wrong) with an older one behind it: use that.
            Err(e) if i + 1 < count && e.downcast_ref::<checkpoint::Damaged>().is_some() => {
                tracing::warn!("{e:#}; resuming from the checkpoint before it");
                continue;
            }
            Err(e) => return Err(e),
        };
        strategy
            .load_state_dict(&loaded.state)
            .with_context(|| format!("loading {}", path.display()))?;
        let training = loaded.training;
        if let Some(t) = &training {
            match exp.train {
                true => tracing::info!(
                    "Resumed from {} (epoch {}, step {})",
                    candidate.origin,
                    t.epoch,
                    t.global_step
                ),
                // `train eval`: the checkpoint's weights are measured, nothing resumes.
                false => tracing::info!(
                    "{} the weights of {} (trained for {} epochs, {} steps)",
                    match exp.predict {
                        Some(_) => "Predicting with",
                        None => "Evaluating",
                    },
                    candidate.origin,
                    t.epoch,
                    t.global_step
                ),
            }
        }
        return Ok((training, Some(candidate.origin)));
    }
    anyhow::bail!("no checkpoint to resume from could be loaded")
}
