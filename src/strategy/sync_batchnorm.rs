//! SyncBatchNorm's switch (`trainer.sync_batchnorm=true`): while it is on, BatchNorm layers in training
//! mode normalise with the statistics of the global batch (every rank's), reduced over this group in the
//! forward pass and again in the backward pass, so N ranks with batches of B train as one process with a
//! batch of N x B. The trainer turns it on for its thread for the whole run; each backend's BatchNorm
//! reads it when the model runs. A thread-local rather than a parameter threaded through every model.

use crate::comm::collective::Collective;
use std::cell::RefCell;
use std::sync::Arc;

thread_local! {
    static GROUP: RefCell<Option<Arc<dyn Collective>>> = const { RefCell::new(None) };
}

/// While alive, BatchNorm on this thread synchronises over the group it was entered with.
pub struct Scope {
    previous: Option<Arc<dyn Collective>>,
}

/// Turn SyncBatchNorm on for this thread (`None`: leave it as it is).
pub fn enter(group: Option<Arc<dyn Collective>>) -> Scope {
    let previous = match group {
        Some(g) => GROUP.with(|cell| cell.borrow_mut().replace(g)),
        None => GROUP.with(|cell| cell.borrow().clone()),
    };
    Scope { previous }
}

impl Drop for Scope {
    fn drop(&mut self) {
        let previous = self.previous.take();
        GROUP.with(|cell| *cell.borrow_mut() = previous);
    }
}

/// The group BatchNorm synchronises over on this thread, if SyncBatchNorm is on.
pub fn group() -> Option<Arc<dyn Collective>> {
    GROUP.with(|cell| cell.borrow().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Alone;
    impl Collective for Alone {
        fn rank(&self) -> usize {
            0
        }
        fn world_size(&self) -> usize {
            1
        }
        fn all_reduce_f32(
            &self,
            _: &mut [f32],
            _: crate::comm::collective::ReduceOp,
        ) -> anyhow::Result<()> {
            Ok(())
        }
        fn all_reduce_f64(
            &self,
            _: &mut [f64],
            _: crate::comm::collective::ReduceOp,
        ) -> anyhow::Result<()> {
            Ok(())
        }
        fn broadcast_f32(&self, _: &mut [f32], _: usize) -> anyhow::Result<()> {
            Ok(())
        }
        fn barrier(&self) -> anyhow::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn scopes_nest_and_restore() {
        assert!(group().is_none());
        {
            let _on = enter(Some(Arc::new(Alone)));
            assert!(group().is_some());
            {
                let _same = enter(None);
                assert!(group().is_some());
            }
            assert!(group().is_some());
        }
        assert!(group().is_none());
    }
}
