//! Checkpoints in and out of a run: ModelCheckpoint and EarlyStopping after every validation (`Keeper`),
//! where checkpoints are kept (the run's `checkpoints/`, uploaded to an `s3://` dirpath), and where a
//! run starts from (`model.pretrained`, `ckpt_path`, resolved locally or on S3). Which ranks write which
//! files is the strategy's (`Strategy::save_checkpoint`, `Strategy::checkpoint_file`).

use super::summary::RunStatus;
use crate::schema::{EarlyStopping, Experiment, Mode, ModelCheckpoint};
use crate::storage::checkpoint::TrainingState;
use crate::strategy::Strategy;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Where checkpoints end up: the local file itself, or an `s3://` prefix they are uploaded to.
pub struct Storage {
    remote: Option<crate::storage::s3::S3Url>,
}

impl Storage {
    /// `callbacks.model_checkpoint.dirpath` when it is an `s3://` prefix; local otherwise.
    pub fn of(exp: &Experiment) -> anyhow::Result<Storage> {
        Ok(Storage {
            remote: remote_checkpoint_prefix(exp)?,
        })
    }

    /// Fail before training, not at the first checkpoint, when the bucket cannot be reached.
    pub fn check_reachable(&self) -> anyhow::Result<()> {
        if let Some(prefix) = &self.remote {
            crate::storage::s3::exists(&prefix.join("last.safetensors"))
                .with_context(|| format!("callbacks.model_checkpoint.dirpath={prefix}"))?;
        }
        Ok(())
    }

    /// The folder checkpoints are written to (atomically): the run's `checkpoints/` for a remote
    /// dirpath, which they are uploaded from.
    pub fn local_dir(&self, cfg: &ModelCheckpoint, output_dir: &Path) -> PathBuf {
        match &self.remote {
            Some(_) => output_dir.join("checkpoints"),
            None => PathBuf::from(&cfg.dirpath),
        }
    }

    /// Upload a written checkpoint (to an `s3://` dirpath) and say where it is.
    pub fn publish(&self, path: &Path) -> anyhow::Result<String> {
        let Some(prefix) = &self.remote else {
            return Ok(path.display().to_string());
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let url = prefix.join(&name);
        let started = Instant::now();
        // A failed upload stops the run (docs/src/checkpoints.md): training on without the checkpoint a
        // spot instance would resume from is the loss this storage is for. The file stays here.
        crate::storage::s3::upload(path, &url).with_context(|| {
            format!(
                "callbacks.model_checkpoint.dirpath={prefix}: the checkpoint could not be uploaded; it is \
                 kept at {} (resume from it with ckpt_path={0})",
                path.display()
            )
        })?;
        tracing::info!(
            "uploaded {url} ({} bytes) in {:.1}s",
            std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
            started.elapsed().as_secs_f64()
        );
        Ok(url.to_string())
    }

    /// Remove a replaced checkpoint, locally and remotely.
    pub fn unpublish(&self, path: &Path) {
        let _ = std::fs::remove_file(path);
        if let (Some(prefix), Some(name)) = (&self.remote, path.file_name()) {
            if let Err(e) = crate::storage::s3::delete(&prefix.join(&name.to_string_lossy())) {
                tracing::warn!("could not delete the replaced checkpoint: {e:#}");
            }
        }
    }
}

/// A checkpoint written: the file this rank wrote and, for rank 0's, where it went.
#[derive(Debug, Clone, Default)]
pub struct Saved {
    pub written: Option<PathBuf>,
    pub location: Option<String>,
}

/// ModelCheckpoint and EarlyStopping, run after every validation (mid-epoch ones included, as
/// Lightning's `on_validation_end`) and at each epoch's end: did the monitored metric improve, which
/// checkpoints to write or replace, and whether to stop.
pub struct Keeper<'a> {
    pub ckpt_cfg: Option<&'a ModelCheckpoint>,
    pub stop_cfg: Option<&'a EarlyStopping>,
    pub dir: Option<PathBuf>,
    pub config_yaml: &'a str,
    pub storage: Storage,
    pub best: Option<Saved>,
    /// The best checkpoint's path, known on every rank (`test: true` loads it after fitting).
    pub best_path: Option<PathBuf>,
    pub last: Option<Saved>,
}

