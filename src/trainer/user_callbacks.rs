//! The callbacks a crate registered (`register_callback!`), built on every rank from `callbacks.<name>`:
//! each sees every logged row, may stop the run at an epoch's end (a stop on any rank stops all, as
//! Lightning reduces `should_stop`), and hears how the run ended. trainyard's own callbacks
//! (ModelCheckpoint, EarlyStopping, the Timer, ...) are the loop's and are not here.

use crate::registry::{Callback, CallbackRun, EpochEnd, Flow, Row, RunEnd};
use crate::schema::Experiment;
use crate::strategy::Ranks;
use anyhow::Context;
use std::collections::BTreeMap;
use std::path::Path;

/// Each registered callback under its config key (`callbacks.<name>`).
pub(super) struct UserCallbacks(Vec<(String, Box<dyn Callback>)>);

impl UserCallbacks {
    pub fn build(exp: &Experiment, run_dir: &Path, ranks: &Ranks) -> anyhow::Result<UserCallbacks> {
        let run = CallbackRun {
            run_dir,
            task_name: &exp.task_name,
            rank: ranks.rank,
            world_size: ranks.world_size,
        };
        let mut list = Vec::new();
        for spec in &exp.callbacks.registered {
            let entry = crate::registry::callback(&spec.target).with_context(|| {
                format!(
                    "{}: _target_ {} is not registered",
                    spec.section, spec.target
                )
            })?;
            let callback =
                (entry.build)(&spec.args, &run).map_err(|e| anyhow::anyhow!(spec.refused(&e)))?;
            list.push((spec.section.clone(), callback));
        }
        Ok(UserCallbacks(list))
    }

    pub fn on_row(&mut self, row: &Row) -> anyhow::Result<()> {
        for (key, callback) in &mut self.0 {
            callback
                .on_row(row)
                .with_context(|| format!("{key}: on_row"))?;
        }
        Ok(())
    }

    /// The epoch ended with `metrics`: does a callback, on any rank, stop the run? (A collective when
    /// there are callbacks: every rank has the same ones and calls it at the same epoch.)
    pub fn stop_after_epoch(
        &mut self,
        epoch: u64,
        step: u64,
        metrics: &BTreeMap<String, f64>,
        ranks: &Ranks,
    ) -> anyhow::Result<Option<String>> {
        if self.0.is_empty() {
            return Ok(None);
        }
        let end = EpochEnd {
            epoch,
            step,
            metrics,
        };
        let mut stop = None;
        for (key, callback) in &mut self.0 {
            let flow = callback
                .on_epoch_end(&end)
                .with_context(|| format!("{key}: on_epoch_end"))?;
            if let (Flow::Stop(why), None) = (flow, &stop) {
                stop = Some(format!("{key} stopped the run after epoch {epoch}: {why}"));
            }
        }
        Ok(match ranks.any(stop.is_some())? {
            true => Some(stop.unwrap_or_else(|| {
                format!("a callback on another rank stopped the run after epoch {epoch}")
            })),
            false => None,
        })
    }

    pub fn on_fit_end(&mut self, end: &RunEnd) -> anyhow::Result<()> {
        for (key, callback) in &mut self.0 {
            callback
                .on_fit_end(end)
                .with_context(|| format!("{key}: on_fit_end"))?;
        }
        Ok(())
    }
}
