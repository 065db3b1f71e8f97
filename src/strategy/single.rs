//! One engine on one device: the loop's batches go straight to it.

use super::{Ranks, Strategy};
use crate::backend::{self, Engine, PendingStats, Placement, StepStats};
use crate::data::loader::{Batch, StageBatch};
use crate::optim::GradClip;
use crate::schema::Experiment;
use std::sync::Arc;

pub struct Single {
    engine: Box<dyn Engine>,
    ranks: Ranks,
}

impl Single {
    pub fn new(exp: &Experiment) -> anyhow::Result<Self> {
        Ok(Single::of(backend::build(exp, &Placement::single())?))
    }

    /// A strategy around an engine built elsewhere.
    pub fn of(engine: Box<dyn Engine>) -> Self {
        Single {
            engine,
            ranks: Ranks::single(),
        }
    }
}

impl Strategy for Single {
    fn ranks(&self) -> &Ranks {
        &self.ranks
    }
    fn engine(&self) -> &dyn Engine {
        self.engine.as_ref()
    }
    fn engine_mut(&mut self) -> &mut dyn Engine {
        self.engine.as_mut()
    }
    fn batch_stager(&self) -> Option<Arc<dyn StageBatch>> {
        self.engine.batch_stager()
    }

    fn forward_backward(
        &mut self,
        batch: &Batch,
        grad_scale: f64,
        _ends_window: bool,
    ) -> anyhow::Result<StepStats> {
        self.engine.forward_backward(batch, grad_scale)
    }

    fn forward_backward_queued(
        &mut self,
        batch: &Batch,
        grad_scale: f64,
        _ends_window: bool,
    ) -> anyhow::Result<PendingStats> {
        self.engine.forward_backward_queued(batch, grad_scale)
    }

    fn optimizer_step(
        &mut self,
        lr: f64,
        momentum: Option<f64>,
        clip: Option<GradClip>,
    ) -> anyhow::Result<f64> {
        self.engine.optimizer_step(lr, momentum, clip)
    }
}