impl Keeper<'_> {
    /// Update the best value and the patience count, write the due checkpoints; returns why to stop when
    /// EarlyStopping's patience ran out.
    pub fn on_validation_end(
        &mut self,
        strategy: &mut dyn Strategy,
        state: &mut TrainingState,
        epoch: u64,
    ) -> anyhow::Result<Option<RunStatus>> {
        // ModelCheckpoint's best: its `monitor` (else EarlyStopping's, so the summary still names a best),
        // with no margin (Lightning's ModelCheckpoint has no `min_delta`).
        let monitor = self
            .ckpt_cfg
            .and_then(|c| c.monitor.clone().map(|m| (m, c.mode)))
            .or_else(|| self.stop_cfg.map(|s| (s.monitor.clone(), s.mode)));
        let mut improved = false;
        if let Some((name, mode)) = &monitor {
            if let Some(&value) = state.metrics.get(name.as_str()) {
                improved = state.best.is_none_or(|(b, _)| better(*mode, value, b, 0.0));
                if improved {
                    state.best = Some((value, epoch));
                }
            }
        }
        self.save_checkpoints(strategy, state, epoch, improved)?;
        let Some(stop) = self.stop_cfg else {
            return Ok(None);
        };
        // EarlyStopping's own question, on its own monitor, mode and `min_delta` (Lightning's rule): an
        // improvement resets the count; otherwise the count grows, and the run stops once it reaches
        // `patience`. A checkpoint from before `stop_best` was kept carries it in `best` when the monitors
        // were the same.
        let same_monitor = monitor.as_ref().is_some_and(|(m, _)| *m == stop.monitor);
        Ok(early_stopping(stop, state, same_monitor))
    }

    /// A training epoch ended without a validation (`max_steps` mid-epoch): nothing new to compare, so
    /// only what does not depend on the monitored metric is written (`last`; the latest when nothing is
    /// monitored).
    pub fn on_train_epoch_end(
        &mut self,
        strategy: &mut dyn Strategy,
        state: &TrainingState,
        epoch: u64,
    ) -> anyhow::Result<()> {
        self.save_checkpoints(strategy, state, epoch, false)
    }

    fn save_checkpoints(
        &mut self,
        strategy: &mut dyn Strategy,
        state: &TrainingState,
        epoch: u64,
        improved: bool,
    ) -> anyhow::Result<()> {
        let (Some(cfg), Some(dir)) = (self.ckpt_cfg, self.dir.clone()) else {
            return Ok(());
        };
        // Every checkpoint records where the best one is, so a resumed run still knows it.
        let mut state = state.clone();
        state.best_checkpoint = self.best_path.as_ref().map(|p| p.display().to_string());
        let config_yaml = self.config_yaml;
        let storage = &self.storage;
        let mut save = |path: &Path, state: &TrainingState| -> anyhow::Result<Saved> {
            save_published(strategy, storage, config_yaml, path, state)
        };
        // `every_n_epochs` counts the epoch in progress, as Lightning's (current_epoch + 1).
        let due = (epoch + 1).is_multiple_of(cfg.every_n_epochs.max(1));
        if due && cfg.save_top_k != 0 && (improved || cfg.monitor.is_none()) {
            let name = crate::callbacks::checkpoint_name(
                &cfg.filename,
                epoch,
                state.global_step,
                &state.metrics,
            );
            let path = dir.join(format!("{name}.safetensors"));
            state.best_checkpoint = Some(path.display().to_string());
            let saved = save(&path, &state)?;
            self.best_path = Some(path);
            let replaced = self.best.replace(saved.clone());
            if cfg.save_top_k == 1 {
                if let Some(old) = replaced.and_then(|old| old.written) {
                    if Some(&old) != saved.written.as_ref() {
                        self.storage.unpublish(&old);
                    }
                }
            }
        }
        if cfg.save_last {
            self.last = Some(save(&dir.join("last.safetensors"), &state)?);
        }
        Ok(())
    }

    /// A stop signal came: the resume point is also written as `last` where ModelCheckpoint keeps it
    /// (`s3://` included), so `ckpt_path=last` or `auto` on another machine continues from it.
    pub fn on_preempt(
        &mut self,
        strategy: &mut dyn Strategy,
        state: &TrainingState,
    ) -> anyhow::Result<()> {
        let (Some(cfg), Some(dir)) = (self.ckpt_cfg, self.dir.clone()) else {
            return Ok(());
        };
        if !cfg.save_last {
            return Ok(());
        }
        let mut state = state.clone();
        state.best_checkpoint = self.best_path.as_ref().map(|p| p.display().to_string());
        let path = dir.join("last.safetensors");
        self.last = Some(save_published(
            strategy,
            &self.storage,
            self.config_yaml,
            &path,
            &state,
        )?);
        Ok(())
    }

    /// Where the best and the last checkpoint are (URLs for an `s3://` dirpath).
    pub fn locations(&self) -> (Option<String>, Option<String>) {
        let location = |s: &Option<Saved>| {
            s.as_ref().and_then(|s| {
                s.location
                    .clone()
                    .or_else(|| s.written.as_ref().map(|p| p.display().to_string()))
            })
        };
        // Resumed without a new best: the best is the one the checkpoint named.
        let best = location(&self.best)
            .or_else(|| self.best_path.as_ref().map(|p| p.display().to_string()));
        (best, location(&self.last))
    }
}

/// Write a checkpoint (every rank calls it: the strategy decides who writes what, and gathers a sharded
/// model) and publish rank 0's file where the storage keeps it.
fn save_published(
    strategy: &mut dyn Strategy,
    storage: &Storage,
    config_yaml: &str,
    path: &Path,
    state: &TrainingState,
) -> anyhow::Result<Saved> {
    let written = strategy.save_checkpoint(path, state, config_yaml)?;
    let location = match &written {
        Some(file) => Some(storage.publish(file)?),
        None => None,
    };
    Ok(Saved { written, location })
}

/// EarlyStopping after a validation, Lightning's rule on its own monitor: an improvement by more than
/// `min_delta` resets the count; otherwise the count grows, and the run stops once it reaches `patience`
/// (`same_monitor`: ModelCheckpoint watches the same metric, so an older checkpoint's `best` stands in for
/// a missing `stop_best`).
fn early_stopping(
    stop: &EarlyStopping,
    state: &mut TrainingState,
    same_monitor: bool,
) -> Option<RunStatus> {
    let &value = state.metrics.get(stop.monitor.as_str())?;
    let best = state
        .stop_best
        .or_else(|| same_monitor.then(|| state.best.map(|(b, _)| b)).flatten());
    if best.is_none_or(|b| better(stop.mode, value, b, stop.min_delta)) {
        state.stop_best = Some(value);
        state.epochs_without_improvement = 0;
        return None;
    }
    state.stop_best = best;
    state.epochs_without_improvement += 1;
    (state.epochs_without_improvement >= stop.patience)
        .then(|| RunStatus::early_stopped(&stop.monitor, stop.patience))
}

fn better(mode: Mode, new: f64, old: f64, min_delta: f64) -> bool {
    match mode {
        Mode::Max => new > old + min_delta,
        Mode::Min => new < old - min_delta,
    }
}

/// The checkpoint written when the cluster's warning signal came (Lightning's `hpc_ckpt`): in the run's
/// own directory, so the requeued job finds it.
pub fn preemption_checkpoint(output_dir: &Path) -> PathBuf {
    output_dir.join("checkpoints").join("hpc_ckpt.safetensors")
}

/// `callbacks.model_checkpoint.dirpath` when it is an `s3://` prefix.
pub(super) fn remote_checkpoint_prefix(
    exp: &Experiment,
) -> anyhow::Result<Option<crate::storage::s3::S3Url>> {
    match &exp.callbacks.model_checkpoint {
        Some(c) if crate::storage::s3::is_s3(&c.dirpath) => {
            Ok(Some(crate::storage::s3::S3Url::parse(&c.dirpath)?))
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn state() -> TrainingState {
        TrainingState {
            epoch: 0,
            global_step: 0,
            metrics: Default::default(),
            best: None,
            epochs_without_improvement: 0,
            stop_best: None,
            batches_done: 0,
            plateau: None,
            best_checkpoint: None,
            running: None,
        }
    }

    /// Lightning's EarlyStopping on a run of `val/loss` values: the check (1-based) it stops at.
    #[rstest]
    #[case::patience_0_stops_at_the_first_check_without_improvement(0, 0.0, &[2.0, 1.9, 1.95, 1.8], Some(3))]
    #[case::patience_2(2, 0.0, &[2.0, 1.9, 1.95, 1.96, 1.97], Some(4))]
    #[case::an_improvement_resets_the_count(2, 0.0, &[2.0, 2.1, 1.5, 1.6, 1.7], Some(5))]
    #[case::min_delta_is_a_margin(0, 0.5, &[2.0, 1.6], Some(2))]
    #[case::never(1, 0.0, &[2.0, 1.9, 1.8], None)]
    fn early_stopping_follows_lightnings_rule(
        #[case] patience: u64,
        #[case] min_delta: f64,
        #[case] losses: &[f64],
        #[case] stops_at: Option<usize>,
    ) {
        let stop = EarlyStopping {
            monitor: "val/loss".into(),
            mode: Mode::Min,
            patience,
            min_delta,
        };
        let mut s = state();
        // ModelCheckpoint's best is another metric's: it must not count for EarlyStopping.
        s.best = Some((0.9, 0));
        let mut stopped = None;
        for (i, loss) in losses.iter().enumerate() {
            s.metrics.insert("val/loss".into(), *loss);
            if early_stopping(&stop, &mut s, false).is_some() {
                stopped = Some(i + 1);
                break;
            }
        }
        assert_eq!(stopped, stops_at);
    }
}
